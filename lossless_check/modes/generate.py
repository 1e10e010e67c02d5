"""Generate mode: the real ``generate()`` loop, tested through the joint law of the emitted tokens.

Each sample is one unmodified call ``target.generate(prompt, generation_config=GenerationConfig(
do_sample=True, max_new_tokens=K, **warpers), **kwargs)``, with the models, ``kwargs``
(``assistant_model=``, tokenizers) and routing fields of the config that make the installed
``generate()`` build the case's generator family itself (:mod:`.loop_models`: every built-in family,
a subclass wired in where ``generate()`` builds its base, and whatever ``CandidateGenerator`` a user's
factory returns, wired in at the same place on the assisted route). It runs every part of the loop that
step mode leaves out: several drafting rounds, the target's and the drafter's cache cropping after a
rejection, the draft length capped near ``max_length``, rounds with no draft at all (the first round
of MTP, DFlash and SinglePosition), how ``_assisted_decoding`` builds and processes the target's
logits, and the cropping of accepted tokens at EOS and at ``max_length``.

Reference: plain sampling with the same config emits ``x_1 .. x_K`` with
``x_k ~ p(. | prompt + x_<k)``, the target's logits after ``prompt + x_<k`` processed by the real
``LogitsProcessorList`` that ``generate()`` builds, and stops after an EOS token. So, per case:

- *stopping* (exact): exactly ``K`` tokens unless the last one is EOS, and nothing after an EOS;
- *support* (exact): no emitted token has target probability 0 given its prefix;
- *conditional law at every position* ``k = 1..K``: among samples that emitted ``k`` tokens, group
  them by their exact law ``p(. | prompt + x_<k)`` and test the groups with :func:`~.stats.law_test`.
  The ``K`` position tests are combined by Bonferroni into the case's p-value.

Together the conditionals are the joint law of the first ``K`` tokens (with stopping).
``AssistedCandidateGeneratorDifferentTokenizers`` is built by ``generate()`` for ``do_sample=False``
only: its reference is plain greedy decoding with the same config (a point mass on the argmax of the
processed logits at every position). Targets: the
fixed-logits stubs of a :class:`~.scenarios.Scenario` (law from the table), or a randomly initialised
tiny Llama (:class:`TinyLlamaScenario`; law from running the target on each observed prefix).

Samples come in the engine's seeded chunks, so results do not depend on ``--workers``. The
real loop drafts one sequence at a time: generate mode is never batched.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

import numpy as np
import torch

from lossless_check.core.compat import ABSENT, generator_processors, loop_eos, release_warpers
from lossless_check.core.errors import GeneratorFailure
from lossless_check.evidence.analysis import position_tests, sequential_evidence, stop_sequentially, strata
from lossless_check.evidence.attribution import attribute, watching_verifier, without
from lossless_check.evidence.results import Case, CaseResult, one_line
from lossless_check.laws.expected import ExactLaws, GreedyLaws, processed
from lossless_check.laws.stateful import target_lm
from lossless_check.laws.warpers import capture_processors
from lossless_check.modes import loop_models
from lossless_check.modes.observations import Generations
from lossless_check.modes.past_budget import filling_past_budget
from lossless_check.modes.randomness import seed_streams
from lossless_check.modes.tiny_llama import TINY_LLAMA, TinyLlamaScenario, tiny_llama_pair
from lossless_check.running.chunks import guarded, kept, run_in_chunks, within_deadline
from lossless_check.stats import Stratum
from lossless_check.subjects.adapters import DraftContext
from lossless_check.subjects.adapters.base import constant_drafts
from lossless_check.subjects.adapters.mtp import _quiet_loading

#: Laws are functions of the generated prefix: ``law(prefix)`` is ``p(. | prompt + prefix)``.
Law = Callable[[tuple[int, ...]], np.ndarray]


@dataclass
class GenerateCaseResult(CaseResult):
    """A generate-mode case: :class:`~lossless_check.evidence.results.CaseResult` plus what the loop did."""

    max_new_tokens: int = 0
    route: str | None = None  # how generate() was made to pick the generator
    greedy: bool = False  # do_sample=False: the reference is plain greedy decoding (a point mass)
    mean_rounds: float | None = None  # target forward passes per generate() call
    mean_new_tokens: float | None = None
    stopping_violations: int = 0  # outputs plain sampling cannot produce (length / EOS rules)
    filled_past_budget: int = 0  # samples that drafted into a row past max_length with no token left (.past_budget)

    def explain(self) -> str:
        """The step-mode explanation plus the stopping check and what the loop did."""
        parts = [super().explain()]
        if self.greedy:
            parts.insert(0, "greedy (do_sample=False: the only config for which generate() builds this generator); "
                            "reference: plain greedy decoding")
        if self.stopping_violations:
            parts.append(f"{self.stopping_violations} outputs break the length/EOS rules of plain sampling")
        if self.mean_rounds is not None:  # None: no sample finished (an error before any)
            parts.append(f"{self.mean_rounds:.2f} rounds and {self.mean_new_tokens:.2f} tokens per generate() call")
        if self.filled_past_budget:
            parts.append(f"{self.filled_past_budget} samples drafted past max_new_tokens into positions where the "
                         f"scenario's processed laws have no token left (given zero logits there: never emitted, "
                         f"see lossless_check.modes.past_budget)")
        return "; ".join(p for p in parts if p)


class _ModelLaws:
    """Exact processed laws of a real model: its float64 copy run on ``prompt + prefix``, no cache."""

    def __init__(self, model, prompt: tuple[int, ...], processors):
        self.model = copy.deepcopy(model).to(torch.float64).eval()
        self.prompt = prompt
        self.processors = processors
        self.target = lru_cache(maxsize=None)(self._law)

    @torch.no_grad()
    def _law(self, prefix: tuple[int, ...]) -> np.ndarray:
        history = torch.tensor([self.prompt + prefix], dtype=torch.long)
        logits = self.model(history, use_cache=False).logits[:, -1].to(torch.float64)
        if len(self.processors) > 0:
            logits = processed(self.processors, history, logits)
        probs = torch.softmax(logits, dim=-1)[0].numpy()
        probs.setflags(write=False)
        return probs


def _use_constant_drafts(drafter, gamma: int):
    # The "heuristic" schedule writes its draft length back into the drafter's generation config at
    # the end of generate(): samples would depend on each other. Constant length, no early stop.
    for key, value in constant_drafts(gamma).items():
        setattr(drafter.generation_config, key, value)


@dataclass
class _Setup:
    """The models, the ``generate()`` arguments, the generation config and the exact laws of one case.

    Each sample is ``target.generate(prompt_ids, generation_config=generation_config, **generate_kwargs)``;
    ``counts_round()`` tells whether a forward of ``target`` is a verification pass.
    """

    target: object
    generate_kwargs: dict
    prompt_ids: torch.LongTensor
    generation_config: object
    law: Law
    eos: frozenset[int]
    counts_round: Callable[[], bool] = lambda: True
    route: str = ""
    greedy: bool = False
    keep: object = None
    #: The ``GenerationConfig`` fields that make ``generate()`` build the family (with the ``generate_kwargs``);
    #: without them and the kwargs, the same call is plain decoding (greedy mode's reference).
    routing: dict = field(default_factory=dict)


def _eos_ids(config) -> frozenset[int]:
    eos = config.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


def _setup(case: Case, max_new_tokens: int) -> _Setup:
    """Build the case's models (:mod:`.loop_models`: the ones that make ``generate()`` pick its family)."""
    from transformers import GenerationConfig

    scenario = case.scenario
    if getattr(scenario, "encoder_decoder", False):  # markov8-seq2seq: encoder-decoder stubs (.seq2seq)
        from lossless_check.modes.seq2seq import seq2seq_setup

        parts = seq2seq_setup(case, max_new_tokens)
        eos = _eos_ids(parts.pop("prepared"))
        return _Setup(**parts, eos=eos)
    family = case.generator.adapter.name
    prompt_ids = torch.tensor([scenario.prompt], dtype=torch.long)
    config = GenerationConfig(do_sample=True, max_new_tokens=max_new_tokens, **release_warpers(case.warpers))
    loop_eos(config, scenario.vocab_size)
    if isinstance(scenario, TinyLlamaScenario):
        target, drafter = tiny_llama_pair(scenario.seed, scenario.vocab_size)
        _use_constant_drafts(drafter, scenario.gamma)
        processors, prepared = capture_processors(target, prompt_ids, case.warpers, max_new_tokens)
        law = _ModelLaws(target, scenario.prompt, processors).target
        kwargs = {"assistant_model": drafter}
        routing = {}
        if family == loop_models.PROMPT_LOOKUP:
            kwargs, routing = {}, {"prompt_lookup_num_tokens": scenario.gamma}
            config.prompt_lookup_num_tokens = scenario.gamma
        if case.generator.generator_class is not loop_models.installed_class(family):
            target = loop_models.driving(target, case.generator.generator_class, loop_models.installed_class(family))
        return _Setup(target, kwargs, prompt_ids, config, law, _eos_ids(prepared), route=loop_models.route(family),
                      routing=routing)
    plain = target_lm(scenario)
    greedy = family in loop_models.GREEDY_FAMILIES
    if greedy:
        processors, prepared = capture_processors(plain, prompt_ids, case.warpers, max_new_tokens, do_sample=False)
        law = GreedyLaws(scenario, processors).target
    else:
        processors, prepared = capture_processors(plain, prompt_ids, case.warpers, max_new_tokens)
        law = ExactLaws(scenario, processors).target
    ctx = DraftContext(scenario, case.generator.generator_class, prepared, generator_processors(processors), plain,
                       prompt_ids)
    models = loop_models.loop_models(family, ctx)
    # The config capture_processors gave generate() (the processors and laws above are its own),
    # plus the fields that route the family.
    for key, value in models.config_fields.items():
        setattr(config, key, value)
    return _Setup(models.target, models.generate_kwargs, prompt_ids, config, law, _eos_ids(prepared),
                  models.counts_round, loop_models.route(family), greedy, models.keep, dict(models.config_fields))


def stopping_violation(tokens: list[int], max_new_tokens: int, eos: frozenset[int]) -> bool:
    """Whether ``tokens`` is not a possible output of plain sampling (length and EOS rules)."""
    if len(tokens) > max_new_tokens or any(t in eos for t in tokens[:-1]):
        return True
    return len(tokens) < max_new_tokens and (not tokens or tokens[-1] not in eos)


def collect(setup: _Setup, samples: int, max_new_tokens: int, seed: int,
            progress: Callable[[int], None] | None = None) -> Generations:
    """Call ``generate()`` ``samples`` times; count target forward passes (one per round)."""
    forwards = [0]

    def count(*_):
        if setup.counts_round():
            forwards[0] += 1

    hook = setup.target.register_forward_hook(count)
    emitted = np.full((samples, max_new_tokens), -1, dtype=np.int64)
    rounds = np.zeros(samples, dtype=np.int64)
    violates = np.zeros(samples, dtype=bool)
    aside = np.full(samples, -1, dtype=np.int64)
    filled = np.zeros(samples, dtype=bool)
    prompt_length = setup.prompt_ids.shape[1]
    seed_streams(seed)  # torch's, numpy's and Python's, as transformers.set_seed
    started = time.perf_counter()
    try:
        # _quiet_loading: MTP's generator loads its layers (from_pretrained) at every generate() call.
        with torch.no_grad(), _quiet_loading(), watching_verifier(prompt_length) as accepted_zero, \
                filling_past_budget(setup.prompt_ids, prompt_length + max_new_tokens) as fills:
            for t in range(samples):
                before = forwards[0]
                seen, fills_seen = len(accepted_zero), len(fills)
                try:
                    out = setup.target.generate(setup.prompt_ids, generation_config=setup.generation_config,
                                                **setup.generate_kwargs)
                except Exception as exc:  # noqa: BLE001 - the generator under test (or the loop) failed
                    raise GeneratorFailure(f"generate() raised {one_line(exc)}") from exc
                tokens = out[0, prompt_length:].tolist()
                violates[t] = stopping_violation(tokens, max_new_tokens, setup.eos)
                emitted[t, : min(len(tokens), max_new_tokens)] = tokens[:max_new_tokens]
                rounds[t] = forwards[0] - before
                aside[t] = accepted_zero[seen] if len(accepted_zero) > seen else -1
                filled[t] = len(fills) > fills_seen
                if progress is not None:
                    progress(1)
    finally:
        hook.remove()
    return Generations(emitted, rounds, violates, time.perf_counter() - started, aside, filled)


def position_strata(emitted: np.ndarray, position: int, law: Law) -> list[Stratum]:
    """Strata for output position ``position`` (0-based): samples that reached it, grouped by exact law
    (on the coarsened partition above :data:`~lossless_check.evidence.analysis.COARSEN_ABOVE_VOCAB`).

    ``emitted`` is blanked after EOS (:meth:`Generations.before_eos`): plain sampling never goes past
    an EOS, and the stopping check already counts samples that did.
    """
    rows = emitted[emitted[:, position] >= 0]
    vocab = len(law(tuple(int(t) for t in rows[0, :position]))) if len(rows) else 0
    return strata(rows, position, law, vocab) if len(rows) else []


def analyse(case: Case, setup: _Setup, gens: Generations, alpha_case: float) -> GenerateCaseResult:
    """Statistics and verdict of one generate-mode case at its share ``alpha_case`` of the family rate."""
    max_new_tokens = gens.emitted.shape[1]
    result = GenerateCaseResult(case.generator.display_name, case.warper_spec, "generate", case.scenario.name,
                                max_new_tokens=max_new_tokens, route=setup.route, greedy=setup.greedy)
    result.samples = len(gens.rounds)
    result.seconds = gens.seconds
    result.samples_per_second = result.samples / gens.seconds if gens.seconds > 0 else None
    result.alpha_case = alpha_case
    result.mean_rounds = float(gens.rounds.mean())
    result.mean_new_tokens = float((gens.emitted >= 0).sum(axis=1).mean())
    result.stopping_violations = gens.stopping_violations
    result.filled_past_budget = int(gens.filled.sum())
    emitted = gens.before_eos(setup.eos)
    by_position = [position_strata(emitted, k, setup.law) for k in range(max_new_tokens)]
    violations = position_tests(result, by_position, alpha_case)
    if setup.greedy:  # a point mass by design: the check is exact, no evidence about q is sought
        result.informative_positions = None
    if gens.stopping_violations:
        result.failed_checks.append("stopping")
    result.exact_failure = bool(violations or gens.stopping_violations)
    result.verdict = "not_lossless" if (result.exact_failure or result.p_value <= alpha_case) else "lossless"
    result.reason = result.explain()
    return result


def skip_reason(case: Case) -> str | None:
    """Why generate mode cannot drive this case's generator (``None`` if it can).

    Skipped: a generator absent from the installed release; a drafter table the family cannot express
    (the adapter's ``drafter_kinds``); the ``tiny-llama`` scenario for a family other than the
    assistant-model and prompt-lookup ones (a factory included: it builds from the fixed-logits
    stubs); a target kind (``markov8-linear`` ...) the family cannot pair with or the release refuses
    (:func:`~.loop_models.target_kind_reason`); and a release whose ``generate()`` never builds the family.
    A factory's generator is built where ``generate()`` builds one (:func:`~.loop_models.drafting_with_factory`).
    """
    generator = case.generator
    name = generator.adapter.name
    if generator.generator_class is None:
        return f"{name} {ABSENT}"
    scenario = case.scenario
    if getattr(scenario, "encoder_decoder", False):
        from lossless_check.modes.seq2seq import skip_reason as seq2seq_skip

        return seq2seq_skip(case)
    if isinstance(scenario, TinyLlamaScenario):
        if name == loop_models.FACTORY:
            return (f"a factory builds its generator from a fixed-logits scenario's stubs (ctx.assistant()); the "
                    f"{scenario.name} scenario has none")
        if name not in (loop_models.ASSISTED, loop_models.PROMPT_LOOKUP):
            return f"the {scenario.name} scenario has a Llama assistant: it drives the assistant-model and prompt-lookup paths, not {name}"
    elif scenario.drafter.kind not in generator.adapter.drafter_kinds:
        return f"a {scenario.drafter.kind} drafter table cannot drive {name}"
    if getattr(scenario, "target_kind", None) is not None:
        reason = loop_models.target_kind_reason(name, scenario.target_kind)
        if reason is not None:
            return reason
    if getattr(case.scenario, "drafter_padding", 0) and not case.generator.adapter.padded_drafter:
        return (f"{case.generator.adapter.name} drafts through the target's own head or hidden states: a drafter "
                f"head padded past the target's vocabulary does not apply to it")
    if name != loop_models.FACTORY and loop_models.routes_in_generate(name) is False:
        import transformers

        return f"generate() of transformers {transformers.__version__} never builds {name}"
    return None


def run_generate_case(case: Case, samples: int, seed: int, alpha_case: float, sequential: bool = False,
                      timeout: float = 600.0, store=None) -> CaseResult:
    """Run and analyse one case through the real ``generate()`` loop (``case.max_new_tokens`` tokens a call).

    ``case.scenario`` is a fixed-logits :class:`~lossless_check.laws.scenarios.Scenario` or a
    :class:`TinyLlamaScenario`; ``case.warpers`` are ``GenerationConfig`` keywords (``eos_token_id``
    among them for EOS cases). Every built-in family runs, picked by ``generate()`` itself (see
    :mod:`.loop_models` for how), any subclass of one (built where ``generate()`` builds its
    base) and a factory's generator (built at the same place, one per call); what cannot run is ``skipped`` with its reason (:func:`skip_reason`). A failure inside
    ``generate()`` gives verdict ``error``. ``sequential``: the case stops at the first sample its
    anytime e-value rejects, or at the look that sees an exact failure
    (:func:`~lossless_check.evidence.analysis.stop_sequentially`, as in step mode); otherwise all ``samples``.

    Assumptions: the ``samples`` calls are independent (each ``generate()`` builds a fresh candidate
    generator; the drafter uses a constant draft length; a generator keeps no state across the calls
    of a case that could tie them). Then, for a lossless loop, the case is
    flagged ``not_lossless`` with probability at most ``alpha_case`` (exact checks never fail).
    ``tv_detectable`` (position 1; every position in ``positions``) is the sample-weighted TV the
    position's test detects with probability ``POWER``; later positions have fewer samples and, with
    history-dependent laws, more strata, hence less power. The verdict here is at ``alpha_case``;
    :func:`~lossless_check.evidence.results.decide` re-decides it across a run's cases. ``store``: where
    finished chunks are kept (:func:`~lossless_check.running.chunks.kept`).
    """
    reason = skip_reason(case)
    if reason is not None:
        return GenerateCaseResult(case.generator.display_name, case.warper_spec, "generate", case.scenario.name,
                                  verdict="skipped", reason=reason, max_new_tokens=case.max_new_tokens)

    def run() -> CaseResult:
        setup = _setup(case, case.max_new_tokens)

        def analyse_look(parts: list[Generations], final: bool) -> CaseResult | None:
            gens = Generations.concatenate(parts)
            # Samples where the verifier accepted a draft of its own p = 0 are its doing: set aside.
            aside = gens.aside
            gens = without(gens, aside >= 0)
            if not sequential:
                return attribute(analyse(case, setup, gens, alpha_case), aside, stopping=gens.stopping_violations,
                                 rounds=case.max_new_tokens)
            emitted = gens.before_eos(setup.eos)
            log_e, outside_support = sequential_evidence(emitted, case.max_new_tokens, setup.law)
            exact = bool(gens.stopping_violations) or outside_support
            result = stop_sequentially(
                lambda trials, alpha: analyse(case, setup, gens if trials is None else gens.head(trials), alpha),
                log_e, alpha_case, final, exact)
            return None if result is None else attribute(result, aside, stopping=gens.stopping_violations,
                                                          rounds=case.max_new_tokens)

        return run_in_chunks(case, samples, seed, sequential,
                             kept(store, case, within_deadline(timeout, lambda chunk, size, chunk_seed:
                                                               collect(setup, size, case.max_new_tokens, chunk_seed))),
                             analyse_look)

    result = guarded(case, run)
    if not isinstance(result, GenerateCaseResult):
        result = GenerateCaseResult(**result.__dict__, max_new_tokens=case.max_new_tokens)
    return result


__all__ = ["GenerateCaseResult", "TINY_LLAMA", "TinyLlamaScenario", "run_generate_case", "skip_reason",
           "tiny_llama_pair"]
