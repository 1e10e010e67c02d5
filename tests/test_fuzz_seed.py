"""A fuzz seed is a search: the same seed checks the same stacks in the same order with the same verdicts,
whatever else the interpreter holds.

Hypothesis draws literals from every local module in ``sys.modules`` into its integer, float and string
draws (its local-constants provider): with such draws, a drafter module that gained an unrelated table of
constants changed what ``--seed 3`` checked. The fuzzer's stacks are drawn from coins only and its
hypothesis settings are fixed (:mod:`lossless_check.faces.fuzzing`). Compared here: this pytest process
(conftest's ``ci`` profile loaded, ``derandomize=True``; every module of the package and the fixtures
imported), a fresh interpreter, and one with an extra local module full of constants. The negative
control: in the same two interpreters an integer-and-float strategy (what the search drew from before)
explores different values, so the comparison can see the dependence.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.releases import DFLASH, needs

ROOT = Path(__file__).resolve().parents[1]
#: The search compared: a lossless generator (no early stop), few trials (its verdicts may be
#: inconclusive: what is compared is that they are the same).
ARGS = {"generator": "DFlashTokenCandidateGenerator", "examples": 12, "samples": 100, "seed": 3}

SEARCH = """
import json, sys
{extra}
from lossless_check.faces.fuzzing import fuzz
result = fuzz({generator!r}, examples={examples}, samples={samples}, seed={seed}, database=None)
print(json.dumps({{"digest": result.digest, "stacks": [r["stack"] for r in result.records]}}))
"""

DRAWS = """
import json, sys
{extra}
from hypothesis import HealthCheck, Verbosity, given, seed, settings, strategies as st
from lossless_check.strategies import warper_stacks
drawn = {{}}

def drawing(name, strategy):
    drawn[name] = []

    @settings(max_examples=60, database=None, deadline=None, verbosity=Verbosity.quiet,
              suppress_health_check=list(HealthCheck))
    @seed(3)
    @given(strategy)
    def search(value):
        drawn[name].append(repr(value))
    search()

drawing("coins", warper_stacks(presence_bits=2))
drawing("numbers", st.tuples(st.integers(0, 20), st.floats(0.0, 3.0)))
print(json.dumps(drawn))
"""


def constants_module(directory: Path) -> str:
    """A local module of unrelated constants (as a drafter module's table might be), and the code importing it."""
    (directory / "drafter_tables.py").write_text(
        "TABLE = [" + ", ".join(str((7 * i) % 19) for i in range(200)) + "]\n"
        "SCALES = [" + ", ".join(f"{0.013 * i:.3f}" for i in range(200)) + "]\n")
    return f"sys.path.insert(0, {str(directory)!r}); import drafter_tables"


def in_fresh_interpreter(template: str, extra: str = "", **values) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", template.format(extra=extra, **values)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def import_everything() -> None:
    """Every module of the package and of the fixtures, in this process (the "fully imported" interpreter)."""
    import fixtures
    import lossless_check

    for package in (lossless_check, fixtures):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if module.name.endswith("__main__"):  # runs the command line
                continue
            try:
                importlib.import_module(module.name)
            except Exception:  # noqa: BLE001 - a module this release cannot import (e.g. an absent generator)
                pass


def test_coin_draws_do_not_depend_on_local_constants_and_number_draws_do(tmp_path):
    extra = constants_module(tmp_path)
    fresh = in_fresh_interpreter(DRAWS)
    with_constants = in_fresh_interpreter(DRAWS, extra)
    assert fresh["coins"] == with_constants["coins"]
    # The control: the same comparison sees hypothesis's local constants in integer and float draws.
    assert fresh["numbers"] != with_constants["numbers"]


# heavy: three searches of 39 stacks, each checked exactly and statistically (about 20 s each on 2 cores, idle).
@pytest.mark.heavy
@needs(DFLASH)
def test_the_same_seed_gives_the_same_search_in_any_interpreter(tmp_path):
    from lossless_check.faces.fuzzing import fuzz

    fresh = in_fresh_interpreter(SEARCH, **ARGS)
    with_constants = in_fresh_interpreter(SEARCH, constants_module(tmp_path), **ARGS)
    import_everything()
    here = fuzz(ARGS["generator"], examples=ARGS["examples"], samples=ARGS["samples"], seed=ARGS["seed"],
                database=None)
    assert fresh["stacks"] == with_constants["stacks"] == [r["stack"] for r in here.records]
    assert fresh["digest"] == with_constants["digest"] == here.digest
