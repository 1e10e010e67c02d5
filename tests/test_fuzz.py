"""Property-based fuzzing of warper stacks (hypothesis; profiles ``ci`` and ``deep`` in conftest.py).

- every drawn stack survives ``format_warpers`` -> ``parse_warpers``, and garbage specs never crash
  the parser;
- the real ``DFlashTokenCandidateGenerator`` passes the exact provenance check on random logits tables
  (it passes :func:`lossless_check.fuzz` in ``tests/test_fuzz_cli.py``);
- against the negative controls (raw logits returned; repetition penalty left out of sampling only),
  ``fuzz`` finds an inconsistent stack and shrinks it to a single warper, which a full statistical
  run (5000 samples, ``iid8``) then flags;
- the strategy draws every choice from coins (``tests/test_fuzz_seed.py``), and its values round-trip.

Error rate: ``fuzz`` spends ``ALPHA_FAMILY`` over every statistical test it makes (see
:mod:`lossless_check.faces.fuzzing`); the mutants here are found by the exact provenance pass (no false
failure), and the shrunk stack is then confirmed by a statistical run at ``ALPHA_FAMILY``.
``tests/test_fuzz_cli.py`` runs the default budget.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lossless_check.subjects.adapters import resolve_generator
from lossless_check.faces.fuzzing import fuzz
from lossless_check.core.errors import UsageError
from lossless_check.modes.provenance import provenance_check
from lossless_check.faces.api import run_cases as run
from lossless_check.evidence.results import Case
from lossless_check.laws.scenarios import DEFAULT, IID
from lossless_check.strategies import OPTIONS, scenarios, stack_options, warper_stacks
from lossless_check.laws.warpers import format_warpers, parse_warpers
from fixtures.releases import DFLASH, needs

GENERATOR = "DFlashTokenCandidateGenerator"
#: Negative controls: wrong under (almost) any warper, and wrong only under one warper.
MUTANTS = [
    "lossless_check.mutants.dflash_raw_logits:DFlashReturnsRawLogits",
    "lossless_check.mutants.dflash_repetition_penalty:DFlashDraftIgnoresRepetitionPenalty",
]
#: Family-wise false-failure rate of the statistical property (the harness default).
ALPHA_FAMILY = 1e-6
#: Trials per example: small, fuzzing trades power per stack for many stacks.
SAMPLES = 500
#: -inf entries per table row in random scenarios; the stack may ban the rest but one token.
MASKED = 2


def test_every_catalog_option_is_fuzzed():
    from lossless_check.laws.matrix import CATALOG

    assert {e.option for e in CATALOG} <= set(OPTIONS)


@given(warper_stacks())
def test_spec_round_trip(stack):
    assert parse_warpers(format_warpers(stack)) == stack


_SPEC_PIECES = st.sampled_from(
    list(OPTIONS) + ["=", ",", "[", "]", "(", ")", "-", ".", "e", "0", "1", "3", "None", "True", "inf", "'", "\"",
                     " ", "eos_token_id", "do_sample", "top_k=3", "none"])


_GARBAGE = st.lists(st.one_of(_SPEC_PIECES, st.text(max_size=4)), max_size=12).map("".join)


def _splice(spec: str, start: int, stop: int, piece: str) -> str:
    start, stop = sorted((start % (len(spec) + 1), stop % (len(spec) + 1)))
    return spec[:start] + piece + spec[stop:]


#: Garbage, and valid specs with a slice replaced by garbage (they reach the value checks).
_SPECS = st.one_of(_GARBAGE, st.builds(_splice, warper_stacks().map(format_warpers), st.integers(), st.integers(),
                                       _GARBAGE))


@given(_SPECS)
def test_garbage_spec_is_refused_or_parsed(spec):
    try:
        parsed = parse_warpers(spec)
    except UsageError:
        return
    assert isinstance(parsed, dict)


@needs(DFLASH)
@given(warper_stacks(max_banned=DEFAULT.vocab_size - 1 - MASKED), scenarios(target_masked=MASKED, drafter_masked=MASKED))
def test_dflash_provenance_on_random_tables(stack, scenario):
    result = provenance_check(Case(resolve_generator(GENERATOR), stack, scenario=scenario), trials=3)
    assert result.verdict == "consistent", f"{format_warpers(stack)}: {result.reason}"


@pytest.mark.parametrize("mutant_spec", MUTANTS, ids=lambda spec: spec.rsplit(":", 1)[1])
@needs(DFLASH)
def test_mutant_failure_shrinks_to_one_warper(mutant_spec):
    mutant = resolve_generator(mutant_spec)
    found = fuzz(mutant_spec, samples=SAMPLES, alpha=ALPHA_FAMILY, database=None)
    assert found.verdict == "not_lossless" and "--mode provenance" in found.reproduce, found.summary()
    minimal = parse_warpers(found.stack)
    assert len(stack_options(minimal)) == 1, minimal
    # Minimal indeed: without warpers the mutant's returned logits are what it sampled from.
    assert provenance_check(Case(mutant, {}, scenario=DEFAULT), trials=1).verdict == "consistent"
    # The shrunk stack is a real failure: the statistical check flags it too.
    result = run([Case(mutant, minimal, scenario=IID)], 5000, ALPHA_FAMILY, seed=0, sequential=True).cases[0]
    assert result.verdict == "not_lossless", f"{format_warpers(minimal)}: {result.reason}"

