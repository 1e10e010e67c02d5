"""Adapters for the other built-in generators: each runs the real ``get_candidates`` around stubs.

Every verdict here comes from the installed ``transformers``. Where a real generator is not
lossless, the test says why with the code lines, and checks the observed law against the law the
defect predicts (so the harness is shown to measure the defect, not some artefact of its own).
"""

import numpy as np
import pytest
import torch
import transformers

from fixtures.releases import (
    EARLY_EXIT_OMITS_FIRST_ITERATION,
    MTP_RETURNS_RAW_LOGITS,
    PROMPT_LOOKUP_CRASHES_WITHOUT_EOS,
    PROMPT_LOOKUP_OVERSHOOTS,
    needs,
    within,
)
from lossless_check.evidence.results import Case
from lossless_check.faces.api import run_cases as run
from lossless_check.laws.expected import ExactLaws, first_token_law
from lossless_check.laws.scenarios import DEFAULT, IID, Scenario
from lossless_check.laws.stubs import fixed_logits_lm
from lossless_check.laws.tables import FixedLogits
from lossless_check.laws.warpers import capture_processors
from lossless_check.modes.step import StepCase
from lossless_check.stats import Stratum, law_test
from lossless_check.subjects.adapters import ADAPTERS, resolve_generator
from lossless_check.subjects.adapters.early_exit import EXIT_LAYER, early_exit_model_for

TOP_K = {"top_k": 3}
ALPHA = 1e-6


def run_one(name, samples, scenario=IID, warpers=TOP_K, seed=0):
    return run([Case(resolve_generator(name), warpers, scenario=scenario)], samples, ALPHA, seed=seed, sequential=False).cases[0]


def session_for(name, scenario=IID, warpers=TOP_K):
    step = StepCase(Case(resolve_generator(name), warpers, scenario=scenario))
    return step, ADAPTERS[name].session(step.context())


def laws(scenario, warpers):
    target = fixed_logits_lm(scenario.target, len(scenario.prompt))
    processors, _ = capture_processors(target, torch.tensor([scenario.prompt]), warpers, 64)
    return ExactLaws(scenario, processors)


def first_token_law_as_torch_computes(p, q_sampled, q_returned):
    """:func:`first_token_law`, for drafts the returned q gives probability 0, as the verifier's floats do.

    ``_speculative_sampling`` accepts when ``r <= p / q``: with ``q = 0`` that is ``p / 0 = inf``
    (accepted) when ``p > 0`` but ``0 / 0 = nan`` (rejected) when ``p = 0``, where
    ``first_token_law`` accepts. A draft that is always rejected is one never accepted: its mass
    goes to the residual, which ``first_token_law`` gives every mass it does not accept.
    """
    always_rejected = (q_returned == 0) & (p == 0)
    return first_token_law(p, np.where(always_rejected, 0.0, q_sampled), q_returned)


def assert_first_token_follows(case, predicted, target):
    """The observed first-token law is the one ``predicted``, and the sample could tell it apart.

    A law test at ALPHA must not reject ``predicted``, and ``predicted`` must lie further from the
    target law than the test's detectable TV at this sample size: had the observed law been the
    target's (or anything that far from ``predicted``), the test would have rejected with
    probability at least 0.99. "Not rejected" with no power would prove nothing.
    """
    counts = np.rint(np.asarray(case.empirical_law) * case.samples).astype(np.int64)
    test = law_test([Stratum(counts, predicted)], ALPHA)
    assert test.support_violations == 0 and test.pvalue > ALPHA, (test.statistic, predicted, case.empirical_law)
    assert test.tv_detectable < 0.5 * np.abs(predicted - target).sum(), (test.tv_detectable, predicted, target)


def release() -> tuple[int, ...]:
    return tuple(int(part) for part in transformers.__version__.split(".")[:3] if part.isdigit())


#: Releases in which each finding holds, examined release by release (``findings/``; the
#: ranges start where the defect entered: Universal's LM-head pruning in 4.52.1, SinglePosition's
#: first release 5.8.0) up to the newest release examined. Outside a range the class is absent or
#: unexamined; inside it the tests below must see the defect.
FINDINGS = {
    "UniversalSpeculativeDecodingGenerator": ((4, 52, 1), (5, 24, 0)),
    "SinglePositionMultiTokenCandidateGenerator": ((5, 8, 0), (5, 24, 0)),
}


def finding_holds(name: str) -> bool:
    first, last = FINDINGS[name]
    if release() > last:
        pytest.skip(f"transformers {transformers.__version__} is newer than the releases examined (to 5.24.0)")
    return first <= release()


# --- EarlyExitCandidateGenerator -------------------------------------------------------------


@needs("EarlyExitCandidateGenerator")
@pytest.mark.skipif(within(EARLY_EXIT_OMITS_FIRST_ITERATION), reason="EarlyExit raises at every call here "
                    "(test_early_exit_cannot_run_on_5_0_to_5_2_because_its_get_candidates_omits_is_first_iteration)")
def test_early_exit_is_lossless():
    case = run_one("EarlyExitCandidateGenerator", 1000)
    assert case.verdict == "lossless", case.reason
    # Drafts come from the drafter table (the lowered depth), not from the target's own table.
    assert case.expected_acceptance_rate < 0.6
    assert "acceptance_law" not in case.diagnostics


@needs("EarlyExitCandidateGenerator")
def test_early_exit_stub_emits_the_drafter_table_only_below_full_depth():
    step = StepCase(Case(resolve_generator("EarlyExitCandidateGenerator"), TOP_K, scenario=IID))
    model = early_exit_model_for(step.context())
    prompt = step.prompt_ids
    full = model(prompt).logits[0, -1]
    model.model.config.num_hidden_layers = EXIT_LAYER
    early = model(prompt).logits[0, -1]
    assert torch.allclose(full, torch.tensor(IID.target.rows[0], dtype=torch.float32))
    assert torch.allclose(early, torch.tensor(IID.drafter.rows[0], dtype=torch.float32))


# --- UniversalSpeculativeDecodingGenerator ---------------------------------------------------


def _translator_permutation():
    """``perm[t]``: the target token whose q the real translator returns in target slot ``t``."""
    from transformers.generation.candidate_generator import AssistantVocabTranslatorCache

    from lossless_check.laws.tables import FixedLogits
    from lossless_check.subjects.adapters.vocabularies import (
        assistant_lm,
        assistant_words,
        target_words,
        word_level_tokenizer,
    )

    vocab = IID.vocab_size
    words = assistant_words(vocab)
    # A drafter whose logit for target word t is t: the assistant's head (one weight column per table
    # row, stubs.RowSelectHead) then makes each pruned logit name its own word.
    naming = FixedLogits.iid(np.arange(vocab, dtype=np.float64))
    assistant = assistant_lm(naming, len(IID.prompt), vocab)
    translator = AssistantVocabTranslatorCache.get_translator(
        word_level_tokenizer(target_words(vocab)), word_level_tokenizer(words), vocab,
        assistant_model=assistant, assistant_prune_lm_head=True,
    )
    pruned = assistant.get_output_embeddings()(torch.ones(1, 1, 1))  # the selector of the table's one row
    return translator.get_target_logits(pruned)[0, 0].long().numpy()


@needs("UniversalSpeculativeDecodingGenerator")
def test_universal_speculative_decoding_is_not_lossless_because_pruned_logits_are_scattered_in_the_wrong_order():
    """The returned q is the drafted q with its vocabulary permuted (4.52.1 to 5.24.0, :data:`FINDINGS`).

    transformers 5.23, ``generation/candidate_generator.py`` (5.24.0: the same code, lines 729/837):

    - lines 724-730: the assistant's LM head is pruned to rows ``assistant_overlap_token_ids =
      list(target_to_assistant_input_ids.values())``, i.e. in the iteration order of
      ``assistant_tokenizer.get_vocab()`` (line 760, filled at line 786);
    - lines 830-833 (``get_target_logits``): pruned logit ``k`` is written to target id
      ``_assistant_to_target_input_ids[mask][k]``, i.e. in increasing *assistant id* order;
    - line 816 (``get_target_ids``) maps draft ``k`` through ``assistant_overlap_token_ids``,
      the vocabulary order, so the drafted token and its returned q disagree unless ``get_vocab()``
      iterates in id order. A fast tokenizer's ``get_vocab()`` iterates in hash-map order (it even
      changes between calls), so in practice the order is arbitrary.

    The stub tokenizers iterate alphabetically (fixed, for reproducibility): target slot ``t`` then
    holds the q of word ``7 - t``. The observed first-token law is the one Algorithm 1 gives with
    drafts from q and that permuted q as "q"; with an id-ordered vocabulary (next test) it is lossless.
    On 4.50-4.51 the translator prunes nothing (``get_translator`` takes no assistant): lossless there.
    """
    if not finding_holds("UniversalSpeculativeDecodingGenerator"):
        case = run_one("UniversalSpeculativeDecodingGenerator", 1000)
        assert case.verdict == "lossless", case.reason
        return
    perm = _translator_permutation()
    assert (perm != np.arange(IID.vocab_size)).any()  # the defect, white-box

    case = run_one("UniversalSpeculativeDecodingGenerator", 1000)
    assert case.verdict == "not_lossless", case.reason
    assert "output_law@1" in case.failed_checks
    exact = laws(IID, TOP_K)
    p, q = exact.target(), exact.drafter()
    assert_first_token_follows(case, first_token_law_as_torch_computes(p, q, q[perm]), p)


@needs("UniversalSpeculativeDecodingGenerator")
def test_universal_speculative_decoding_is_lossless_when_the_vocabulary_iterates_in_id_order(monkeypatch):
    """Control for the test above: the same run, with ``get_vocab()`` in id order, is lossless."""
    import lossless_check.subjects.adapters.vocabularies as vocabularies

    build = vocabularies.word_level_tokenizer

    def id_ordered(words):
        tokenizer = build(words)
        vocab = tokenizer.get_vocab
        tokenizer.get_vocab = lambda: dict(sorted(vocab().items(), key=lambda item: item[1]))
        return tokenizer

    monkeypatch.setattr(vocabularies, "word_level_tokenizer", id_ordered)
    case = run_one("UniversalSpeculativeDecodingGenerator", 1000)
    assert case.verdict == "lossless", case.reason
    assert "acceptance_law" not in case.diagnostics  # the pruned assistant drafts from the drafter table


# --- Generators without candidate_logits -----------------------------------------------------


@needs("AssistedCandidateGeneratorDifferentTokenizers")
def test_different_tokenizers_drafts_but_returns_no_q_and_is_built_for_greedy_decoding_only():
    step, session = session_for("AssistedCandidateGeneratorDifferentTokenizers")
    candidates, logits = session.draft(step.prompt_ids)
    assert candidates.shape[1] == len(IID.prompt) + IID.gamma and logits is None  # real re-tokenized drafts
    case = run_one("AssistedCandidateGeneratorDifferentTokenizers", 50)
    # A sampling round of it is not one the real loop makes: generate mode checks it against greedy decoding.
    assert case.verdict == "skipped" and "greedy decoding only" in case.reason


@needs("AssistedCandidateGeneratorDifferentTokenizers")
def test_different_tokenizers_survives_drafts_of_assistant_only_words():
    """Top-p plus a ban on every repeated token leaves assistant-only words to draft; the target's tokenizer
    must read them back (as a real tokenizer would), not raise."""
    warpers = {"top_p": 0.7, "no_repeat_ngram_size": 1, "sequence_bias": [[[1], 2.0], [[4, 2], -3.0]]}
    step, session = session_for("AssistedCandidateGeneratorDifferentTokenizers", DEFAULT, warpers)
    for _ in range(50):
        candidates, logits = session.draft(step.prompt_ids)
        assert logits is None and candidates.shape[1] > len(DEFAULT.prompt)


def test_prompt_lookup_copies_an_earlier_ngram_and_its_rounds_are_checked_in_step_mode():
    _, session = session_for("PromptLookupCandidateGenerator")
    candidates, logits = session.draft(torch.tensor([[3, 1, 4, 2, 3, 1]]))
    assert candidates[0, 6:].tolist() == [4, 2, 3] and logits is None  # the continuation of "3 1"
    case = run_one("PromptLookupCandidateGenerator", 300)  # detects TV 0.3 (power 0.99)
    assert case.verdict == "lossless" and case.batch["note"].startswith("batch 1: returns no q"), case.reason
    if within(PROMPT_LOOKUP_CRASHES_WITHOUT_EOS):  # the stubs have an EOS; a model without one crashes (see below)
        from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

        from lossless_check.subjects.adapters.rounds import construct, first_round

        bare = construct(PromptLookupCandidateGenerator, eos_token_id=None, num_output_tokens=3,
                         max_matching_ngram_size=2, max_length=64, vocab_size=8)
        with pytest.raises(TypeError, match="isin"):
            first_round(bare, torch.tensor([[3, 1, 4, 2, 3, 1]]))


def _cycle_rows(vocab=8, period=4, logit=4.0):
    """A Markov table that follows 0 -> 1 -> 2 -> 3 -> 0 with probability e^4 / (e^4 + 7) = 0.886."""
    rows = np.zeros((vocab, vocab))
    rows[np.arange(vocab), (np.arange(vocab) + 1) % period] = logit
    return FixedLogits.markov(rows)


#: A prompt that repeats itself and a target that mostly continues the repetition: the n-gram lookup
#: finds a 3-token draft in almost every round and the target accepts most of it, so rounds end
#: right at max_length often. (The drafter table is unused: prompt lookup has no model.)
CYCLE = Scenario("cycle4", target=_cycle_rows(), drafter=_cycle_rows(), prompt=(0, 1, 2, 3, 0, 1))
CYCLE_K = 6  # max_new_tokens: max_length 12
CYCLE_EOS = 7  # an EOS token the target draws (probability 0.016 a step)


@pytest.mark.parametrize("warpers", [{"eos_token_id": CYCLE_EOS}, {}], ids=["eos", "no-eos"])
def test_prompt_lookup_is_not_lossless_on_4_40_to_5_13_because_the_loop_keeps_its_drafts_past_max_length(warpers):
    """A transformers defect, not the harness's (4.40.0 to 5.13.1, ``PROMPT_LOOKUP_OVERSHOOTS`` in
    ``fixtures/releases.py``; 4.37-4.39 cropped the drafts to the remaining length in the loop).

    transformers 5.13.1, ``generation/candidate_generator.py``: ``PromptLookupCandidateGenerator.get_candidates``
    (class at line 1019) caps its draft with ``end_idx = min(end_idx, input_length, self.max_length)``
    (line 1101), an absolute index the copied n-gram never reaches, instead of the
    ``max_length - input_length - 1`` tokens left; its only length guard (line 1077) skips drafting
    when exactly one token is left. So with 2 tokens left it drafts ``num_output_tokens`` (3).
    ``generation/utils.py`` ``_assisted_decoding``: for a candidate that reaches max_length
    (``is_done_candidate``, line 3666) it drops one token only when every draft matched (lines
    3736-3737); ``valid_tokens = selected_tokens[:, : n_matches + 1]`` (line 3738) is appended
    (line 3746) uncropped. Two matched drafts of three give an output one token past
    ``max_new_tokens``, which plain sampling never emits: the harness's exact ``stopping`` check
    fails. 5.0.0-5.12.1 have the same code (5.0.0 lines 1131 and 3733); on a model without an EOS token
    they raise first from 4.44 on: ``isin(chosen_ids, None)`` (``PROMPT_LOOKUP_CRASHES_WITHOUT_EOS``; the
    None check came in 5.13), which the stubs, having one as every checkpoint does, never meet. 5.14.0 crops the accepted tokens to the length budget in
    ``_assisted_decoding`` (``tokens_budget``, ``generation/utils.py`` lines 3794-3799; 5.24.0 lines
    4153-4156); the generator still drafts past max_length there (5.24.0 line 1099), harmlessly.

    What the defect predicts, checked on the real ``generate()``: every output that breaks the
    rules is exactly one token longer than ``max_new_tokens`` (a draft of ``gamma`` = 3 made with 2
    tokens left overshoots by at most ``gamma - 2``), and none ends early without EOS or holds a
    token after it.
    """
    from transformers import GenerationConfig
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    from lossless_check.core.compat import loop_eos
    from lossless_check.modes.generate import run_generate_case
    from lossless_check.subjects.adapters.rounds import first_round

    affected = within(PROMPT_LOOKUP_OVERSHOOTS)
    if (5, 0, 0) <= release() <= (5, 24, 0):  # white-box, the generator's side: examined on 5.0-5.24
        generator = PromptLookupCandidateGenerator(eos_token_id=torch.tensor([CYCLE_EOS]), num_output_tokens=3,
                                                   max_matching_ngram_size=2, max_length=7)
        candidates, logits = first_round(generator, torch.tensor([[3, 1, 4, 0, 3]]))  # 2 tokens left (one + bonus)
        assert candidates[0, 5:].tolist() == [1, 4, 0] and logits is None  # 3 drafts: the candidates end at 8 > 7

    case = Case(resolve_generator("PromptLookupCandidateGenerator"), warpers, "generate", CYCLE, CYCLE_K)
    result = run_generate_case(case, 200, 0, ALPHA)
    # Without an EOS warper the stubs' own EOS applies (one no table emits: compat.loop_eos is moot here).
    if not affected:
        assert result.verdict == "lossless", result.reason
        assert result.stopping_violations == 0
    else:
        assert result.verdict == "not_lossless" and result.failed_checks == ["stopping"], result.reason
        assert "outputs break the length/EOS rules of plain sampling" in result.reason
        assert result.stopping_violations > 50  # 121 (EOS) and 118 (no EOS) of 200 on 5.13.1

    target = fixed_logits_lm(CYCLE.target, len(CYCLE.prompt))
    config = GenerationConfig(do_sample=True, max_new_tokens=CYCLE_K, prompt_lookup_num_tokens=CYCLE.gamma, **warpers)
    loop_eos(config, CYCLE.vocab_size)  # as generate mode does (an EOS never drawn, on 4.x only)
    torch.manual_seed(0)
    prompt = torch.tensor([CYCLE.prompt])
    with torch.no_grad():
        outputs = [target.generate(prompt, generation_config=config)[0, prompt.shape[1]:].tolist() for _ in range(100)]
    eos = {warpers["eos_token_id"]} if warpers else set()
    assert not [o for o in outputs if eos.intersection(o[:-1])]  # nothing after an EOS, on every release
    assert not [o for o in outputs if len(o) < CYCLE_K and not eos.intersection(o[-1:])]
    too_long = [o for o in outputs if len(o) > CYCLE_K]
    if affected:  # 59 (EOS) and 55 (no EOS) of 100 on 5.13.1
        assert len(too_long) > 25 and {len(o) for o in too_long} == {CYCLE_K + 1}, too_long
    else:
        assert not too_long, too_long


# --- MTPCandidateGenerator -------------------------------------------------------------------


@needs("MTPCandidateGenerator")
@pytest.mark.skipif(within(MTP_RETURNS_RAW_LOGITS), reason="MTP returns raw logits as q here "
                    "(tests/test_provenance.py::test_builtin_generators_provenance asserts it)")
@pytest.mark.parametrize("scenario", [IID, DEFAULT], ids=lambda s: s.name)
def test_mtp_is_lossless(scenario):
    case = run_one("MTPCandidateGenerator", 1000, scenario=scenario)
    assert case.verdict == "lossless", case.reason
    assert "acceptance_law" not in case.diagnostics


# --- SinglePositionMultiTokenCandidateGenerator ----------------------------------------------


@needs("SinglePositionMultiTokenCandidateGenerator")
def test_single_position_multi_token_is_not_lossless_because_it_drafts_argmax_and_returns_raw_logits_as_q():
    """A greedy drafter whose returned q is a full softmax (5.8.0 to 5.24.0, :data:`FINDINGS`).

    transformers 5.23, ``generation/candidate_generator.py`` (5.24.0: the same code), drafting loop of ``get_candidates``
    (lines 1331-1348): each draft is ``outputs.logits.argmax(dim=-1)`` (line 1344) and the returned
    ``candidate_logits`` are the assistant's raw ``outputs.logits`` (line 1347; no logits
    processors: the constructor, lines 1250-1276, takes none). ``_assisted_decoding``
    (``generation/utils.py`` line 4103, ``if do_sample and candidate_logits is not None``) then runs
    ``_speculative_sampling`` with q = softmax(raw logits), while the drafts were drawn from a
    point mass on the argmax.

    The observed first-token law is the one Algorithm 1 gives with drafts from that point mass and
    softmax(raw drafter logits) as "q".
    """
    assert finding_holds("SinglePositionMultiTokenCandidateGenerator")
    case = run_one("SinglePositionMultiTokenCandidateGenerator", 1000)
    assert case.verdict == "not_lossless", case.reason
    p = laws(IID, TOP_K).target()
    raw = IID.drafter.rows[0]
    softmax = np.exp(raw - raw.max()) / np.exp(raw - raw.max()).sum()
    assert_first_token_follows(case, first_token_law(p, np.eye(IID.vocab_size)[raw.argmax()], softmax), p)


@needs("SinglePositionMultiTokenCandidateGenerator")
def test_single_position_drafts_each_rows_argmax_and_returns_the_raw_rows():
    """White-box side of the defect above, on the per-position drafter of the default scenario."""
    step, session = session_for("SinglePositionMultiTokenCandidateGenerator", scenario=DEFAULT, warpers={})
    candidates, logits = session.draft(step.prompt_ids)
    rows = DEFAULT.drafter.rows[: DEFAULT.gamma]
    assert candidates[0, len(DEFAULT.prompt):].tolist() == rows.argmax(axis=1).tolist()
    assert np.allclose(logits[0].numpy(), rows, atol=1e-6)


@needs("EarlyExitCandidateGenerator")
def test_early_exit_cannot_run_on_5_0_to_5_2_because_its_get_candidates_omits_is_first_iteration():
    """A transformers defect, not the harness's: on 5.0-5.2 ``AssistedCandidateGenerator.get_candidates``
    requires ``is_first_iteration``, and ``EarlyExitCandidateGenerator.get_candidates`` calls
    ``super().get_candidates(input_ids)`` without it (5.0.0 ``generation/candidate_generator.py`` line
    1257), so every call raises ``TypeError``. Fixed in 5.3 (``benchmarks/compat_table.md``). On the
    installed release the verdict follows that table: ``error`` with that reason on 5.0-5.2, else lossless.
    """
    case = run_one("EarlyExitCandidateGenerator", 500)  # 500 trials: power 0.99 at TV 0.27 (a lossless claim)
    if within(EARLY_EXIT_OMITS_FIRST_ITERATION):
        assert case.verdict == "error" and "is_first_iteration" in case.reason, case.reason
    else:
        assert case.verdict == "lossless", case.reason


def test_get_candidates_is_called_as_the_installed_loop_calls_it():
    """5.0-5.2's ``_assisted_decoding`` passes ``is_first_iteration`` positionally whatever the
    generator's signature names; later releases pass ``input_ids`` alone. The harness calls the same
    way, so that an override written ``get_candidates(self, input_ids, *args, **kwargs)`` works where the
    real loop's call works (it was an ``error`` on 5.0-5.2 before: the harness passed the argument only
    to signatures naming it), and one that cannot take the argument fails there as the real loop would."""
    import inspect

    from transformers.generation.utils import GenerationMixin

    from lossless_check.subjects.adapters.rounds import first_round, loop_passes_first_iteration

    class Recorder:
        def get_candidates(self, input_ids, *args, **kwargs):
            return args, kwargs

    loop = inspect.getsource(getattr(GenerationMixin, "_assisted_decoding", None) or GenerationMixin.assisted_decoding)
    passes = "get_candidates(input_ids, is_first_iteration)" in loop
    assert passes == loop_passes_first_iteration() == within(("5.0.0", "5.3.0"))
    assert first_round(Recorder(), torch.zeros(1, 2, dtype=torch.long)) == (((True,), {}) if passes else ((), {}))
