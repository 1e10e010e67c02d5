"""Output a CI log can use: nothing cut when stdout is not a terminal, and reasons that are true.

The CLI runs in a subprocess with its output captured (not a terminal, as in CI). Every reason
string states a relation between numbers (``TV a > b threshold``, ``p=a <= b``, ``e^a >= e^b``):
:func:`false_claims` checks each one against the numbers it prints.
"""

from __future__ import annotations

import operator
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lossless_check as lc
from lossless_check.subjects.adapters import ADAPTERS
from lossless_check.laws.matrix import matrix
from lossless_check.evidence.results import CaseResult, decide
from lossless_check.laws.warpers import format_warpers
from fixtures.releases import DFLASH, needs

ROOT = Path(__file__).resolve().parents[1]
MUTANT = "lossless_check.mutants.dflash_raw_logits:DFlashReturnsRawLogits"
NUMBER = r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
CLAIM = re.compile(rf"(?:e\^)?({NUMBER}) (<=|>=|<|>) (?:threshold )?(?:e\^)?({NUMBER})")
RELATIONS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}


def false_claims(reason: str) -> list[str]:
    """The relations in ``reason`` that its own printed numbers contradict."""
    return [m.group(0) for m in CLAIM.finditer(reason)
            if not RELATIONS[m.group(2)](float(m.group(1)), float(m.group(3)))]


def test_the_checker_catches_a_false_inequality():
    """Negative control: the sentence the L1 test used to print when the likelihood ratio rejected."""
    assert false_claims("output law at position 1: TV 0.0566 > threshold 0.0689 (p=2.6e-09, n=5000)")
    assert not false_claims("L1 test rejects, TV 0.0744 > 0.0379 threshold (p=6.1e-26 <= 1.2e-07)")


def cli(*args: str) -> str:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "lossless_check.faces.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr
    return done.stdout + done.stderr


def test_list_prints_every_generator_name_whole():
    out = cli("list")
    assert "…" not in out
    for name in ADAPTERS:
        assert re.search(rf"\b{name}\b", out), name


LONG_STACKS = sorted((format_warpers(w) for w in matrix("default")), key=len)[-3:]


@pytest.mark.parametrize("table", ["auto", "summary"])
@needs(DFLASH)
def test_run_prints_every_name_and_stack_whole(table):
    args = ["run", "--generator", "SinglePositionMultiTokenCandidateGenerator", "--generator", MUTANT,
            "--scenario", "iid8", "--samples", "300", "--quiet", "--table", table, "--no-verifier"]
    for stack in LONG_STACKS:
        args += ["--warpers", stack]
    out = cli(*args)
    assert "…" not in out
    lines = out.splitlines()
    # The summary: a line per generator, and every failing case in full (the mutant fails somewhere).
    assert any(line.startswith("SinglePositionMultiTokenCandidateGenerator: ") for line in lines)
    assert any(line.startswith("DFlashReturnsRawLogits: ") for line in lines)
    failing = [line for line in lines if line.startswith(("not_lossless ", "error "))]
    assert failing and all(any(f"[{stack}]" in line for stack in LONG_STACKS) for line in failing)
    if table == "auto":  # six cases: the whole table, each row on one line
        for stack in LONG_STACKS:
            assert sum(stack in line for line in lines) >= 2, stack


# heavy (.ci/run's second step): two mode-"all" runs of 27 cases at 1,500 trials (116 s on 2 cores).
@pytest.mark.heavy
@needs(DFLASH)
def test_every_reason_is_true_of_its_numbers():
    """Fixed and sequential runs, lossless and failing cases, step with provenance beside it."""
    generators = ["DFlashTokenCandidateGenerator", MUTANT, "SinglePositionMultiTokenCandidateGenerator"]
    warpers = ["top_k=3", "temperature=0.6", "none"]
    reasons = []
    for sequential in (True, False):
        run = lc.run(generators, warpers=warpers, scenario="markov8", samples=1500, sequential=sequential, mode="all")
        reasons += [c.reason for c in run.cases]
    assert any("L1 test rejects" in r for r in reasons) and any("likelihood-ratio test rejects" in r for r in reasons)
    assert any("sequential e-value test rejects" in r for r in reasons)
    assert [(r, false_claims(r)) for r in reasons if false_claims(r)] == []


def test_a_case_rejected_by_holm_alone_says_so_truly():
    """Holm can reject a case's combined p-value with no single check at its own level."""
    case = CaseResult("G", "top_k=3", "step", "iid8", p_value=4e-7, positions=[
        {"position": 1, "tv": 0.05, "p_value": 4e-7}])
    decide([case], 1e-6)
    assert case.verdict == "not_lossless" and "Holm-adjusted" in case.reason
    assert not false_claims(case.reason), case.reason


def test_the_tv_column_is_the_largest_per_position_tv_beside_the_detectable_tv_there(capsys):
    """The issue's table showed position 1's TV 0.0390 beside a detectable TV 0.3358 while the failure
    was at positions 2-3: the cells are now the largest TV, its position, and the power there."""
    from lossless_check.outputs.report import print_table, tv_cells
    from lossless_check.evidence.results import RunResult

    case = CaseResult("G", "top_k=3", "step", "markov8", verdict="not_lossless", samples=500, tv=0.0390,
                      tv_detectable=0.0938, positions=[{"position": 1, "tv": 0.0390, "tv_detectable": 0.0938},
                                                       {"position": 2, "tv": 0.2100, "tv_detectable": 0.3358},
                                                       {"position": 3, "tv": 0.1500, "tv_detectable": 0.4100}])
    assert tv_cells(case) == ("0.2100 @2", "0.3358")
    print_table(RunResult([case], 1e-6, 0, 500))
    [row] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("│ G ")]
    assert "0.2100 @2" in row and "0.3358" in row and "0.0390" not in row and "0.0938" not in row
    # Without per-position tests (the verifier's row), the headline figures.
    assert tv_cells(CaseResult("V", "-", "verifier", "markov8", tv=None)) == ("-", "-")


@needs(DFLASH)
def test_an_expected_batch_1_fallback_and_a_blind_exact_pass_read_as_facts_on_a_passing_case(capsys):
    """An honest Gumbel-max drafter whose noise is drawn position-major (fixtures/samplers.py): its
    draws cannot be forced row by row, so it runs at batch 1, said as the expected fact it is (not as a row that "differs"); its exact provenance pass
    cannot see the sampler (a gap), said in the table's note, the summary and the gate's headline."""
    from lossless_check.faces.gate import to_markdown
    from lossless_check.modes.replay import UNFORCEABLE
    from lossless_check.outputs.report import print_table, to_json
    from lossless_check.evidence.results import BLIND

    from lossless_check.faces.api import cases_for, run_cases

    # Mode "all": step with the exact provenance pass beside it (its generate-mode case left out here).
    run = run_cases(cases_for("fixtures.samplers:GumbelDFlashPositionMajor", "top_k=3", None, "all", "iid8")[:1], 1000, 1e-6, 0)
    [case] = run.cases
    assert case.verdict == "lossless" and case.batch["batch_size"] == 1, case.reason
    assert case.batch["note"] == f"batch 1: {UNFORCEABLE}" and "differs" not in case.batch["note"]
    assert case.exact_pass_blind
    print_table(run)
    out = capsys.readouterr().out
    assert out.count(BLIND) == 2 and f"1 of 1 cases with an exact pass: {BLIND}" in out  # the note, the summary
    markdown = to_markdown(run, to_json(run), "GumbelDFlashPositionMajor")
    assert "✅" in markdown and f"- 1 of 1 cases with an exact pass: {BLIND}" in markdown


def test_fuzz_says_its_exact_pass_was_blind():
    from lossless_check.faces.fuzzing import FuzzResult
    from lossless_check.evidence.results import BLIND

    records = [{"stack": f"top_k={k}", "vacuous": False, "exact": "gap", "verdict": "lossless", "alpha": 1e-7,
                "tv_detectable": 0.09} for k in (2, 3)]
    result = FuzzResult("G", "markov8", "lossless", 1e-6, 5000, 0, 2, records=records)
    assert f"on 2 of the 2 stacks with an exact pass, {BLIND}" in result.summary()
