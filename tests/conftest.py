import os

import numpy as np
import pytest

# Two cores are shared by pytest-xdist workers: one torch thread each avoids oversubscription.
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture
def target_factory():
    from lossless_check.laws.stubs import fixed_logits_lm
    from lossless_check.laws.tables import FixedLogits

    def make(rows=None, prompt_length=2):
        rows = np.linspace(-1, 1, 6) if rows is None else rows
        return fixed_logits_lm(FixedLogits.iid(rows), prompt_length=prompt_length)

    return make


# Hypothesis profiles for the fuzzing tests (tests/test_fuzz.py). "ci" (the default): a bounded,
# derandomized example budget, so CI runs the same examples every time. "deep": many random
# examples, for fuzzing by hand: HYPOTHESIS_PROFILE=deep pytest tests/test_fuzz.py.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True)
settings.register_profile("deep", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def clean_python(tmp_path_factory):
    """A Python in a fresh virtual environment where torch and transformers (the versions this process
    has) import and lossless_check does not: the environment sees this interpreter's package
    directories through a ``.pth`` file, and none of their editable-install hooks (``.pth`` files in
    directories listed there are not processed, so the ``lossless_check`` finder is never installed)."""
    import subprocess
    import sys
    import venv
    from pathlib import Path

    import transformers

    root = tmp_path_factory.mktemp("clean-venv")
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(root)
    python = root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # This interpreter's package directories, in its own precedence order (a venv over system site
    # packages must keep its transformers ahead of the system's).
    parents = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]
    (Path(purelib) / "parent_packages.pth").write_text("\n".join(parents) + "\n")
    probe_version = f"import transformers; assert transformers.__version__ == {transformers.__version__!r}"
    probe = (probe_version + "; import torch, importlib.util as u; print(u.find_spec('lossless_check') is None)")
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, cwd=root,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0 and out.stdout.strip() == "True", (out.stdout, out.stderr[-2000:], sys.executable)
    return python
