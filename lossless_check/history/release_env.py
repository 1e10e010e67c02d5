"""One environment per transformers release (``sweep``, ``bisect``, ``tests/run_on_release.py``).

An environment is a bare virtual environment over this Python with ``transformers==X`` installed in
it, and a ``.pth`` file that appends the running environment's site directories (and the directory
this package was imported from) to its path: torch, numpy, scipy, the harness and the rest come from
the environment the user runs in, whatever it is (a virtualenv, a conda env, the base interpreter),
while the release's transformers and whatever it needs in other versions, installed in the
environment's own site-packages, come first. Why not install the harness's requirements into each
environment: torch alone is a 200 MB wheel and half a minute to unpack per release, and a copy could
differ from the one the user runs (its numpy ABI, a local build); ``--system-site-packages`` is
wrong from a virtualenv (it exposes the *base* interpreter's packages, which may have no torch).

pip (from this environment, ``--python`` the new one) installs only what the release needs beyond
what the ``.pth`` already exposes; uv, where pip is missing, installs all of transformers'
requirements into the environment (it does not read ``.pth`` files), which still works.

The cache (``--envs``, else ``$LOSSLESS_CHECK_ENVS``, else ``~/.cache/lossless-check/envs``) is keyed by
the release, the Python version, torch's version and a digest of this interpreter and of the paths the
``.pth`` exposes, so an environment made from one interpreter is never used from another. Before its
first use in a process an environment is checked (torch, the release's transformers and this very
``lossless_check`` import); a broken one is rebuilt once, then reported (:class:`RuntimeError`).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

#: The lossless_check package directory (this module is in its history/ layer).
PACKAGE_DIR = Path(__file__).resolve().parents[1]
#: Written last when an environment is built: a folder without it is a build that did not finish.
BUILT = "lossless-check-built"
_checked: set[Path] = set()

# Run in an environment: what it imports, from where (one JSON line).
_CHECK = ("import json, torch, transformers, lossless_check; print(json.dumps({'torch': torch.__version__, "
          "'transformers': transformers.__version__, 'lossless_check': lossless_check.__file__}))")


def default_envs() -> Path:
    """The environment cache: ``$LOSSLESS_CHECK_ENVS`` or ``~/.cache/lossless-check/envs``."""
    return Path(os.environ.get("LOSSLESS_CHECK_ENVS") or Path.home() / ".cache" / "lossless-check" / "envs")


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def exposed_paths() -> list[str]:
    """What an environment sees after its own site-packages: the folder this package was imported from
    (a checkout or a site-packages), then this environment's site directories (their ``.pth`` files, an
    editable install's among them, are processed there too)."""
    sites = [*site.getsitepackages(), *([site.getusersitepackages()] if site.ENABLE_USER_SITE else [])]
    paths = [str(PACKAGE_DIR.parent), *sites]
    return [p for i, p in enumerate(paths) if p not in paths[:i] and Path(p).is_dir()]


def _pth_line(paths: list[str]) -> str:
    return f"import site; list(map(site.addsitedir, {paths!r}))\n"


def env_home(release: str, envs: Path) -> Path:
    """Where ``release``'s environment for this interpreter lives."""
    digest = hashlib.sha256(json.dumps([os.path.realpath(sys.executable), sys.prefix, exposed_paths()]).encode())
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return envs / f"tf-{release}-py{python}-torch{_installed('torch') or 'none'}-{digest.hexdigest()[:10]}"


def environment(release: str, envs: Path | None = None, say=lambda line: None) -> Path:
    """The interpreter of ``release``'s environment (built on first use, checked before its first use
    here); this interpreter if its transformers is that release. Raises :class:`RuntimeError` with the
    reason when the environment cannot be built or, rebuilt once, is still broken."""
    if _installed("transformers") == release:
        return Path(sys.executable)
    home = env_home(release, envs or default_envs())
    python = home / "bin" / "python"
    if home in _checked:
        return python
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f".{home.name}.lock", "w") as lock:  # another sweep or test may build it too
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / BUILT).exists():
            why = _broken(python, release)
            if why is None:
                _checked.add(home)
                return python
            say(f"{release}: the cached environment {home} is broken ({why}); rebuilding it")
        _build(home, release)
        why = _broken(python, release)
        if why is not None:
            raise RuntimeError(f"the environment of transformers {release} is broken: {why}")
        _checked.add(home)
        return python


def _build(home: Path, release: str) -> None:
    """A fresh environment at ``home`` (what was there is removed); nothing is left on failure."""
    shutil.rmtree(home, ignore_errors=True)
    python = home / "bin" / "python"
    requirement = f"transformers=={release}"
    try:
        _step([sys.executable, "-m", "venv", "--without-pip", str(home)])
        purelib = _step([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip()
        # zz: processed after any .pth the release installs, so its own packages stay first on the path.
        (Path(purelib) / "zz-lossless-check-parent.pth").write_text(_pth_line(exposed_paths()))
        if _pip_has_python_option():
            _step([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                   "--disable-pip-version-check", requirement])
        else:
            uv = shutil.which("uv") or shutil.which("uv", path=str(Path(sys.executable).parent))
            if not uv:
                raise RuntimeError("neither pip nor uv is installed here")
            _step([uv, "pip", "install", "-q", "--python", str(python), requirement])
    except RuntimeError as exc:
        shutil.rmtree(home, ignore_errors=True)
        raise RuntimeError(f"building the environment of transformers {release} failed: {exc}") from None
    (home / BUILT).write_text(release + "\n")


def _pip_has_python_option() -> bool:
    """Whether this environment's pip can install into another interpreter (``--python``: pip 22.3)."""
    from packaging.version import Version

    pip = _installed("pip") if importlib.util.find_spec("pip") is not None else None
    return pip is not None and Version(pip) >= Version("22.3")


def _step(command: list[str]) -> str:
    """Run one building step; its output, or :class:`RuntimeError` with its last line."""
    done = subprocess.run(command, capture_output=True, text=True, env=child_environ())
    if done.returncode:
        raise RuntimeError(last_line(done))
    return done.stdout


def _broken(python: Path, release: str) -> str | None:
    """Why the environment of ``python`` cannot run ``release`` here, or ``None``: torch, transformers
    and ``lossless_check`` must import there, and be this torch, that release and this package."""
    try:
        done = subprocess.run([str(python), "-c", _CHECK], capture_output=True, text=True, env=child_environ(),
                              timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode:
        return last_line(done)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    torch = _installed("torch")
    if found["transformers"] != release:
        return f"it imports transformers {found['transformers']}"
    if torch is not None and found["torch"] != torch:
        return f"it imports torch {found['torch']}, not {torch}"
    if Path(found["lossless_check"]).resolve().parent != PACKAGE_DIR:
        return f"it imports lossless_check from {Path(found['lossless_check']).parent}, not {PACKAGE_DIR}"
    return None


def child_environ() -> dict[str, str]:
    """The environment variables of a command run in a release's environment: ours, one thread each
    (a sweep runs releases side by side), and no virtualenv of ours to confuse its tools."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("VIRTUAL_ENV", None)
    return env


def last_line(done: subprocess.CompletedProcess) -> str:
    """The last line a command wrote (its error, as a rule)."""
    lines = (done.stderr or done.stdout or "no output").strip().splitlines()
    return lines[-1] if lines else "no output"
