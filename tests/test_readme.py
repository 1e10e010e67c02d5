"""The docs' Python API and fuzzing examples run as shown, and say what the pages say they do."""

import os
import re
import subprocess
import sys

import pytest

from fixtures.readme import FUZZ_PAGE, ROOT, api_example, assert_api_example_output, python_files, shown
from fixtures.releases import DFLASH, needs


def test_the_python_api_example_runs_and_catches_the_buggy_generator(tmp_path):
    """Run as docs/guides/python-api.md runs it: a script, from a directory of its own (tests/test_downstream.py runs it
    from the installed wheel)."""
    name, code = api_example()
    (tmp_path / name).write_text(code)
    done = subprocess.run([sys.executable, name], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    assert_api_example_output(done.stdout)


def test_the_package_exports_the_public_api_lazily():
    code = ("import sys, lossless_check as lc; assert 'torch' not in sys.modules; "
            "assert callable(lc.check) and callable(lc.run) and callable(lc.fuzz) and lc.FuzzResult and lc.RunResult and lc.CaseResult; "
            "assert hasattr(lc.strategies, 'warper_stacks'); print(sorted(lc.__all__))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ("['CaseResult', 'FuzzResult', 'ModelsResult', 'RunResult', 'SamplerReport', 'check', "
                                   "'check_models', 'check_sampler', 'fuzz', 'run', 'strategies']")


# heavy (.ci/run's first step; issue 41): 20 s or more in the suite (26 s on 2 cores).
@needs(DFLASH)
@pytest.mark.heavy
def test_the_fuzzing_example_finds_the_three_warpers(tmp_path):
    """The downstream fuzzing example of docs/guides/fuzzing.md: the CLI and the plugin both fail it with
    the minimal stack of exactly its three warpers, as the page shows."""
    for name, code in python_files(FUZZ_PAGE).items():
        (tmp_path / name).write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    cli = subprocess.run([sys.executable, "-m", "lossless_check.faces.cli", "fuzz", "--generator",
                          "my_fuzzed:MyFastPathDrafter", "--quiet"], cwd=tmp_path, env=env, capture_output=True,
                         text=True)
    assert cli.returncode == 1, cli.stderr
    output = shown(FUZZ_PAGE, "exits 1:")
    stack = re.search(r"--warpers (\S+)", cli.stdout).group(1)
    assert sorted(option.split("=")[0] for option in stack.split(",")) == [
        "no_repeat_ngram_size", "repetition_penalty", "top_p"]
    assert cli.stdout.splitlines()[0].split(": ")[0] == output.splitlines()[0].split(": ")[0]
    assert f"--warpers {stack}" in output and "reproduce: lossless-check run" in cli.stdout
    plugin = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_fuzz_drafter.py"],
                            cwd=tmp_path, env=env, capture_output=True, text=True)
    assert plugin.returncode == 1 and f"NOT lossless under warpers [{stack}]" in plugin.stdout, plugin.stdout
