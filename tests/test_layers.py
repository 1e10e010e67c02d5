"""The package's layers: imports only go down, and no module imports itself through others.

The layers contract lives in pyproject.toml (``[tool.importlinter]``) and is checked with import-linter;
cycles are the strongly connected components of grimp's import graph (every import statement counts,
function-level ones included). Both checks are shown to fail on a copy of the package with a deliberate
upward import and a deliberate cycle added, so neither can pass vacuously.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "lossless_check"
#: The largest module the house allows (issue 40): one job per module.
MAX_MODULE_LINES = 400

CYCLES_SCRIPT = """
import json, grimp, numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components
graph = grimp.build_graph("lossless_check", cache_dir=None)
modules = sorted(graph.modules)
index = {m: i for i, m in enumerate(modules)}
edges = [(index[a], index[b]) for a in modules for b in graph.find_modules_directly_imported_by(a)]
rows, cols = zip(*edges)
adjacency = csr_matrix((np.ones(len(edges)), (rows, cols)), shape=(len(modules), len(modules)))
_, label = connected_components(adjacency, directed=True, connection="strong")
groups = {}
for module, component in zip(modules, label):
    groups.setdefault(int(component), []).append(module)
print(json.dumps(sorted(sorted(g) for g in groups.values() if len(g) > 1)))
"""


def _env(source: Path) -> dict:
    # The checked tree first on the path, so that a copy shadows the installed package.
    return {**os.environ, "PYTHONPATH": str(source) + os.pathsep + os.environ.get("PYTHONPATH", "")}


def import_cycles(source: Path) -> list[list[str]]:
    """The import cycles of the package under ``source`` (each a sorted list of modules)."""
    done = subprocess.run([sys.executable, "-c", CYCLES_SCRIPT], cwd=source, env=_env(source), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def layers_contract(source: Path) -> subprocess.CompletedProcess:
    """import-linter's verdict on the layers contract in ``source``/pyproject.toml (exit 0: kept)."""
    # The console script's own entry, run by this interpreter: a release environment of
    # tests/run_on_release.py sees this environment's packages but has no ``lint-imports`` script.
    lint = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"]
    return subprocess.run([*lint, "--config", str(source / "pyproject.toml"), "--no-cache"], cwd=source,
                          env=_env(source), capture_output=True, text=True, timeout=300)


def test_the_layers_contract_is_kept():
    done = layers_contract(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 kept, 0 broken" in done.stdout


def test_no_module_imports_itself_through_others():
    assert import_cycles(ROOT) == []


def test_an_upward_import_and_a_cycle_are_caught(tmp_path):
    copy = tmp_path / "tree"
    shutil.copytree(ROOT / PACKAGE, copy / PACKAGE, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    # Function-level imports, the kind that hid the four cycles this test was written against.
    with open(copy / PACKAGE / "core" / "errors.py", "a") as f:
        f.write("\n\ndef _upward():\n    from lossless_check.faces import api\n\n    return api\n")
    with open(copy / PACKAGE / "running" / "chunks.py", "a") as f:
        f.write("\n\ndef _cycle():\n    from lossless_check.running.scheduler import Scheduler\n\n    return Scheduler\n")

    done = layers_contract(copy)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "lossless_check.core is not allowed to import lossless_check.faces" in done.stdout
    cycles = import_cycles(copy)
    # The upward import closes a cycle too (everything imports errors); the same-layer one is its own.
    assert any({"lossless_check.core.errors", "lossless_check.faces.api"} <= set(c) for c in cycles)
    assert any({"lossless_check.running.chunks", "lossless_check.running.scheduler"} <= set(c) for c in cycles)


def test_every_import_of_the_package_names_something_that_exists():
    """Function-level imports run only when called: a moved name must not wait for a run to fail."""
    import ast
    import importlib

    missing = []
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith(PACKAGE):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    if not hasattr(module, alias.name) and importlib.util.find_spec(
                            f"{node.module}.{alias.name}") is None:
                        missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{alias.name}")
    assert missing == []


def test_every_layer_says_what_it_is_for_and_what_it_may_import():
    for init in sorted((ROOT / PACKAGE).glob("*/__init__.py")):
        doc = init.read_text().split('"""')[1]
        assert "import" in doc.lower(), f"{init.relative_to(ROOT)}: the docstring does not say what the layer may import"


@pytest.mark.parametrize("module", sorted(str(p.relative_to(ROOT)) for p in (ROOT / PACKAGE).rglob("*.py")))
def test_no_module_is_over_the_limit(module):
    lines = len((ROOT / module).read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{module}: {lines} lines (split it: one job per module)"


def test_the_architecture_page_and_the_contract_name_every_layer_and_module():
    """docs/architecture.md's diagram and pyproject's layers list the packages as they are (a moved or new
    module must be placed in the diagram too)."""
    import re
    import tomllib

    layers = sorted(p.name for p in (ROOT / PACKAGE).iterdir() if (p / "__init__.py").exists())
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    assert sorted(entry.split(".")[1] for entry in contract["layers"] if "|" not in entry
                  and entry.count(".") == 1 and entry != "lossless_check.strategies") == layers
    page = (ROOT / "docs" / "architecture.md").read_text()
    diagram = page.split("```text\n", 1)[1].split("```", 1)[0]
    blocks = dict(re.findall(r"^(\w+)/ +(.*?)(?=^\w+/ |\Z)", diagram, re.S | re.M))
    assert sorted(blocks) == layers
    for layer in layers:
        modules = sorted(p.stem for p in (ROOT / PACKAGE / layer).glob("*.py") if p.stem != "__init__")
        packages = sorted(p.name + "/" for p in (ROOT / PACKAGE / layer).iterdir() if (p / "__init__.py").exists())
        if layer == "stats":
            continue  # named by what its modules do, not one by one
        named = set(re.findall(r"[\w/]+", blocks[layer].split(":", 1)[0]))
        assert set(modules + packages) <= named, (layer, set(modules + packages) - named)
