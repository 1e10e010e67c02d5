"""``lossless-check fuzz`` / ``lc.fuzz``: three-way interactions found and shrunk, alpha split over
every statistical test (shrinking's included), failing stacks replayed from the database."""

import json
import shlex
import time

import pytest

from fixtures.releases import skip_module_without

skip_module_without("DFlashTokenCandidateGenerator")  # two of the three controls are DFlash subclasses
from fixtures import three_way  # noqa: E402
from lossless_check.faces import fuzzing  # noqa: E402
from lossless_check.faces.cli import main  # noqa: E402
from lossless_check.laws.warpers import parse_warpers  # noqa: E402

THREE_WAY = ["AssistedWrongUnderTemperatureTopKRepetition", "DFlashWrongUnderNgramRepetitionTopP",
             "DFlashWrongUnderTypicalBiasSuppress"]


# heavy (.ci/run's first step; issue 41): 20 s or more in the suite (25-52 s each on 2 cores).
@pytest.mark.slow
@pytest.mark.parametrize("name", THREE_WAY)
@pytest.mark.heavy
def test_default_budget_finds_a_three_way_bug_and_prints_exactly_its_three_options(name, tmp_path, capsys):
    report = tmp_path / "fuzz.json"
    started = time.process_time()  # CPU seconds: the machine's other load does not count
    code = main(["fuzz", "--generator", f"fixtures.three_way:{name}", "--database", str(tmp_path / "db"),
                 "--json", str(report), "--quiet"])
    seconds = time.process_time() - started
    out = capsys.readouterr().out
    result = json.loads(report.read_text())
    assert code == 1 and result["verdict"] == "not_lossless", out
    assert set(parse_warpers(result["stack"])) - {"eos_token_id"} == set(getattr(three_way, name).TRIGGER), out
    assert f"--warpers {shlex.quote(result['stack'])}" in out and "reproduce: lossless-check run" in out
    assert seconds <= 180, seconds
    # The reproduce command repeats the failure.
    command = shlex.split(result["reproduce"])[1:]
    assert main(command[:command.index("--seed")] + ["--quiet"]) == 1


# heavy (.ci/run's first step; issue 41): 20 s or more in the suite (45 s on 2 cores).
@pytest.mark.heavy
def test_a_failing_stack_is_replayed_first_from_the_database(tmp_path):
    generator = "fixtures.three_way:DFlashWrongUnderTypicalBiasSuppress"
    first = fuzzing.fuzz(generator, database=str(tmp_path))
    again = fuzzing.fuzz(generator, database=str(tmp_path))
    assert again.stack == first.stack and again.records[0]["stack"] == first.stack


def test_spending_sums_below_alpha():
    alpha, tests = 0.01, 100_000
    assert sum(fuzzing.alpha_of_test(alpha, k) for k in range(1, tests + 1)) <= alpha


# heavy (.ci/run's first step): a 60-example search with shrinking, statistics only (346 s in the suite before
# issue 39's two stages; 1,421 s measured under heavy load since).
@pytest.mark.slow
@pytest.mark.heavy
def test_statistical_search_and_its_shrinking_spend_the_split_alpha():
    """With the exact check off, the bug is found by statistics and shrunk by statistics: every
    statistical test made, shrinking's included, ran at alpha_k, and together they spend <= alpha.

    Each convicting test is two stages (issue 39): the batched rows reject, then the case runs again at
    batch 1 with the whole alpha_k and the full 5,000 planned trials. Measured: the first triggering stack
    with evidence at position 1 is the 41st test (alpha_k 3.6e-10); at that alpha both stages rejected
    in 6 of 6 seeds, the batch-1 stage after 997-1,843 trials. The 10 earlier triggering stacks pass in
    the batched stage (their warpers leave the doubled q little to move); none was lost at the batch-1
    confirmation.

    The search runs in a fresh interpreter, as ``lossless-check fuzz`` does: inside the full suite, after
    other tests in the same xdist worker, the same seeded search once tested 49 stacks without a conviction
    (170 s), while alone it convicts (501 s): state an earlier test leaves in the process changes which
    stacks the search draws. Which state is not known yet (open, issue 39's note)."""
    import subprocess
    import sys
    from pathlib import Path

    alpha = 1e-6
    script = f"""
import json
from lossless_check.faces import fuzzing

def no_exact(self, stack):
    record = self.record(stack)
    record.setdefault("exact", "not_applicable")
    return record

fuzzing._Examiner.exact = no_exact
result = fuzzing.fuzz("fixtures.three_way:DFlashWrongUnderNgramRepetitionTopP", alpha={alpha!r}, database=None)
stats = [r for r in result.records if r.get("alpha") is not None]
print(json.dumps({{"verdict": result.verdict, "reproduce": result.reproduce, "summary": result.summary(),
                  "alphas": [r["alpha"] for r in stats], "verdicts": [r["verdict"] for r in stats],
                  "alpha_spent": result.alpha_spent}}))
"""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["verdict"] == "not_lossless" and "--mode step" in result["reproduce"], result["summary"]
    alphas, verdicts = result["alphas"], result["verdicts"]
    first = verdicts.index("not_lossless")
    assert len(alphas) > first + 1  # shrinking made statistical tests of its own
    assert alphas == [fuzzing.alpha_of_test(alpha, k) for k in range(1, len(alphas) + 1)]
    assert result["alpha_spent"] <= alpha


def test_builtin_generator_passes_and_states_its_power():
    result = fuzzing.fuzz("DFlashTokenCandidateGenerator", examples=4, database=None)
    assert result.verdict == "lossless" and result.exit_code == 0, result.summary()
    stats = [r for r in result.records if r.get("verdict")]
    # A stack can turn out vacuous in its trials (no draft ever accepted): it states no power.
    informative = [r for r in stats if r["verdict"] == "lossless"]
    # A batched case states position 1 for batch-1 calls: its batched rows' figure at the stage power
    # plus what the replays could miss (issue 39), measured 0.101-0.102 at 5,000 trials, V = 8.
    assert informative and all(r["tv_detectable"] is not None and r["tv_detectable"] <= 0.11 for r in informative)
    assert not any(r["vacuous"] for r in stats)  # vacuous stacks are no evidence: never tested
    assert result.alpha_spent <= result.alpha and "detects TV >=" in result.summary()


def test_vacuous_criterion():
    from lossless_check.subjects.adapters import resolve_generator
    from lossless_check.evidence.results import Case
    from lossless_check.laws.scenarios import DEFAULT

    generator = resolve_generator("DFlashTokenCandidateGenerator")
    assert fuzzing.is_vacuous(Case(generator, {"top_k": 1}, scenario=DEFAULT))
    assert not fuzzing.is_vacuous(Case(generator, {"top_k": 2}, scenario=DEFAULT))


def test_fuzz_usage_errors_are_one_line(capsys):
    assert main(["fuzz", "--generator", "Nope"]) == 2
    assert main(["fuzz", "--generator", "DFlashTokenCandidateGenerator", "--examples", "0"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 2


# heavy (.ci/run's first step; issue 41): 20 s or more in the suite (38 s on 2 cores).
@pytest.mark.slow
@pytest.mark.heavy
def test_a_generator_that_raises_is_an_error_not_a_losslessness_verdict_and_fuzz_leaves_no_hypothesis_dir(tmp_path):
    """Exit 1 (an error verdict, DESIGN.md), worded as an error; no ETA line; hypothesis's caches under
    the example database, never ./.hypothesis; the installed verifier's state on a line of its own."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "lossless_check.faces.cli", "fuzz", "--generator",
                           "fixtures.raising:DFlashRaises", "--examples", "3", "--json", "out/fuzz.json"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("fixtures.raising:DFlashRaises: ERROR under warpers [") and "this drafter is broken" in first
    assert "NOT lossless" not in done.stdout and "ETA" not in done.stderr
    assert json.loads((tmp_path / "out" / "fuzz.json").read_text())["verdict"] == "error"
    assert done.stdout.splitlines()[-1].startswith("installed verifier _speculative_sampling: ")
    assert not (tmp_path / ".hypothesis").exists() and (tmp_path / fuzzing.DEFAULT_DATABASE).is_dir()


def test_failure_floats_are_formatted():
    record = {"verdict": "not_lossless", "alpha": 6.079271018540267e-07, "p_value": 1.395231097369173e-07,
              "tv_detectable": 0.09383127345, "reason": "output law at position 1"}
    verdict, why = fuzzing._statistical_failure(record)
    assert verdict == "not_lossless" and "p=1.4e-07" in why and "detectable TV 0.0938" in why and "1.395231" not in why
