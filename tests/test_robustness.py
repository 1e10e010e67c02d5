"""Bad input and bad generators: one-line errors, the rest of the run intact, results independent of workers."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lossless_check.adapters import resolve_generator
from lossless_check.cli import _cases, build_parser
from lossless_check.errors import UsageError
from lossless_check.runner import Case, execute, run
from lossless_check.scenarios import IID


def test_a_hanging_generator_times_out_and_the_run_goes_on():
    cases = [Case(resolve_generator("fixtures.mutants.hanging:DFlashHangs"), {"top_k": 3}, scenario=IID),
             Case(resolve_generator("DFlashTokenCandidateGenerator"), {"top_k": 3}, scenario=IID)]
    hung, fine = execute(cases, 200, 0, 1e-6, timeout=2)
    assert hung.verdict == "error" and "ran past 2 s" in hung.reason and len(hung.reason.splitlines()) == 1
    assert fine.verdict not in ("error", "skipped") and fine.samples == 200


def test_results_do_not_depend_on_the_number_of_workers():
    cases = [Case(resolve_generator("DFlashTokenCandidateGenerator"), w, scenario=IID) for w in ({}, {"top_k": 3})]
    one, two = (run(cases, 1500, 1e-6, seed=3, workers=w).cases for w in (1, 2))

    def strip(result):
        d = result.to_dict()
        d.pop("seconds"), d.pop("samples_per_second")
        return d

    assert [strip(r) for r in one] == [strip(r) for r in two]


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
