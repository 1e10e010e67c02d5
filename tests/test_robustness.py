"""Bad input and bad generators: one-line errors, the rest of the run intact, results independent of workers."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lossless_check.subjects.adapters import resolve_generator
from lossless_check.faces.cli import _cases, build_parser
from lossless_check.core.errors import GeneratorFailure, UsageError
from lossless_check.faces.api import run_cases as run
from lossless_check.subjects.candidates import check_candidates
from lossless_check.evidence.results import Case
from lossless_check.laws.scenarios import IID
from fixtures.releases import DFLASH, needs


@needs(DFLASH)
def test_a_hanging_generator_times_out_and_the_run_goes_on():
    cases = [Case(resolve_generator("fixtures.mutants.hanging:DFlashHangs"), {"top_k": 3}, scenario=IID),
             Case(resolve_generator("DFlashTokenCandidateGenerator"), {"top_k": 3}, scenario=IID)]
    hung, fine = run(cases, 200, 1e-6, 0, timeout=2, sequential=False).cases
    assert hung.verdict == "error" and "ran past 2 s" in hung.reason and len(hung.reason.splitlines()) == 1
    assert fine.verdict not in ("error", "skipped") and fine.samples == 200


@needs(DFLASH)
def test_results_do_not_depend_on_the_number_of_workers():
    cases = [Case(resolve_generator("DFlashTokenCandidateGenerator"), w, scenario=IID) for w in ({}, {"top_k": 3})]
    one, two = (run(cases, 1500, 1e-6, seed=3, workers=w, sequential=False).cases for w in (1, 2))

    def strip(result):
        d = result.to_dict()
        d.pop("seconds"), d.pop("samples_per_second")
        return d

    for a, b in zip(one, two):
        da, db = strip(a), strip(b)
        assert {k: (v, db[k]) for k, v in da.items() if v != db[k]} == {}


ARG_TOKENS = st.sampled_from(["run", "--generator", "--warpers", "--matrix", "--samples", "--alpha", "--seed",
                              "--scenario", "--mode", "--detect-tv", "--max-new-tokens", "top_k=3", "top_k=x",
                              "default", "smoke", "0", "-1", "1e-6", "2", "nan", "iid8", "nope", "step", "::",
                              "a:b", "DFlashTokenCandidateGenerator", "temperature=0", "top_p=[1,", "="])


@given(st.lists(ARG_TOKENS, max_size=8) | st.lists(st.text(max_size=12), max_size=4))
def test_random_command_lines_parse_or_fail_with_a_usage_error(argv):
    """Random argv never escapes as anything but a UsageError (exit 2) before a run starts."""
    try:
        args = build_parser().parse_args(argv)
        if args.command == "run":
            _cases(args)
    except UsageError as exc:
        assert str(exc) and "\n" not in str(exc).strip()
    except SystemExit as exc:  # --help and friends
        assert exc.code == 0


PROMPT = [[3, 1, 4]]
GOOD_IDS = [[3, 1, 4, 2, 5, 1]]


def _logits(cells=None):
    logits = torch.zeros(1, 3, 8)
    for (row, col), value in (cells or {}).items():
        logits[0, row, col] = value
    return logits


@pytest.mark.parametrize("ids, logits, message", [
    (GOOD_IDS, _logits({(1, 2): float("nan")}), "NaN"),
    (GOOD_IDS, _logits({(2, 0): float("inf")}), r"\+inf"),
    (GOOD_IDS, torch.zeros(1, 3, 8).index_fill_(1, torch.tensor([1]), float("-inf")), "-inf everywhere"),
    (GOOD_IDS, torch.zeros(1, 2, 8), "has shape"),
    ([[3, 1, 4, 2, 9, 1]], _logits(), "outside the vocabulary"),
    ([[3, 1, 0, 2, 5, 1]], _logits(), "does not start with"),
    ([[3, 1, 4, 2, 5, 1, 1, 1]], torch.zeros(1, 5, 8), "past max_length"),
], ids=["nan", "posinf", "neginf-row", "shape", "vocab", "prefix", "max-length"])
def test_malformed_generator_output_is_a_one_line_generator_failure(ids, logits, message):
    with pytest.raises(GeneratorFailure, match=message):
        check_candidates(torch.tensor(PROMPT), torch.tensor(ids), logits, vocab_size=8, max_length=7)


def test_well_formed_output_passes_including_partly_masked_rows():
    logits = _logits({(0, 3): float("-inf"), (1, 0): float("-inf")})
    check_candidates(torch.tensor(PROMPT), torch.tensor(GOOD_IDS), logits, vocab_size=8, max_length=7)
