"""Mutation self-test: every known bug class is flagged, every equivalent change passes.

Each real bug runs (sequentially) with a budget of 1.25 times the samples after which the harness's
fixed-sample bound promises to catch it with power 0.99 (at least 1000), so a miss here breaks a
stated guarantee, not a tuned one.
"""

import math

import pytest

from fixtures.releases import needs
from lossless_check.faces.mutant_catalog import MUTANTS
from lossless_check.faces.mutation import exact_tv, installed, run_mutant, samples_needed

ALPHA = 1e-6
EQUIVALENT_SAMPLES = 1500

BUGS = [m for m in MUTANTS if not m.equivalent]
EQUIVALENTS = [m for m in MUTANTS if m.equivalent]


def _on_release(mutants):
    """Each mutant as a test parameter, skipped where the installed release lacks its base class."""
    return [pytest.param(m, marks=needs(m.family)) for m in mutants]


def _id(mutant):
    return f"{mutant.spec.rpartition(':')[2]}[{','.join(f'{k}={v}' for k, v in mutant.warpers.items())}]"


def _samples(mutant):
    return max(1000, 500 * math.ceil(1.25 * samples_needed(mutant, ALPHA) / 500))


def test_catalog_covers_both_verdicts_and_a_later_position():
    assert BUGS and EQUIVALENTS
    assert any(m.position > 1 for m in BUGS)
    assert all(exact_tv(m) > 0 for m in BUGS if installed(m))
    assert any(installed(m) for m in BUGS), "no negative control runs on this release"


@pytest.mark.parametrize("mutant", _on_release(BUGS), ids=_id)
def test_mutant_is_caught(mutant):
    row = run_mutant(mutant, _samples(mutant), seed=0, alpha=ALPHA)
    assert row["verdict"] == "not_lossless", row["reason"]
    # Sequential: the run stops at the first trial where the anytime e-value crosses, often long
    # before the worst-case bound promises detection; a bug below the statistics' reach must be
    # caught by an exact check.
    assert {"e_value", "impossible_draft"} & set(row["failed_checks"]), row["reason"]
    if exact_tv(mutant) < 0.02:
        assert "impossible_draft" in row["failed_checks"], row["reason"]
    # Before the bug's first position the output law is right: no evidence piles up there.
    for earlier in range(1, mutant.position):
        assert row["positions"][earlier - 1]["log_e_value"] < math.log(1 / ALPHA), row["reason"]
    # The measured TV agrees with the mutant's exact model.
    assert abs(row["tv"] - row["exact_tv"]) < row["tv_detectable"]
    # Provenance alone catches it too, in one call.
    assert row["caught_by"] == ["step", "provenance"], row["provenance"]


@pytest.mark.parametrize("mutant", _on_release(EQUIVALENTS), ids=_id)
def test_equivalent_mutant_passes(mutant):
    row = run_mutant(mutant, EQUIVALENT_SAMPLES, seed=0, alpha=ALPHA)
    assert row["verdict"] == "lossless", row["reason"]
    assert not row["failed_checks"]
    assert row["provenance"] == "consistent"


def test_a_mutant_the_release_cannot_run_is_reported_not_judged(monkeypatch, capsys):
    """A mutant whose base class is absent is neither caught nor missed, and a catalog of which none
    can run is a failure of the self-test, not a pass."""
    from lossless_check.faces import mutation
    from lossless_check.faces.cli import main

    absent = MUTANTS[0]._replace(family="NoSuchCandidateGenerator")
    assert not installed(absent)
    monkeypatch.setattr(mutation, "MUTANTS", [absent])
    monkeypatch.setattr(mutation, "GREEDY_MUTANTS", [])
    assert main(["mutants", "--samples", "100"]) == 1
    out = capsys.readouterr().out
    assert "not on this release" in out and "0/0 mutants judged right" in out
    assert "1 mutants not run: transformers" in out and "has no NoSuchCandidateGenerator" in out
