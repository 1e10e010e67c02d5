"""``lossless-check models`` on seeded random-initialised checkpoints saved with ``save_pretrained``
(:mod:`fixtures.model_pair`): ``pair`` (V = 49,152, drafter/target TV median 0.24) and ``close_pair``
(V = 1,024, acceptance about 0.96), with the untraceable drafters of
:mod:`fixtures.mutants.untraceable_assisted` as negative controls.

A row's verdict is seeded, so each test's outcome is fixed; each says how often it would fail over seeds if
the code were right. The statistical check rejects a lossless row with probability at most its alpha
(Ville), the exact and greedy checks never; a mutant's test fails when the statistical check misses its
departure, which it does with probability at most 0.01 where the departure is at least the size the row's
power simulation states (measured exact TVs in the docstrings: ``benchmarks/models_power.py``).
"""

import json

import pytest

from fixtures.model_pair import save_close_pair, save_pair
from lossless_check.core.exit_codes import EXIT_NOT_LOSSLESS, EXIT_OK, EXIT_USAGE
from lossless_check.faces.cli import main

MUTANT = "fixtures.mutants.assisted_raw_logits:AssistedReturnsRawLogits"
UNTRACEABLE = "fixtures.mutants.untraceable_assisted:"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="module")
def close_pair(tmp_path_factory):
    return save_close_pair(tmp_path_factory.mktemp("close_pair"))


def _run(pair, tmp_path, *extra):
    out = tmp_path / "report.json"
    code = main(["models", "--target", pair[0], "--assistant", pair[1], "--json", str(out), *extra])
    return code, json.loads(out.read_text())


def test_rows_at_a_small_budget(pair, tmp_path):
    """64 tokens a row. Built-in Assisted: exact check consistent, so ``lossless`` (a false failure needs the
    statistical check to reject at alpha 1e-6 / 3 or the exact check to fail: probability at most 3.3e-7).
    Prompt lookup returns no q, and 64 tokens cannot see a departure of TV 0.3: ``inconclusive``, saying how
    many more tokens would. Control: the raw-logits mutant is ``not_lossless`` (exact check, first draft)."""
    code, report = _run(pair, tmp_path, "--samples", "4", "--max-new-tokens", "16", "--generator",
                        "AssistedCandidateGenerator", "--generator", "PromptLookupCandidateGenerator",
                        "--generator", MUTANT)
    assert code == EXIT_NOT_LOSSLESS
    assisted, lookup, mutant = report["cases"]
    assert assisted["verdict"] == "lossless"
    assert assisted["exact"]["verdict"] == "consistent" and assisted["exact"]["checked"] > 0
    assert assisted["statistical"]["tokens"] == 64 and assisted["statistical"]["rejected_at_token"] is None
    assert assisted["statistical"]["null"].startswith("the verifier's law")
    assert assisted["greedy"]["differ"] == 0 and assisted["greedy"]["comparisons"] == 4
    assert lookup["verdict"] == "inconclusive" and lookup["exact"]["verdict"] == "not_applicable"
    assert lookup["statistical"]["power"]["detectable_tv"] is None and "more tokens" in lookup["reason"]
    assert mutant["verdict"] == "not_lossless" and mutant["exact"]["verdict"] == "inconsistent"  # control


# heavy (.ci/run's first step; issue 41): 20 s or more in the suite (25 s on 2 cores).
@pytest.mark.slow
@pytest.mark.heavy
def test_raw_logits_mutant_fails_exactly_at_once_and_statistically(pair, tmp_path):
    """The traceable raw-logits mutant on the far pair (its emitted law at per-position TV median 0.16): the
    exact check at its first draft, and the statistical check within the default budget."""
    code, report = _run(pair, tmp_path, "--generator", MUTANT)
    assert code == EXIT_NOT_LOSSLESS
    (row,) = report["cases"]
    assert row["verdict"] == "not_lossless"
    # Exact: every traced draft, from the first round on.
    assert row["exact"]["verdict"] == "inconsistent"
    assert "round 1, draft position 1" in row["exact"]["first_inconsistency"]
    assert row["exact"]["inconsistent"] == row["exact"]["checked"] > 0
    assert row["statistical"]["rejected_at_token"] is not None
    assert row["statistical"]["rejected_at_token"] <= 2048


@pytest.mark.parametrize("args, message", [
    (["--target", "/nonexistent", "--assistant", "/nonexistent"], "is not a directory"),
    (["--generator", "DFlashTokenCandidateGenerator"], "a model pair drives"),
    (["--generator", "NoSuchGenerator"], "unknown generator"),
    (["--warpers", "top_k"], "expected key=value"),
    (["--prompts", "/nonexistent.txt"], "is not a file"),
])
def test_bad_usage_is_one_line_exit_2(pair, capsys, args, message):
    base = {"--target": pair[0], "--assistant": pair[1]}
    for flag in ("--target", "--assistant"):
        if flag in args:
            base.pop(flag)
    argv = ["models"] + [x for kv in base.items() for x in kv] + args
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_folder_without_config_is_bad_usage(pair, tmp_path, capsys):
    assert main(["models", "--target", str(tmp_path), "--assistant", pair[1]]) == EXIT_USAGE
    assert "has no config.json" in capsys.readouterr().err


def test_prompts_file_of_token_ids(pair, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("1 2 3 4\n\n500 600 700\n")
    code, report = _run(pair, tmp_path, "--prompts", str(prompts), "--generator", "AssistedCandidateGenerator",
                        "--samples", "2", "--max-new-tokens", "8", "--warpers", "top_k=50,temperature=0.7")
    assert code == EXIT_OK and report["cases"][0]["warpers"] == "top_k=50,temperature=0.7"
    assert report["cases"][0]["statistical"]["tokens"] == 16


def test_api(pair):
    import lossless_check as lc

    result = lc.check_models(pair[0], pair[1], ["AssistedCandidateGenerator"], warpers="top_k=50", samples=2,
                             max_new_tokens=8)
    assert result.exit_code == 0 and result.rows[0].verdict == "lossless"


def test_text_prompts_go_through_the_tokenizer_beside_the_target(pair, tmp_path):
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    target = tmp_path / "target"
    shutil.copytree(pair[0], target)
    words = {w: i for i, w in enumerate(["[UNK]", "the", "cat", "sat", "on", "mat"])}
    backend = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]").save_pretrained(target)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat sat on the mat\n")
    code = main(["models", "--target", str(target), "--assistant", pair[1], "--prompts", str(prompts),
                 "--generator", "AssistedCandidateGenerator", "--samples", "1", "--max-new-tokens", "4"])
    assert code == EXIT_OK


def test_greedy_negative_control(pair, tmp_path):
    """A generator that strips the repetition penalty from the target's processors: greedy outputs differ."""
    code, report = _run(pair, tmp_path, "--generator",
                        "lossless_check.mutants.greedy_mutants:AssistedDraftsWithoutRepetitionPenalty",
                        "--warpers", "repetition_penalty=3.0", "--samples", "2")
    assert code == EXIT_NOT_LOSSLESS
    (row,) = report["cases"]
    assert row["verdict"] == "not_lossless" and row["greedy"]["differ"] > 0 and "greedy:" in row["reason"]


# heavy (.ci/run's first step; issue 41): 20 s or more in the suite.
@pytest.mark.heavy
def test_builtin_false_failure_rate_at_a_loose_alpha(close_pair):
    """The false-failure side on the real pair: built-in Assisted, alpha 0.1, eight seeds of 256 tokens. Each
    seed's statistical check rejects with probability at most 0.1 (Ville), so five or more rejections have
    probability at most P(Binomial(8, 0.1) >= 5) = 4.3e-4 (this test's false-fail rate). Control: the
    halved-temperature Gumbel-max drafter (emitted TV median 0.36) at the same alpha rejects in five or more of
    eight seeds of 64 tokens."""
    import lossless_check as lc

    def rejections(generator, samples):
        count = 0
        for seed in range(8):
            result = lc.check_models(close_pair[0], close_pair[1], [generator], warpers="top_k=50", samples=samples,
                                     alpha=0.1, seed=seed)
            count += result.rows[0].statistical["rejected_at_token"] is not None
        return count

    assert rejections("AssistedCandidateGenerator", 8) < 5
    assert rejections(UNTRACEABLE + "HalvedTemperature", 2) >= 5  # control


#: Untraceable drafters whose emitted law departs from the target's on the close pair, with the exact TV of a
#: round's first emitted token to the target's law (median over positions; benchmarks/models_power.py).
DEPARTING = {"HalvedTemperature": 0.36, "DoubledTemperature": 0.27, "ReversedRank": 0.63, "ShiftedRank": 0.18,
             "NumpyDoubledTemperature": 0.27}


@pytest.mark.parametrize("name", sorted(DEPARTING))
def test_untraceable_drafter_that_departs_is_not_lossless(close_pair, tmp_path, name):
    """A drafter that samples by Gumbel-max (or with numpy) from a law it does not return: the exact check has a
    gap, the statistical check rejects within the default budget at alpha 1e-6. Its departure (TV
    :data:`DEPARTING`) is at least 0.15, where the power simulation states power >= 0.99 in every direction, so
    this fails with probability at most 0.01 over seeds (seed 0 rejects within 12 to 200 tokens)."""
    code, report = _run(close_pair, tmp_path, "--generator", UNTRACEABLE + name)
    (row,) = report["cases"]
    assert row["verdict"] == "not_lossless" and code == EXIT_NOT_LOSSLESS
    assert row["exact"]["verdict"] == "gap" and row["statistical"]["rejected_at_token"] is not None


# heavy (.ci/run's first step; issue 41): 20 s or more in the suite.
@pytest.mark.heavy
def test_untraceable_raw_logits_drafters_are_not_lossless(pair, close_pair, tmp_path):
    """The raw-vs-processed bug classes, untraceable: sampling the raw law while returning the processed one
    (close pair: emitted TV median 0.087, away from q) within 4,096 tokens; sampling the processed law while
    returning the raw one (the seed bug; on the far pair, emitted TV median 0.16) within the default budget.
    Both below 0.15 in TV, so their power is not the stated one: measured, seeds 0 to 2 reject after 1,581 to
    1,968 and 137 to 272 tokens (``benchmarks/models_power.py``, the guide)."""
    _, report = _run(close_pair, tmp_path, "--generator", UNTRACEABLE + "SamplesRawLogits", "--samples", "128")
    assert report["cases"][0]["verdict"] == "not_lossless" and report["cases"][0]["exact"]["verdict"] == "gap"
    _, report = _run(pair, tmp_path, "--generator", UNTRACEABLE + "ReturnsRawLogits")
    assert report["cases"][0]["verdict"] == "not_lossless" and report["cases"][0]["exact"]["verdict"] == "gap"


# heavy (.ci/run's first step; issue 41): 20 s or more in the suite.
@pytest.mark.heavy
def test_correct_untraceable_drafter_is_lossless_with_power(close_pair, tmp_path):
    """The Gumbel-max drafter that returns the law it samples: its drafts cannot be traced (exact gap), and at the
    default budget (2,048 tokens) the power simulation states that TV 0.15 in every direction would have been
    caught: ``lossless``. False-fail rate: at most 1e-6 (the statistical check's alpha) plus the chance that 100
    simulated replicates show power below 0.99 at TV 0.3 where it is about 1 (measured: every replicate by 160
    tokens). Control: the same drafter with 64 tokens is ``inconclusive``."""
    code, report = _run(close_pair, tmp_path, "--generator", UNTRACEABLE + "GumbelMaxDrafter")
    (row,) = report["cases"]
    assert row["verdict"] == "lossless" and code == EXIT_OK
    assert row["exact"]["verdict"] == "gap" and row["statistical"]["power"]["detectable_tv"] <= 0.15
    _, report = _run(close_pair, tmp_path, "--generator", UNTRACEABLE + "GumbelMaxDrafter", "--samples", "2")
    assert report["cases"][0]["verdict"] == "inconclusive"  # control


def _without_timings(report):
    return {**report, "cases": [{k: v for k, v in c.items() if k != "seconds"} for c in report["cases"]]}


# heavy (.ci/run's first step; issue 41): 20 s or more in the suite.
@pytest.mark.heavy
def test_workers_give_the_same_report(close_pair, tmp_path):
    """Calls spread over 2 worker processes, folded in call order: the same report as 1 worker, for a row
    that runs all its calls and for one the bet stops early (the reversed-rank Gumbel-max drafter at alpha
    0.05), where calls computed past the stop are discarded. Deterministic (no false failure); control: the
    early stop is seen (the mutant's calls are fewer)."""
    args = ("--generator", "AssistedCandidateGenerator", "--generator", UNTRACEABLE + "ReversedRank",
            "--samples", "10", "--max-new-tokens", "16", "--alpha", "0.05")
    serial = _run(close_pair, tmp_path, *args)
    parallel = _run(close_pair, tmp_path, *args, "--workers", "2")
    assert serial[0] == parallel[0] == EXIT_NOT_LOSSLESS
    assert _without_timings(parallel[1]) == _without_timings(serial[1])
    builtin, mutant = serial[1]["cases"]
    assert builtin["statistical"]["calls"] == 10 and mutant["statistical"]["calls"] < 10


@pytest.fixture(scope="module")
def two_tokenizer_pair(tmp_path_factory):
    """Tiny Llamas whose folders hold different tokenizers: the target's 43 words, the assistant's its first 23."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("two_tokenizers")
    words = ["<unk>", "</s>", "<pad>"] + [f"w{i}" for i in range(40)]
    for name, vocab, seed in (("target", 43, 0), ("assistant", 23, 1)):
        backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words[:vocab])}, unk_token="<unk>"))
        backend.pre_tokenizer = pre_tokenizers.Whitespace()
        PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>",
                                pad_token="<pad>").save_pretrained(folder / name)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, eos_token_id=1,
                                         pad_token_id=2, bos_token_id=None)).save_pretrained(folder / name)
    prompts = folder / "prompts.txt"
    prompts.write_text("w1 w2 w3 w4\nw5 w6 w7\nw8 w9 w1 w2 w3\nw4 w4 w5\n")
    return str(folder / "target"), str(folder / "assistant"), str(prompts)


def test_two_tokenizers_get_the_greedy_two_tokenizer_row(two_tokenizer_pair, tmp_path):
    """Different tokenizers in the folders: prompt lookup and AssistedCandidateGeneratorDifferentTokenizers
    (greedy only) by default; greedy equals plain greedy decoding without a processor. Exact checks only (no
    false failure); prompt lookup's row is inconclusive, as no row could pass without power (its control)."""
    target, assistant, prompts = two_tokenizer_pair
    _, report = _run((target, assistant), tmp_path, "--prompts", prompts, "--samples", "2",
                        "--max-new-tokens", "8")
    rows = {r["generator"]: r for r in report["cases"]}
    assert set(rows) == {"PromptLookupCandidateGenerator", "AssistedCandidateGeneratorDifferentTokenizers"}
    two = rows["AssistedCandidateGeneratorDifferentTokenizers"]
    assert two["verdict"] == "lossless" and two["greedy"]["differ"] == 0
    assert two["statistical"] == {} and "greedy only" in two["reason"]
    # Prompt lookup beside an assistant of another vocabulary: no drafter law aims q, 16 tokens: no power.
    lookup = rows["PromptLookupCandidateGenerator"]
    assert lookup["verdict"] == "inconclusive" and "toward_q" not in lookup["statistical"]["power"]["directions"]


def test_two_tokenizer_row_under_bad_words_follows_the_finding(two_tokenizer_pair, tmp_path):
    """findings/different_tokenizers_target_processors: where the release hands the target's processors to
    the assistant, greedy generate() raises under bad_words_ids, so the row is not lossless (raised in every
    comparison); elsewhere it is lossless."""
    from fixtures.releases import DIFFERENT_TOKENIZERS_TARGET_PROCESSORS, within

    target, assistant, prompts = two_tokenizer_pair
    code, report = _run((target, assistant), tmp_path, "--prompts", prompts, "--max-new-tokens", "8",
                        "--generator", "AssistedCandidateGeneratorDifferentTokenizers",
                        "--warpers", "bad_words_ids=[[5]]")
    (row,) = report["cases"]
    if within(DIFFERENT_TOKENIZERS_TARGET_PROCESSORS):
        assert code == EXIT_NOT_LOSSLESS and row["greedy"]["differ"] == row["greedy"]["comparisons"] == 4
        assert "must match the size" in row["greedy"]["first_difference"]["speculative"]
    else:
        assert code == EXIT_OK and row["verdict"] == "lossless"


def test_two_tokenizer_family_needs_two_tokenizers(pair, capsys):
    assert main(["models", "--target", pair[0], "--assistant", pair[1], "--generator",
                 "AssistedCandidateGeneratorDifferentTokenizers"]) == EXIT_USAGE
    assert "needs different tokenizers" in capsys.readouterr().err
