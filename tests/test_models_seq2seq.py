"""``lossless-check models`` on an encoder-decoder pair: the seeded tiny Bart of :mod:`fixtures.seq2seq_pair` (V = 256,
one encoder and one decoder layer; the assistant is the target plus weight noise 0.02, drafter/target per-position TV
median about 0.3 under top_k=50).

The prompt is the encoder's input; the emitted tokens are the decoder's after its start token (Bart's decoder starts
with EOS, id 2), counted from the ids generate() hands its first drafting round, so the scores-number-the-tokens check
still stands. A row's verdict is seeded, so each test's outcome is fixed; each says how often it would fail over seeds
if the code were right. Negative controls: the traceable raw-logits mutant (exact check), an untraceable drafter that
samples the processed law in reversed rank order (statistical check), the processor-stripping mutant (greedy check),
and a pair of two kinds (usage).
"""

import json

import pytest
import torch

from fixtures.releases import ENCODER_DECODER_ASSISTANT_CACHE_GROWS, within
from fixtures.seq2seq_pair import EOS, save_seq2seq_pair
from lossless_check.core.exit_codes import EXIT_NOT_LOSSLESS, EXIT_OK, EXIT_USAGE
from lossless_check.faces.cli import main

RAW_LOGITS = "fixtures.mutants.assisted_raw_logits:AssistedReturnsRawLogits"
UNTRACEABLE = "fixtures.mutants.untraceable_assisted:"
STRIPS_PENALTY = "lossless_check.mutants.greedy_mutants:AssistedDraftsWithoutRepetitionPenalty"


@pytest.fixture(scope="module")
def bart_pair(tmp_path_factory):
    return save_seq2seq_pair(tmp_path_factory.mktemp("bart_pair"))


def _run(pair, tmp_path, *extra):
    out = tmp_path / "report.json"
    code = main(["models", "--target", pair[0], "--assistant", pair[1], "--json", str(out), *extra])
    return code, json.loads(out.read_text())


def test_assisted_row_is_lossless_and_the_raw_logits_mutant_is_not(bart_pair, tmp_path):
    """64 decoder tokens a row under top_k=50. Built-in Assisted: every draft's returned q is its law (exact),
    no rejection, greedy identical: ``lossless`` (a false failure needs the statistical check to reject at alpha
    1e-6 / 2: probability at most 5e-7; the exact and greedy checks never fail a lossless pair). Control: the
    raw-logits mutant fails the exact check at its first draft."""
    code, report = _run(bart_pair, tmp_path, "--samples", "4", "--max-new-tokens", "16",
                        "--generator", "AssistedCandidateGenerator", "--generator", RAW_LOGITS)
    assert code == EXIT_NOT_LOSSLESS
    assisted, mutant = report["cases"]
    assert assisted["verdict"] == "lossless", assisted["reason"]
    assert assisted["exact"]["verdict"] == "consistent" and assisted["exact"]["checked"] > 0
    # 4 calls of 16 decoder tokens: the start token is not counted as emitted (nor as a score row).
    assert assisted["statistical"]["tokens"] == 64 and assisted["statistical"]["rejected_at_token"] is None
    assert assisted["greedy"] == {"warpers": "none", "comparisons": 4, "differ": 0, "first_difference": None}
    assert mutant["verdict"] == "not_lossless" and mutant["exact"]["verdict"] == "inconsistent"  # control
    assert "round 1, draft position 1" in mutant["exact"]["first_inconsistency"]


def test_prompt_lookup_runs_on_an_encoder_decoder_target(bart_pair, tmp_path):
    """generate() runs prompt lookup on an encoder-decoder target (5.24.0 and 5.25.0: it looks up n-grams in the
    decoder's ids only). Its row returns no q (exact: not applicable), and 64 tokens cannot see a departure of TV
    0.3: ``inconclusive`` with the tokens it would need, not an error and not a pass (deterministic given the seed:
    the power simulation at 64 tokens reaches about 0.05 at TV 0.3, far from 0.99)."""
    code, report = _run(bart_pair, tmp_path, "--samples", "4", "--max-new-tokens", "16",
                        "--generator", "PromptLookupCandidateGenerator")
    (row,) = report["cases"]
    assert row["verdict"] == "inconclusive" and "more tokens" in row["reason"], row["reason"]
    assert row["exact"]["verdict"] == "not_applicable" and row["exact"]["rounds"] > 0
    assert row["statistical"]["tokens"] == 64 and row["greedy"]["differ"] == 0
    assert code != EXIT_OK


def test_untraceable_drafter_that_departs_is_not_lossless(bart_pair, tmp_path):
    """A Gumbel-max drafter sampling the processed law in reversed rank order (emitted TV about 0.6 from the
    target's): the exact check has a gap, the statistical check rejects at alpha 1e-6 within 128 tokens (seed 0:
    after 40 tokens)."""
    code, report = _run(bart_pair, tmp_path, "--samples", "8", "--max-new-tokens", "16",
                        "--generator", UNTRACEABLE + "ReversedRank")
    (row,) = report["cases"]
    assert code == EXIT_NOT_LOSSLESS and row["verdict"] == "not_lossless"
    assert row["exact"]["verdict"] == "gap" and row["statistical"]["rejected_at_token"] is not None


def test_correct_untraceable_drafter_is_lossless_with_power(bart_pair, tmp_path):
    """The Gumbel-max drafter that returns the law it samples, on the encoder-decoder pair: exact gap, and 256
    decoder tokens give power 0.99 at TV 0.3 in every direction: ``lossless`` (false-fail rate at most 1e-6 plus
    the chance that 100 simulated replicates fall short of 0.99 where the power is about 1). Control: 32 tokens
    are ``inconclusive``."""
    code, report = _run(bart_pair, tmp_path, "--samples", "16", "--max-new-tokens", "16",
                        "--generator", UNTRACEABLE + "GumbelMaxDrafter")
    (row,) = report["cases"]
    assert code == EXIT_OK and row["verdict"] == "lossless", row["reason"]
    assert row["exact"]["verdict"] == "gap" and row["statistical"]["power"]["detectable_tv"] <= 0.3
    _, report = _run(bart_pair, tmp_path, "--samples", "2", "--max-new-tokens", "16",
                     "--generator", UNTRACEABLE + "GumbelMaxDrafter")
    assert report["cases"][0]["verdict"] == "inconclusive"  # control


def test_greedy_negative_control_on_an_encoder_decoder_pair(bart_pair, tmp_path):
    """The mutant that strips the repetition penalty from the target's processors: the decoder's greedy outputs
    differ from plain greedy decoding's (exact, deterministic)."""
    code, report = _run(bart_pair, tmp_path, "--generator", STRIPS_PENALTY, "--warpers", "repetition_penalty=3.0",
                        "--samples", "1", "--max-new-tokens", "12")
    (row,) = report["cases"]
    assert code == EXIT_NOT_LOSSLESS and row["greedy"]["differ"] > 0 and "greedy:" in row["reason"]
    difference = row["greedy"]["first_difference"]
    assert difference["plain"][0] == difference["speculative"][0] == EOS  # the decoder's outputs, start included


def test_a_pair_of_two_kinds_is_bad_usage(bart_pair, tmp_path, capsys):
    from fixtures.model_pair import save_pair

    llama, _ = save_pair(tmp_path, vocab=256)
    capsys.readouterr()  # saving's progress lines
    for target, assistant in ((bart_pair[0], llama), (llama, bart_pair[1])):
        assert main(["models", "--target", target, "--assistant", assistant]) == EXIT_USAGE
        err = capsys.readouterr().err.strip()
        assert "a model pair must be of one kind" in err and len(err.splitlines()) == 1


def test_decoder_prefix_is_counted_apart_from_the_scores():
    """The start tokens come from the first drafting round's input; a call that ran none, or whose output does
    not begin with them, is an error line rather than a guess."""
    from lossless_check.modes.models.drafting import DraftingRecord
    from lossless_check.modes.models.sampling import _decoder_prefix

    record = DraftingRecord()
    assert "no drafting round" in _decoder_prefix(record, torch.tensor([[EOS, 5, 6]]))
    record.observe(torch.tensor([[EOS]]), torch.tensor([[EOS, 5]]), None, [])
    assert _decoder_prefix(record, torch.tensor([[EOS, 5, 6]])) == 1
    assert "not the start" in _decoder_prefix(record, torch.tensor([[0, 5, 6]]))
    assert "began_with" not in record.to_dict()


def test_longer_outputs_overflow_the_assistants_positions_on_5_25(bart_pair, tmp_path):
    """Not a losslessness defect, but generate() failing: with an encoder-decoder assistant, each drafting round
    hands the assistant's generate() the whole decoder sequence beside its cache, and _prefill slices the ids only
    when a decoder attention mask (or _mask_length) has their length (5.25.0: generation/utils.py, _prefill), so the
    sequence is fed again on top of the cache. On 5.25.0 the cache also keeps growing (the assistant's cache length
    1, 4, 8, 13, 19, 27, ... over rounds, measured), so positions pass max_position_embeddings (128 here) and the
    assistant's Bart position embedding raises IndexError within 32 decoder tokens: the row is an ``error``. On
    5.24.0 the cache is cropped and the row is lossless (fixtures.releases.ENCODER_DECODER_ASSISTANT_CACHE_GROWS).
    Deterministic given the seed."""
    code, report = _run(bart_pair, tmp_path, "--samples", "1", "--max-new-tokens", "32",
                        "--generator", "AssistedCandidateGenerator")
    (row,) = report["cases"]
    if within(ENCODER_DECODER_ASSISTANT_CACHE_GROWS):
        assert row["verdict"] == "error" and "IndexError" in row["reason"], row["reason"]
    else:
        assert row["verdict"] == "lossless" and code == EXIT_OK, row["reason"]
