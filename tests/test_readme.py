"""The README's Python API example runs as shown, and says what the README says it does."""

import contextlib
import io
import re
from pathlib import Path

from fixtures.releases import DFLASH, needs

README = Path(__file__).resolve().parents[1] / "README.md"


def python_example() -> str:
    text = README.read_text()
    section = text[text.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@needs(DFLASH)
def test_the_python_api_example_runs_and_catches_the_mutant():
    out = io.StringIO()
    namespace: dict = {"__name__": "__main__"}  # run as a script is: the example's calls sit under the guard
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
    assert done.stdout.strip() == ("['CaseResult', 'FuzzResult', 'ModelsResult', 'RunResult', 'check', 'check_models', "
                                   "'fuzz', 'run', 'strategies']")


@needs(DFLASH)
def test_the_fuzzing_example_finds_the_three_warpers(tmp_path):
    """The README's downstream fuzzing example: the CLI and the plugin both fail it with the minimal
    stack of exactly its three warpers, as the README shows."""
    import os
    import subprocess
    import sys

    text = README.read_text()
    section = text[text.index("## Fuzzing"):text.index("## Pre-merge gate")]
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        name = re.match(r"# (\S+\.py)\n", block).group(1)
        (tmp_path / name).write_text(block)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(README.parent), str(tmp_path)])}
    cli = subprocess.run([sys.executable, "-m", "lossless_check.cli", "fuzz", "--generator",
                          "my_fuzzed:MyFastPathDrafter", "--quiet"], cwd=tmp_path, env=env, capture_output=True,
                         text=True)
    assert cli.returncode == 1, cli.stderr
    shown = re.search(r"exits 1:\n\n```\n(.*?)```", section, re.S).group(1)
    stack = re.search(r"--warpers (\S+)", cli.stdout).group(1)
    assert sorted(option.split("=")[0] for option in stack.split(",")) == [
        "no_repeat_ngram_size", "repetition_penalty", "top_p"]
    assert cli.stdout.splitlines()[0].split(": ")[0] == shown.splitlines()[0].split(": ")[0]
    assert f"--warpers {stack}" in shown and "reproduce: lossless-check run" in cli.stdout
    plugin = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_fuzz_drafter.py"],
                            cwd=tmp_path, env=env, capture_output=True, text=True)
    assert plugin.returncode == 1 and f"NOT lossless under warpers [{stack}]" in plugin.stdout, plugin.stdout
