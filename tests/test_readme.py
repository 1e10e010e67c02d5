"""The README's Python API example runs as shown, and says what the README says it does."""

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_example() -> str:
    text = README.read_text()
    section = text[text.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_python_api_example_runs_and_catches_the_mutant():
    out = io.StringIO()
    namespace: dict = {}
    with contextlib.redirect_stdout(out):
        exec(compile(python_example(), str(README), "exec"), namespace)
    printed = out.getvalue()
    assert namespace["result"].verdict == "lossless" and namespace["result"].explain()
    verdicts = {(c.generator, c.warpers): c.verdict for c in namespace["run"].cases}
    assert verdicts[("AssistedCandidateGenerator", "top_k=3")] == "lossless"
    assert verdicts[("DFlashReturnsRawLogits", "top_k=3")] == "not_lossless"
    assert namespace["run"].exit_code == 1 and "exit code 1" in printed


def test_the_package_exports_the_public_api_lazily():
    import subprocess
    import sys

    code = ("import sys, lossless_check as lc; assert 'torch' not in sys.modules; "
            "assert callable(lc.check) and callable(lc.run) and callable(lc.fuzz) and lc.FuzzResult and lc.RunResult and lc.CaseResult; "
            "assert hasattr(lc.strategies, 'warper_stacks'); print(sorted(lc.__all__))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['CaseResult', 'FuzzResult', 'RunResult', 'check', 'fuzz', 'run', 'strategies']"
