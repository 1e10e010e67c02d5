"""Never a pass without the evidence: exit 5 (no answer) for a subject nothing checked, and ``inconclusive``
for a case that could not have seen a departure of the stated size (issue 49)."""

import subprocess
import sys

import pytest

from lossless_check.core.exit_codes import EXIT_NO_ANSWER, EXIT_NOT_LOSSLESS, EXIT_OK, exit_code_for
from lossless_check.evidence.results import CaseResult, RunResult, decide
from lossless_check.faces.gate import to_markdown
from lossless_check.outputs.report import to_json


@pytest.mark.parametrize("verdicts, code", [
    ({"A": ["lossless", "skipped"]}, EXIT_OK),
    ({"A": ["lossless", "vacuous"], "B": ["lossless"]}, EXIT_OK),
    ({"A": ["skipped", "skipped"]}, EXIT_NO_ANSWER),          # nothing of A was checked
    ({"A": ["vacuous"], "B": ["lossless"]}, EXIT_NO_ANSWER),   # A was not checked, B was
    ({"A": ["lossless", "inconclusive"]}, EXIT_NO_ANSWER),    # a row without power is no pass
    ({"A": ["skipped"], "B": ["not_lossless"]}, EXIT_NOT_LOSSLESS),  # a failure outranks no answer
    ({"A": ["inconclusive", "error"]}, EXIT_NOT_LOSSLESS),
    ({}, EXIT_NO_ANSWER),                                      # no subject at all
])
def test_the_exit_code_answers_the_question_asked(verdicts, code):
    assert exit_code_for(verdicts) == code


def _tested(samples: int, tv_detectable: float, p_value: float = 0.5) -> CaseResult:
    row = CaseResult("G", "top_k=3", "step", "markov8", samples=samples, tv=0.01, tv_detectable=tv_detectable,
                     p_value=p_value, informative_positions=[1, 2], law_informative_positions=[1, 2])
    row.positions = [{"position": 1, "tv": 0.01, "tv_detectable": tv_detectable, "samples": samples, "p_value": p_value},
                     {"position": 2, "tv": 0.02, "tv_detectable": None, "samples": samples, "p_value": 1.0}]
    return row


def test_a_case_without_power_at_the_bar_is_inconclusive_with_the_trials_that_would_do():
    weak, strong = _tested(300, 0.36), _tested(5000, 0.09)
    decide([weak, strong], 1e-6, max_detectable_tv=0.3)
    assert (weak.verdict, strong.verdict) == ("inconclusive", "lossless")
    # tv_detectable shrinks as 1/sqrt(n): 300 * (0.36 / 0.3)^2 = 432 trials reach the bar.
    assert "detects only TV >= 0.3600 at position 1" in weak.reason and "about 432 trials would" in weak.reason
    assert RunResult([weak, strong], 1e-6, 0, 300).exit_code == EXIT_NO_ANSWER
    assert RunResult([strong], 1e-6, 0, 300).exit_code == EXIT_OK
    assert to_json(RunResult([weak], 1e-6, 0, 300))["cases"][0]["max_detectable_tv"] == 0.3


def test_the_bar_moves_no_rejection():
    """Control: a rejected case stays not_lossless whatever its power; the bar only limits what a pass claims."""
    rejected = _tested(50, 0.9, p_value=1e-12)
    decide([rejected], 1e-6, max_detectable_tv=0.01)
    assert rejected.verdict == "not_lossless"


def test_no_stated_power_at_an_informative_position_is_inconclusive():
    """A batched case informative past position 1 only states no power for batch-1 calls there."""
    row = _tested(5000, 0.09)
    row.informative_positions = row.law_informative_positions = [2]
    decide([row], 1e-6)
    assert row.verdict == "inconclusive" and "--batch-size 1" in row.reason


def test_a_gate_that_checked_nothing_is_not_green_and_says_why():
    skipped = CaseResult("G", "top_k=3", "step", "markov8", verdict="skipped", reason="returns no candidate_logits")
    vacuous = CaseResult("G", "top_k=1", "generate", "markov8", verdict="vacuous", reason="point mass everywhere")
    result = RunResult([skipped, vacuous], 1e-6, 0, 5000)
    markdown = to_markdown(result, to_json(result), "G")
    assert result.exit_code == EXIT_NO_ANSWER
    assert "❔" in markdown and "no answer: 0 of 2 cases checked" in markdown
    assert "not checked: G: skipped (step): returns no candidate_logits; vacuous (generate)" in markdown


def test_the_command_exits_5_when_every_case_is_skipped():
    """End to end: a scenario the generator cannot run on leaves nothing checked (it was exit 0)."""
    done = subprocess.run([sys.executable, "-m", "lossless_check", "run", "--generator",
                           "DFlashTokenCandidateGenerator", "--scenario", "iid8-padded-drafter", "--warpers", "top_k=3",
                           "--no-verifier", "--quiet"], capture_output=True, text=True)
    assert done.returncode == EXIT_NO_ANSWER, done.stderr
    assert "not checked: DFlashTokenCandidateGenerator: skipped (step)" in done.stdout


def test_transformers_option_refuses_what_no_environment_can_be(tmp_path):
    """``--transformers`` takes a supported final release, checked before any work."""
    for bad, said in (("4.36.0", "final ones from 4.37.0"), ("5.x", "not a release number")):
        done = subprocess.run([sys.executable, "-m", "lossless_check", "gate", "--generator",
                               "DFlashTokenCandidateGenerator", "--transformers", bad, "--out", str(tmp_path)],
                              capture_output=True, text=True)
        assert done.returncode == 2 and said in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_transformers_option_of_the_installed_release_runs_here():
    from lossless_check.faces.on_release import run_on_release, without_release_option
    import transformers

    assert run_on_release(transformers.__version__, ["run"]) is None
    assert without_release_option(["run", "--transformers", "5.1.0", "--seed=3", "--transformers=4.50.0"]) == \
        ["run", "--seed=3"]


# heavy (.ci/run's first step): builds one release environment on first use (about a minute).
@pytest.mark.heavy
def test_transformers_option_gates_on_the_release_asked_for(tmp_path):
    """MTP of 5.15.0 returns raw logits while it samples processed ones (a finding; fixed in 5.15.1): run
    with ``--transformers 5.15.0`` from here, it is convicted there, and the report is that release's."""
    import json

    report = tmp_path / "r.json"
    done = subprocess.run([sys.executable, "-m", "lossless_check", "run", "--transformers", "5.15.0", "--generator",
                           "MTPCandidateGenerator", "--warpers", "top_k=3", "--scenario", "iid8", "--samples", "2000",
                           "--no-verifier", "--quiet", "--json", str(report)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert done.returncode == EXIT_NOT_LOSSLESS, done.stdout[-2000:] + done.stderr[-2000:]
    doc = json.loads(report.read_text())
    assert doc["transformers_version"] == "5.15.0" and doc["cases"][0]["verdict"] == "not_lossless"
    assert "running in the environment of transformers 5.15.0" in done.stderr


def test_a_no_q_generator_runs_the_rounds_a_pass_needs_not_the_runs_whole_budget():
    """Prompt lookup returns no q: each step trial is a whole round of generate() (about 100 step trials' cost),
    so its cases run the trials that detect 0.8 x the bar (``faces.api.ROUNDS_SIZED_FOR``), no more; a case of a
    generator with a q beside it runs the run's samples."""
    import lossless_check as lc
    from lossless_check.faces.api import ROUNDS_SIZED_FOR

    run = lc.run(["PromptLookupCandidateGenerator", "AssistedCandidateGenerator"], warpers="top_k=3", samples=5000,
                 verifier=False)
    rounds, assisted = run.cases
    assert rounds.samples < 5000 and assisted.samples == 5000
    assert rounds.verdict == "lossless" and rounds.tv_detectable <= ROUNDS_SIZED_FOR * 0.3, rounds.reason
