"""Generate mode: the real ``generate()`` loop, tested through the joint law of the emitted tokens.

Each sample is one unmodified call ``target.generate(prompt, assistant_model=drafter,
generation_config=GenerationConfig(do_sample=True, max_new_tokens=K, **warpers))``. It runs every
part of the loop that step mode leaves out: several drafting rounds, the target's and the
assistant's cache cropping after a rejection, the draft length capped near ``max_length``, rounds
with no draft at all, and the cropping of accepted tokens at EOS and at ``max_length``.

Reference: plain sampling with the same config emits ``x_1 .. x_K`` with
``x_k ~ p(. | prompt + x_<k)``, the target's logits after ``prompt + x_<k`` processed by the real
``LogitsProcessorList`` that ``generate()`` builds, and stops after an EOS token. So, per case:

- *stopping* (exact): exactly ``K`` tokens unless the last one is EOS, and nothing after an EOS;
- *support* (exact): no emitted token has target probability 0 given its prefix;
- *conditional law at every position* ``k = 1..K``: among samples that emitted ``k`` tokens, group
  them by their exact law ``p(. | prompt + x_<k)`` and test the groups with :func:`~.stats.law_test`.
  The ``K`` position tests are combined by Bonferroni into the case's p-value.

Together the conditionals are the joint law of the first ``K`` tokens (with stopping). Targets: the
fixed-logits stubs of a :class:`~.scenarios.Scenario` (law from the table), or a randomly initialised
tiny Llama (:class:`TinyLlamaScenario`; law from running the target on each observed prefix).

Samples come in the engine's seeded chunks, so results do not depend on ``--workers``. The
real loop drafts one sequence at a time: generate mode is never batched.
"""

from __future__ import annotations

import copy
import inspect
import time
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np
import torch

from ..adapters import DraftContext
from ..adapters.assisted import assistant_for, constant_drafts
from ..analysis import position_tests
from ..engine import guarded, run_in_chunks
from ..errors import GeneratorFailure
from ..expected import ExactLaws
from ..results import Case, CaseResult, one_line
from ..stats import Stratum
from ..stubs import fixed_logits_lm
from ..warpers import capture_processors

#: Laws are functions of the generated prefix: ``law(prefix)`` is ``p(. | prompt + prefix)``.
Law = Callable[[tuple[int, ...]], np.ndarray]


@dataclass(frozen=True)
class TinyLlamaScenario:
    """A randomly initialised 2-layer Llama target and a noisy copy of it as drafter (see :func:`tiny_llama_pair`)."""

    name: str = "tiny-llama"
    seed: int = 0
    vocab_size: int = 8
    prompt: tuple[int, ...] = (3, 1, 4)
    gamma: int = 3


TINY_LLAMA = TinyLlamaScenario()


def tiny_llama_pair(seed: int, vocab_size: int = 8, drafter_noise: float = 0.1):
    """``(target, drafter)``: seeded, randomly initialised 2-layer ``LlamaForCausalLM`` models (hidden 16).

    Weights are drawn with ``initializer_range=0.5`` so that next-token laws are far from uniform and
    depend on the context. The drafter is another Llama of the same shape whose weights are the
    target's plus Gaussian noise of scale ``drafter_noise``: it agrees with the target often enough
    that rounds accept several drafts, and disagrees often enough that rejections happen. No BOS,
    EOS or pad token is set; EOS cases pass ``eos_token_id`` as a warper. The global torch RNG is left
    as it was.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, initializer_range=0.5, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        target = LlamaForCausalLM(config).eval()
        drafter = copy.deepcopy(target)
        with torch.no_grad():
            for weight in drafter.parameters():
                weight.add_(drafter_noise * torch.randn_like(weight))
    return target, drafter


@dataclass
class GenerateCaseResult(CaseResult):
    """A generate-mode case: :class:`~lossless_check.results.CaseResult` plus what the loop did."""

    max_new_tokens: int = 0
    mean_rounds: float | None = None  # target forward passes per generate() call
    mean_new_tokens: float | None = None
    stopping_violations: int = 0  # outputs plain sampling cannot produce (length / EOS rules)

    def explain(self) -> str:
        """The step-mode explanation plus the stopping check and what the loop did."""
        parts = [super().explain()]
        if self.stopping_violations:
            parts.append(f"{self.stopping_violations} outputs break the length/EOS rules of plain sampling")
        parts.append(f"{self.mean_rounds:.2f} rounds and {self.mean_new_tokens:.2f} tokens per generate() call")
        return "; ".join(parts)


@dataclass
class Generations:
    """What the generate() calls emitted. ``emitted[t, k]`` is -1 past the end of sample ``t``."""

    emitted: np.ndarray
    rounds: np.ndarray
    stopping_violations: int
    seconds: float

    @classmethod
    def concatenate(cls, parts: list["Generations"]) -> "Generations":
        return cls(np.concatenate([p.emitted for p in parts]), np.concatenate([p.rounds for p in parts]),
                   sum(p.stopping_violations for p in parts), sum(p.seconds for p in parts))


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
            logits = self.processors(history, logits)
        probs = torch.softmax(logits, dim=-1)[0].numpy()
        probs.setflags(write=False)
        return probs


def _driving(target, generator_class):
    """``target``, rebuilt as a subclass whose ``generate()`` drafts with ``generator_class``.

    The installed ``AssistedCandidateGenerator`` itself is left to ``generate()`` to pick. A subclass
    is built with the arguments ``generate()`` hands to its candidate-generator factory, the way the
    factory builds the base class.
    """
    from transformers import GenerationMixin
    from transformers.generation.candidate_generator import AssistedCandidateGenerator

    if generator_class is AssistedCandidateGenerator:
        return target
    signature = inspect.signature(GenerationMixin._get_candidate_generator)

    def _get_candidate_generator(self, *args, **kwargs):
        given = signature.bind(self, *args, **kwargs).arguments
        return generator_class(
            input_ids=given["input_ids"],
            assistant_model=given["assistant_model"],
            generation_config=given["generation_config"],
            model_kwargs=given["model_kwargs"],
            inputs_tensor=given["inputs_tensor"],
            logits_processor=given["logits_processor"],
        )

    cls = type(f"{type(target).__name__}Drafting{generator_class.__name__}", (type(target),),
               {"_get_candidate_generator": _get_candidate_generator})
    driving = cls(target.config).eval()
    driving.load_state_dict(target.state_dict())
    driving.generation_config = target.generation_config
    return driving


def _use_constant_drafts(drafter, gamma: int):
    # The "heuristic" schedule writes its draft length back into the drafter's generation config at
    # the end of generate(): samples would depend on each other. Constant length, no early stop.
    for key, value in constant_drafts(gamma).items():
        setattr(drafter.generation_config, key, value)


@dataclass
class _Setup:
    """The models, the generation config and the exact laws of one case."""

    target: object
    drafter: object
    prompt_ids: torch.LongTensor
    generation_config: object
    law: Law
    eos: frozenset[int]


def _eos_ids(config) -> frozenset[int]:
    eos = config.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset([eos] if isinstance(eos, int) else eos)


def _setup(case: Case, max_new_tokens: int) -> _Setup:
    from transformers import GenerationConfig

    scenario = case.scenario
    prompt_ids = torch.tensor([scenario.prompt], dtype=torch.long)
    if isinstance(scenario, TinyLlamaScenario):
        target, drafter = tiny_llama_pair(scenario.seed, scenario.vocab_size)
        _use_constant_drafts(drafter, scenario.gamma)
        processors, prepared = capture_processors(target, prompt_ids, case.warpers, max_new_tokens)
        law = _ModelLaws(target, scenario.prompt, processors).target
    else:
        target = fixed_logits_lm(scenario.target, prompt_length=len(scenario.prompt))
        processors, prepared = capture_processors(target, prompt_ids, case.warpers, max_new_tokens)
        drafter = assistant_for(DraftContext(scenario, case.generator.generator_class, prepared, processors, target,
                                             prompt_ids))
        law = ExactLaws(scenario, processors).target
    # The same config capture_processors gave generate(): the processors and laws above are its own.
    config = GenerationConfig(do_sample=True, max_new_tokens=max_new_tokens, **case.warpers)
    if case.generator.adapter.name == "PromptLookupCandidateGenerator":
        # generate() builds the prompt-lookup generator itself; drafts are n-grams of the sequence.
        config.prompt_lookup_num_tokens = scenario.gamma
        return _Setup(target, None, prompt_ids, config, law, _eos_ids(prepared))
    return _Setup(_driving(target, case.generator.generator_class), drafter, prompt_ids, config, law,
                  _eos_ids(prepared))


def stopping_violations(tokens: list[int], max_new_tokens: int, eos: frozenset[int]) -> int:
    """1 if ``tokens`` is not a possible output of plain sampling (length and EOS rules), else 0."""
    if len(tokens) > max_new_tokens or any(t in eos for t in tokens[:-1]):
        return 1
    if len(tokens) < max_new_tokens and (not tokens or tokens[-1] not in eos):
        return 1
    return 0


def collect(setup: _Setup, samples: int, max_new_tokens: int, seed: int,
            progress: Callable[[int], None] | None = None) -> Generations:
    """Call ``generate()`` ``samples`` times; count target forward passes (one per round)."""
    forwards = [0]
    hook = setup.target.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    emitted = np.full((samples, max_new_tokens), -1, dtype=np.int64)
    rounds = np.zeros(samples, dtype=np.int64)
    violations = 0
    prompt_length = setup.prompt_ids.shape[1]
    torch.manual_seed(seed)
    started = time.perf_counter()
    try:
        with torch.no_grad():
            for t in range(samples):
                before = forwards[0]
                try:
                    out = setup.target.generate(setup.prompt_ids, assistant_model=setup.drafter,
                                                generation_config=setup.generation_config)
                except Exception as exc:  # noqa: BLE001 - the generator under test (or the loop) failed
                    raise GeneratorFailure(f"generate() raised {one_line(exc)}") from exc
                tokens = out[0, prompt_length:].tolist()
                violations += stopping_violations(tokens, max_new_tokens, setup.eos)
                emitted[t, : min(len(tokens), max_new_tokens)] = tokens[:max_new_tokens]
                rounds[t] = forwards[0] - before
                if progress is not None:
                    progress(1)
    finally:
        hook.remove()
    return Generations(emitted, rounds, violations, time.perf_counter() - started)


def position_strata(emitted: np.ndarray, position: int, law: Law, eos: frozenset[int]) -> list[Stratum]:
    """Strata for output position ``position`` (0-based): samples that reached it, grouped by exact law.

    Samples whose prefix holds an EOS are left out: plain sampling never gets there, and the
    stopping check already counts them.
    """
    prefixes = defaultdict(list)
    for row in emitted[emitted[:, position] >= 0, : position + 1]:
        prefix = tuple(int(x) for x in row[:position])
        if not eos.intersection(prefix):
            prefixes[prefix].append(int(row[position]))
    groups: dict[bytes, list] = {}
    for prefix, tokens in prefixes.items():
        probs = law(prefix)
        entry = groups.setdefault(probs.tobytes(), [probs, np.zeros(len(probs), dtype=np.int64)])
        entry[1] += np.bincount(tokens, minlength=len(probs))
    return [Stratum(counts, probs) for probs, counts in groups.values()]


def analyse(case: Case, setup: _Setup, gens: Generations, alpha_case: float) -> GenerateCaseResult:
    """Statistics and verdict of one generate-mode case at its share ``alpha_case`` of the family rate."""
    max_new_tokens = gens.emitted.shape[1]
    result = GenerateCaseResult(case.generator.display_name, case.warper_spec, "generate", case.scenario.name,
                                max_new_tokens=max_new_tokens)
    result.samples = len(gens.rounds)
    result.seconds = gens.seconds
    result.samples_per_second = result.samples / gens.seconds if gens.seconds > 0 else None
    result.alpha_case = alpha_case
    result.mean_rounds = float(gens.rounds.mean())
    result.mean_new_tokens = float((gens.emitted >= 0).sum(axis=1).mean())
    result.stopping_violations = gens.stopping_violations
    strata = [position_strata(gens.emitted, k, setup.law, setup.eos) for k in range(max_new_tokens)]
    violations = position_tests(result, strata, alpha_case)
    if gens.stopping_violations:
        result.failed_checks.append("stopping")
    result.exact_failure = bool(violations or gens.stopping_violations)
    result.verdict = "not_lossless" if (result.exact_failure or result.p_value <= alpha_case) else "lossless"
    result.reason = result.explain()
    return result


def skip_reason(case: Case) -> str | None:
    """Why generate mode cannot drive this case's generator (``None`` if it can)."""
    generator = case.generator
    if generator.generator_class is None:
        return f"{generator.adapter.name} is not in the installed transformers"
    name = generator.adapter.name
    builtin_lookup = name == "PromptLookupCandidateGenerator" and generator.generator_class.__module__.startswith(
        "transformers.")
    if name != "AssistedCandidateGenerator" and not builtin_lookup:
        return (f"generate mode drives the assistant_model and prompt-lookup paths (built-in prompt lookup only), "
                f"not {generator.display_name}")
    return None


def run_generate_case(case: Case, samples: int, seed: int, alpha_case: float, sequential: bool = False,
                      timeout: float = 600.0) -> CaseResult:
    """Run and analyse one case through the real ``generate()`` loop (``case.max_new_tokens`` tokens a call).

    ``case.scenario`` is a fixed-logits :class:`~lossless_check.scenarios.Scenario` or a
    :class:`TinyLlamaScenario`; ``case.warpers`` are ``GenerationConfig`` keywords (``eos_token_id``
    among them for EOS cases). Supported generators: ``AssistedCandidateGenerator`` (which
    ``generate()`` picks itself for ``assistant_model=``) and its subclasses (wired in through
    ``_get_candidate_generator``), and the built-in ``PromptLookupCandidateGenerator``
    (``prompt_lookup_num_tokens=gamma``); other families are ``skipped``. Generator failures give
    verdict ``error``. Generate mode is a fixed-sample test (``sequential`` is ignored).

    Assumptions: the ``samples`` calls are independent (each ``generate()`` builds a fresh candidate
    generator; the drafter uses a constant draft length). Then, for a lossless loop, the case is
    flagged ``not_lossless`` with probability at most ``alpha_case`` (exact checks never fail).
    ``tv_detectable`` (position 1; every position in ``positions``) is the sample-weighted TV the
    position's test detects with probability ``POWER``; later positions have fewer samples and, with
    history-dependent laws, more strata, hence less power. The verdict here is at ``alpha_case``;
    :func:`~lossless_check.results.decide` re-decides it across a run's cases.
    """
    reason = skip_reason(case)
    if reason is not None:
        return GenerateCaseResult(case.generator.display_name, case.warper_spec, "generate", case.scenario.name,
                                  verdict="skipped", reason=reason, max_new_tokens=case.max_new_tokens)

    def run() -> CaseResult:
        setup = _setup(case, case.max_new_tokens)
        return run_in_chunks(
            case, samples, seed, False, timeout,
            lambda chunk, size, chunk_seed: collect(setup, size, case.max_new_tokens, chunk_seed),
            lambda parts, final: analyse(case, setup, Generations.concatenate(parts), alpha_case))

    result = guarded(case, run)
    if not isinstance(result, GenerateCaseResult):
        result = GenerateCaseResult(**result.__dict__, max_new_tokens=case.max_new_tokens)
    return result


__all__ = ["GenerateCaseResult", "TINY_LLAMA", "TinyLlamaScenario", "run_generate_case", "skip_reason",
           "tiny_llama_pair"]
