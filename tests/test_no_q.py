"""Any generator in every mode: a factory's generator and generators that return no q, in step and generate mode.

A generator returning ``candidate_logits`` ``None`` is lossless only if the target's draws in the loop
are fresh and independent of the drafts, and the target runs on the right history: each no-q mutant
breaks one of those and is convicted in the mode that can see it, while the honest controls (a
sampling drafter with no q, the built-in prompt lookup, the published-style nested-generate
generator) pass. The stubs look like checkpoints, so a generator that runs its drafter's own
``generate()`` works on them.
"""

import numpy as np
import pytest
import torch

from fixtures.mutants.no_q import POSITIONS_SCENARIO
from fixtures.releases import (
    CROPPED_CACHE_REFILLED,
    LOOP_READS_NUM_DRAFTING_TOKENS,
    PROMPT_LOOKUP_CRASHES_WITHOUT_EOS,
    assisted_samples,
    within,
)
from lossless_check.evidence.results import Case
from lossless_check.faces.api import run_cases as run
from lossless_check.laws.scenarios import DEFAULT, IID, Scenario
from lossless_check.laws.stubs import fixed_logits_lm
from lossless_check.laws.tables import FixedLogits
from lossless_check.modes.loop_round import ROUND_NOTE
from lossless_check.modes.step import StepCase
from lossless_check.subjects.adapters import FactoryAdapter, ResolvedGenerator, resolve_generator

ALPHA = 1e-6
NESTED = "fixtures.nested_generate"
NO_Q = "fixtures.mutants.no_q"
PROMPT_LOOKUP = "PromptLookupCandidateGenerator"


def one(spec, mode, scenario=DEFAULT, samples=300, warpers=None, seed=0, max_new_tokens=4):
    case = Case(resolve_generator(spec), warpers or {}, mode, scenario, max_new_tokens)
    return run([case], samples, ALPHA, seed=seed, sequential=True).cases[0]


# --- Stubs that look like checkpoints ---------------------------------------------------------


def test_stubs_carry_the_special_tokens_of_a_checkpoint_with_an_eos_no_table_emits():
    stub = fixed_logits_lm(DEFAULT.target, len(DEFAULT.prompt))
    vocab = DEFAULT.vocab_size
    assert stub.config.eos_token_id == stub.generation_config.eos_token_id == vocab  # past the table's columns
    assert stub.config.bos_token_id == stub.generation_config.bos_token_id == vocab
    assert stub.config.pad_token_id is None and stub.generation_config.pad_token_id is None
    assert stub.config.max_position_embeddings >= 1024
    logits = stub(torch.tensor([DEFAULT.prompt])).logits
    assert logits.shape[-1] == vocab  # so the EOS has probability 0 under every law the stub emits


def test_a_drafter_can_run_its_own_nested_generate_with_prompt_lookup():
    """What the published generator's drafter does (issue 49: it raised ``isin(Tensor, NoneType)`` on a stub
    without an EOS): prompt lookup, output scores and a dict, on the harness's assistant stub."""
    assistant = fixed_logits_lm(DEFAULT.drafter, len(DEFAULT.prompt))
    prompt = torch.tensor([[3, 1, 4, 2, 3, 1]])
    torch.manual_seed(0)
    out = assistant.generate(prompt, attention_mask=torch.ones_like(prompt), prompt_lookup_num_tokens=2,
                             max_new_tokens=3, do_sample=False, output_scores=True, return_dict_in_generate=True)
    assert out.sequences.shape[1] >= prompt.shape[1] + 3 and len(out.scores) == out.sequences.shape[1] - 6
    assert out.scores[0].shape == (1, DEFAULT.drafter.vocab_size)
    if within(PROMPT_LOOKUP_CRASHES_WITHOUT_EOS):  # the control: the same call on a model without an EOS
        assistant.generation_config.eos_token_id = None
        with pytest.raises(TypeError, match="isin"):
            assistant.generate(prompt, attention_mask=torch.ones_like(prompt), prompt_lookup_num_tokens=2,
                               max_new_tokens=3, do_sample=False)


# --- The published-style generator, gated through factories -----------------------------------


@pytest.mark.parametrize("factory, verdict", [("returning_none", "lossless"), ("greedy_scores_as_q", "not_lossless"),
                                              ("sampling_scores_as_q", "lossless")])
@pytest.mark.parametrize("mode", ["step", "generate"])
def test_the_nested_generate_generator_is_checked_in_step_and_generate_mode(factory, verdict, mode):
    result = one(f"{NESTED}:{factory}", mode, samples=350)  # a pass detects TV 0.3 (power 0.99): about 310 trials
    assert result.verdict == verdict, result.reason
    assert len(result.positions) == 4  # every position tested, none skipped
    if mode == "step" and factory == "returning_none":
        assert result.batch["note"] == ROUND_NOTE and result.acceptance_rate > 0  # real rounds, real drafts


# --- No-q mutants and their controls ----------------------------------------------------------

#: (spec, scenario, mode, verdict): each mutant in the mode(s) that can see it (a re-seeding or peeking
#: drafter draws nothing in greedy mode: there is no draw to repeat or foresee); the cache-cropping one
#: from the second round on only, so a step-mode round (the first) cannot see it, and not where the
#: next verification pass refills the cache (CROPPED_CACHE_REFILLED: lossless there, rightly).
NO_Q_CASES = [
    (f"{NO_Q}:honest", DEFAULT, "step", "lossless"),
    (f"{NO_Q}:honest", DEFAULT, "generate", "lossless"),
    (f"{NO_Q}:reseeding", DEFAULT, "step", "not_lossless"),
    (f"{NO_Q}:reseeding", DEFAULT, "generate", "not_lossless"),
    (f"{NO_Q}:peeking", DEFAULT, "step", "not_lossless"),
    (f"{NO_Q}:peeking", DEFAULT, "generate", "not_lossless"),
    (f"{NO_Q}:cache_cropping", POSITIONS_SCENARIO, "generate",
     "lossless" if within(CROPPED_CACHE_REFILLED) else "not_lossless"),
    (f"{NO_Q}:cache_cropping", POSITIONS_SCENARIO, "step", "lossless"),
    (f"{NO_Q}:honest", POSITIONS_SCENARIO, "generate", "lossless"),
    # Greedy mode drives a factory's generator through the same route, against plain greedy decoding.
    (f"{NO_Q}:cache_cropping", POSITIONS_SCENARIO, "greedy",
     "lossless" if within(CROPPED_CACHE_REFILLED) else "not_lossless"),
    (f"{NO_Q}:honest", POSITIONS_SCENARIO, "greedy", "lossless"),
]


@pytest.mark.parametrize("spec, scenario, mode, verdict", NO_Q_CASES,
                         ids=[f"{s.rpartition(':')[2]}-{sc.name}-{m}" for s, sc, m, _ in NO_Q_CASES])
def test_no_q_mutants_are_convicted_and_their_controls_pass(spec, scenario, mode, verdict):
    result = one(spec, mode, scenario, samples=400)
    assert result.verdict == verdict, result.reason
    if mode == "step":
        assert result.batch["note"].startswith(ROUND_NOTE)
    if verdict == "not_lossless" and mode == "step":  # the watch saw the stream managed by the generator
        assert "during get_candidates" in result.batch["note"]


def _cycle(vocab=8, period=4, logit=4.0):
    """A Markov table that follows 0 -> 1 -> 2 -> 3 -> 0 with probability e^4 / (e^4 + 7) = 0.886."""
    rows = np.zeros((vocab, vocab))
    rows[np.arange(vocab), (np.arange(vocab) + 1) % period] = logit
    return FixedLogits.markov(rows)


#: A repeating prompt and a target that mostly continues it: prompt lookup drafts on the first round.
CYCLE = Scenario("cycle4", target=_cycle(), drafter=_cycle(), prompt=(0, 1, 2, 3, 0, 1))


def test_prompt_lookup_gets_step_rows_from_real_rounds():
    result = one(PROMPT_LOOKUP, "step", CYCLE, samples=400, warpers={"top_k": 3})
    assert result.verdict == "lossless", result.reason
    assert result.batch["note"] == ROUND_NOTE
    assert result.acceptance_rate > 0.5 and result.positions[3]["samples"] > 100  # its drafts were verified


# --- How a round is made ----------------------------------------------------------------------


def test_the_probe_passes_a_generator_that_returns_no_q_and_names_one_that_fails():
    """The run's probe (one call per generator and scenario) reserves no alpha for a case that will not give a
    verdict: a generator returning no q gives one now; a factory returning something else does not."""
    from lossless_check.modes import skip_reason

    assert skip_reason(Case(resolve_generator(PROMPT_LOOKUP), {"top_k": 3})) is None
    assert skip_reason(Case(resolve_generator(f"{NO_Q}:reseeding"), {})) is None
    assert "not a CandidateGenerator" in skip_reason(Case(resolve_generator("fixtures.factories:not_a_generator"), {}))


def test_a_step_round_is_one_round_of_the_real_loop():
    step = StepCase(Case(resolve_generator(f"{NO_Q}:honest"), {}, scenario=DEFAULT))
    assert step.returns_no_q and step.batching == (1, ROUND_NOTE) and not step.starts_batched
    rounds = step.loop_rounds
    forwards = []
    hook = rounds.models.target.register_forward_hook(lambda *_: forwards.append(1))
    try:
        obs = step.collect(20, seed=3)
    finally:
        hook.remove()
    assert len(forwards) == 20  # one verification pass a trial: the loop stopped after its first round
    assert (obs.drafts == DEFAULT.gamma).all() and (obs.n_matches == (obs.emitted >= 0).sum(1) - 1).all()
    assert ((obs.emitted >= 0).sum(1) <= DEFAULT.gamma + 1).all()
    again = StepCase(Case(resolve_generator(f"{NO_Q}:honest"), {}, scenario=DEFAULT)).collect(20, seed=3)
    assert (again.emitted == obs.emitted).all()  # a function of the seed


def test_a_factory_in_generate_mode_sees_the_call_it_is_built_for():
    """The factory is called where generate() builds its generator: with generate()'s own config,
    processors, model_kwargs (the target's live cache) and input ids, the generating model as target."""
    from fixtures import factories
    from lossless_check.modes.generate import _setup

    seen = []

    def recording(ctx):
        seen.append(ctx)
        return factories.assisted(ctx)

    case = Case(ResolvedGenerator("recording", FactoryAdapter(recording), recording), {"top_k": 3}, "generate", IID, 4)
    setup = _setup(case, 4)
    setup.target.generate(setup.prompt_ids, generation_config=setup.generation_config, **setup.generate_kwargs)
    (ctx,) = seen
    assert ctx.target is setup.target and ctx.prompt_ids.tolist() == [list(IID.prompt)]
    assert ctx.model_kwargs is not None and ctx.model_kwargs.get("use_cache")  # generate()'s own
    assert ctx.generation_config.do_sample and ctx.generation_config.top_k == 3


@assisted_samples()
def test_a_factory_is_lossless_in_generate_mode_and_a_greedy_one_is_not():
    honest = one("fixtures.factories:assisted", "generate", IID, samples=300, warpers={"top_k": 3})
    greedy = one("fixtures.factories:greedy_with_softmax_q", "generate", IID, samples=300, warpers={"top_k": 3})
    assert honest.verdict == "lossless" and honest.route.startswith("assistant_model="), honest.reason
    assert greedy.verdict == "not_lossless", greedy.reason


def test_a_generator_without_num_drafting_tokens_is_an_error_where_the_loop_reads_it():
    """5.25's loop reads ``num_drafting_tokens`` of every generator, and the base class does not define it: a
    generator of one's own written for 5.24 is ``error`` there (what its users would get), never a pass; the
    same generator declaring it passes (the test above). Before 5.25 nothing reads it."""
    from transformers.generation.candidate_generator import CandidateGenerator

    from fixtures.mutants.no_q import TableDrafter

    class Undeclared(CandidateGenerator):
        def __init__(self, ctx):
            self.drafter = TableDrafter(ctx)

        def get_candidates(self, input_ids, *args, **kwargs):
            return self.drafter.get_candidates(input_ids)

        def update_candidate_strategy(self, input_ids, scores, num_matches):
            pass

    case = Case(ResolvedGenerator("Undeclared", FactoryAdapter(Undeclared), Undeclared), {}, "greedy",
                POSITIONS_SCENARIO, 4)
    result = run([case], 300, ALPHA, seed=0, sequential=True).cases[0]
    if within(LOOP_READS_NUM_DRAFTING_TOKENS):
        assert result.verdict == "error" and "num_drafting_tokens" in result.reason
    else:
        assert result.verdict == "lossless", result.reason
