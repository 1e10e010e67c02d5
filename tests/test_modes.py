"""Provenance beside statistics: the exact and the statistical verdicts agree on every case."""

import pytest

from lossless_check.subjects.adapters import resolve_generator
from lossless_check.faces.api import run_cases as run_modes
from lossless_check.evidence.results import Case
from lossless_check.laws.scenarios import IID
from fixtures.releases import DFLASH, needs

MUTANT = "lossless_check.mutants.dflash_raw_logits:DFlashReturnsRawLogits"


@pytest.mark.parametrize("warpers", [{"top_k": 0}, {"top_k": 3}], ids=["plain", "top_k=3"])
@needs(DFLASH)
def test_provenance_and_statistics_agree(warpers):
    cases = [Case(resolve_generator(g), warpers, "all", IID) for g in ("DFlashTokenCandidateGenerator", MUTANT)]
    result = run_modes(cases, 5000, 1e-6, seed=0, sequential=False)
    for case in result.cases:
        implied = {"consistent": "lossless", "inconsistent": "not_lossless"}[case.provenance["verdict"]]
        assert case.verdict == implied, case.reason
        assert "DISAGREEMENT" not in case.reason
    assert [c.verdict for c in result.cases] == ["lossless", "lossless" if warpers["top_k"] == 0 else "not_lossless"]


@needs(DFLASH)
def test_provenance_mode_is_exact_and_spends_no_samples():
    cases = [Case(resolve_generator(MUTANT), {"top_k": 3}, "provenance", IID)]
    result = run_modes(cases, 5000, 1e-6, seed=0, sequential=False)
    case = result.cases[0]
    assert case.verdict == "not_lossless" and case.samples == 3
    assert case.provenance["positions"][0]["inflation"] > 1
