"""The sdist and the wheel build cleanly, their metadata passes ``twine check --strict``, and the wheel
holds the whole package and its entry points, and nothing of the checkout's tests or fixtures.
(tests/test_downstream.py installs the wheel and runs a downstream project from it.)"""

import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

CHECKOUT = Path(__file__).resolve().parents[1]


def test_sdist_and_wheel_build_and_their_metadata_checks_out(tmp_path):
    source = tmp_path / "source"  # a copy: a build writes build/ and egg-info beside the sources
    shutil.copytree(CHECKOUT / "lossless_check", source / "lossless_check",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(CHECKOUT / name, source / name)
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--outdir", str(dist), str(source)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = dist.glob("lossless_check-*.whl")
    (sdist,) = dist.glob("lossless_check-*.tar.gz")
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr

    modules = {p.relative_to(CHECKOUT).as_posix() for p in (CHECKOUT / "lossless_check").rglob("*.py")}
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(info).decode())
        entry_points = archive.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert modules <= names, sorted(modules - names)
    assert not [n for n in names if n.split("/")[0] in ("tests", "fixtures", "findings", "benchmarks")]
    assert "lossless-check = lossless_check.faces.cli:main" in entry_points
    assert "lossless_check = lossless_check._pytest_entry" in entry_points
    assert metadata["Name"] == "lossless-check" and metadata["Description-Content-Type"] == "text/markdown"
    requires = metadata.get_all("Requires-Dist")
    for needed in ("torch", "transformers", "hypothesis", "matplotlib"):
        assert any(r.startswith(needed) for r in requires), requires
    assert any(r.startswith("ray") and 'extra == "ray"' in r for r in requires), requires

    with tarfile.open(sdist) as archive:
        members = {m.split("/", 1)[1] for m in archive.getnames() if "/" in m}
    assert {"pyproject.toml", "README.md", "PKG-INFO", "lossless_check/faces/cli.py"} <= members
