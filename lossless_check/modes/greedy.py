"""Greedy mode: with ``do_sample=False`` speculative decoding must return plain greedy decoding's tokens, exactly.

A case is one generator (and a base warper stack, usually none) on one scenario. It builds the
generate-mode models of the family once (:func:`~.generate._setup`: the models, ``generate()``
arguments and config fields that make the installed ``generate()`` build the family itself) and,
for every *greedy stack* (:func:`greedy_stacks`: no processor, each processor that applies to
greedy decoding alone, and every pair of them), several prompts and several lengths, compares

- ``target.generate(prompt, generation_config=config, **routing kwargs)`` with ``do_sample=False``
  (speculative decoding: the generator drafts, the target keeps the drafts equal to its argmax), and
- ``target.generate(prompt, generation_config=config without the routing fields)``: plain greedy
  decoding, same target, same config, no drafter.

They must be equal token for token. There is no sampling, so the check is exact: no statistics, no
share of the run's alpha; the first differing stack, prompt, position and tokens are the reason.

**What can differ.** With ``do_sample=False`` ``_assisted_decoding`` keeps a draft only when it is
the argmax of the target's processed logits at its position, so a wrong draft costs speed, never
tokens. Output differs only through the loop: target logits computed on the wrong history (cache
cropped wrongly, stale cache positions: 4.39-4.40 with a real model), processors applied to the wrong
``input_ids`` or changed by the generator (they are the target's own list), tokens kept past
``max_length`` or EOS (prompt lookup 5.0-5.13), candidates that do not extend ``input_ids``.

**Informative.** A case can only see the first two kinds where the processed target's argmax depends
on the history. So at every position the reference reaches, the argmax after the true history is
compared with the argmax after its *neighbours* (the last token replaced by each other token, the
last token dropped): a position is informative when one differs. A case with no informative
position, or whose generator proposed no draft at all, is ``vacuous`` (only the length and EOS
rules could have failed), never ``lossless``. Fixed-logits i.i.d. tables with history-free stacks
are vacuous; ``markov8`` and the tiny Llamas are not.
"""

from __future__ import annotations

import copy
import itertools
import time
import warnings
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Callable

import numpy as np
import torch

from lossless_check.core.compat import release_warpers
from lossless_check.core.errors import PlainSamplingFails, Timeout
from lossless_check.evidence.results import Case, CaseResult, one_line
from lossless_check.laws.matrix import EOS
from lossless_check.laws.warpers import capture_processors, format_warpers
from lossless_check.running.chunks import deadline, guarded

#: The catalog options that change greedy decoding (the sampling warpers do not apply to it).
GREEDY_OPTIONS = ("repetition_penalty", "no_repeat_ngram_size", "bad_words_ids", "sequence_bias", "suppress_tokens",
                  "min_new_tokens", "exponential_decay_length_penalty")
#: Values that must change the *argmax*, where the catalog's were chosen to change a law. ``markov8``'s
#: greedy path is the cycle 2, 4, 2, ... and EOS (token 5) is never its argmax: ``min_new_tokens=2``
#: changes nothing there, while 5 does beside the length penalty (EOS at position 4 without it).
#: ``no_repeat_ngram_size=1`` bans every token once used: past 8 tokens every logit is -inf.
GREEDY_VALUES = {"min_new_tokens": {"min_new_tokens": 5, "eos_token_id": EOS},
                 "no_repeat_ngram_size": {"no_repeat_ngram_size": 2}}
#: Prompts per stack (the scenario's own, then seeded ones of the same length).
PROMPTS = 4
#: ``max_new_tokens`` of the comparisons: below, at and past a round of ``gamma + 1`` tokens.
LENGTHS = (2, 5, 8, 11)


def greedy_stacks(base: dict[str, Any], pairs: bool = True) -> list[dict[str, Any]]:
    """``base``, then ``base`` plus each greedy processor of the catalog alone, then (``pairs``) plus every
    pair of them.

    The catalog values (:data:`~lossless_check.laws.matrix.CATALOG`), or :data:`GREEDY_VALUES`: min length
    and the exponential decay come with their EOS token (:data:`~lossless_check.laws.matrix.EOS`), so those
    stacks stop at EOS too.
    """
    from lossless_check.laws.matrix import available_catalog

    entries = [GREEDY_VALUES.get(e.option, e.kwargs) for e in available_catalog() if e.option in GREEDY_OPTIONS]
    stacks = [{}] + entries + ([{**a, **b} for a, b in itertools.combinations(entries, 2)] if pairs else [])
    return [{**base, **stack} for stack in stacks]


def skip_reason(case: Case) -> str | None:
    """Why greedy mode cannot drive this case (``None`` if it can): generate mode's reasons
    (:func:`~.generate.skip_reason`), and Universal, which ``generate()`` builds for sampling only."""
    from lossless_check.modes import loop_models
    from lossless_check.modes.generate import skip_reason as generate_skip

    if case.generator.adapter.name == loop_models.UNIVERSAL:
        return (f"generate() builds {loop_models.UNIVERSAL} for do_sample=True only; greedy decoding with two "
                f"tokenizers gets {loop_models.DIFFERENT_TOKENIZERS} (its own greedy row)")
    return generate_skip(replace(case, mode="generate"))


@dataclass
class Comparison:
    """One speculative ``generate()`` call and its plain greedy reference."""

    stack: dict[str, Any]
    prompt: tuple[int, ...]
    max_new_tokens: int
    speculative: list[int] | str  # a str: what the speculative call raised (plain decoding did not)
    plain: list[int]
    informative: int  # reference positions where the argmax depends on the history
    positions: int

    @property
    def raised(self) -> bool:
        return isinstance(self.speculative, str)

    @property
    def first_difference(self) -> int | None:
        """The first output position (1-based) where the two differ, in token or in length; ``None``: equal
        (or the speculative call raised)."""
        if self.raised or self.speculative == self.plain:
            return None
        return next((j + 1 for j, (a, b) in enumerate(zip(self.speculative, self.plain)) if a != b),
                    min(len(self.speculative), len(self.plain)) + 1)

    def describe(self) -> str:
        j = self.first_difference
        token = lambda tokens: str(tokens[j - 1]) if j <= len(tokens) else "nothing (stopped)"  # noqa: E731
        return (f"[{format_warpers(self.stack)}] prompt {list(self.prompt)}, max_new_tokens={self.max_new_tokens}: "
                f"at position {j} speculative decoding emits {token(self.speculative)}, plain greedy decoding "
                f"{token(self.plain)} (speculative {self.speculative}, plain {self.plain})")


class _Argmax:
    """The argmax of the target's processed logits after a whole history (prompt included), as plain
    greedy decoding takes it: float32 logits through the stack's ``LogitsProcessorList``, first index on ties."""

    def __init__(self, logits_of: Callable[[tuple[int, ...]], torch.Tensor], processors):
        self.logits_of = logits_of
        self.processors = processors
        self.after = lru_cache(maxsize=None)(self._argmax)

    def _argmax(self, history: tuple[int, ...]) -> int:
        from lossless_check.laws.expected import processed

        logits = self.logits_of(history).to(torch.float32)[None]
        if len(self.processors) > 0:
            logits = processed(self.processors, torch.tensor([history], dtype=torch.long), logits)
        return int(torch.argmax(logits[0]))

    def informative(self, history: tuple[int, ...], vocab_size: int) -> bool:
        """Whether a neighbour of ``history`` (its last token replaced, or dropped) has another argmax."""
        here = self.after(history)
        neighbours = [history[:-1] + (t,) for t in range(vocab_size) if t != history[-1]]
        if len(history) > 1:
            neighbours.append(history[:-1])
        return any(self.after(h) != here for h in neighbours)


def _logits_source(case: Case, prompt_length: int, target) -> Callable[[tuple[int, ...]], torch.Tensor]:
    """The target's next-token logits after a history: the scenario's table for the stubs, a forward
    pass (no cache) for a real model."""
    from lossless_check.modes.tiny_llama import TinyLlamaScenario

    if isinstance(case.scenario, TinyLlamaScenario):
        @lru_cache(maxsize=None)  # a forward pass per history, shared by every stack
        @torch.no_grad()
        def forward(history):
            return target(torch.tensor([history], dtype=torch.long), use_cache=False).logits[0, -1]

        return forward
    table = case.scenario.target
    return lambda history: table.emitted(len(history) - prompt_length, history[-1])


def prompts_for(case: Case, seed: int) -> list[tuple[int, ...]]:
    """The scenario's prompt, then :data:`PROMPTS` - 1 seeded prompts of its length (the stubs' tables
    are indexed from the end of a prompt of that length)."""
    prompt = tuple(case.scenario.prompt)
    rng = np.random.default_rng([seed, 20261204])
    drawn = [tuple(int(t) for t in rng.integers(0, case.scenario.vocab_size, len(prompt))) for _ in range(PROMPTS - 1)]
    return [prompt] + drawn


def compare(case: Case, seed: int, timeout: float = 600.0) -> tuple[list[Comparison], dict]:
    """Every comparison of a case, and what the loop did: ``{"calls", "rounds", "drafted", "accepted"}``
    (over the speculative calls that returned).

    Prompt ``i`` of stack ``s`` runs at length ``LENGTHS[(i + s) % len(LENGTHS)]``: every stack meets
    every length, every prompt every length across stacks. A speculative call that raises is kept
    as its one-line error (plain greedy decoding of the same call did not raise: it runs first).
    """
    from transformers import GenerationConfig

    from lossless_check.modes.generate import _setup
    from lossless_check.modes.tiny_llama import TinyLlamaScenario
    from lossless_check.subjects.adapters.mtp import _quiet_loading

    setup = _setup(replace(case, mode="generate"), max(LENGTHS))
    defaults = GenerationConfig()
    prompts = prompts_for(case, seed)
    prompt_length = len(prompts[0])
    loop = {"calls": 0, "rounds": 0, "drafted": 0, "accepted": 0}
    seen = {"first": True, "rounds": 0, "drafted": 0}

    def count(module, args, kwargs, output):
        # A verification pass gets the uncached tokens: the prompt and the drafts at first, then the
        # last emitted token and the drafts.
        if not setup.counts_round():
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        width = ids.shape[1] if ids is not None else 1
        seen["drafted"] += width - (prompt_length if seen["first"] else 1)
        seen["rounds"] += 1
        seen["first"] = False

    base = setup.generation_config
    model = setup.target
    real_model = isinstance(case.scenario, TinyLlamaScenario)
    plain_model = model if real_model else _plain_stub(case, prompt_length)
    logits_of = _logits_source(case, prompt_length, model)
    comparisons = []
    # A real model costs a forward pass per history: its pairs are left to the fixed-logits scenarios.
    for s, stack in enumerate(greedy_stacks(case.warpers, pairs=not real_model)):
        processors, _ = capture_processors(plain_model, torch.tensor([prompts[0]]), stack, max(LENGTHS),
                                           do_sample=False)
        argmax = _Argmax(logits_of, processors)
        for i, prompt in enumerate(prompts):
            length = LENGTHS[(i + s) % len(LENGTHS)]
            config = copy.deepcopy(base)
            for key, value in {**release_warpers(stack), "do_sample": False, "max_new_tokens": length}.items():
                setattr(config, key, value)
            reference = copy.deepcopy(config)
            for key in setup.routing:
                if key != "do_sample":
                    setattr(reference, key, getattr(defaults, key))
            ids = torch.tensor([prompt], dtype=torch.long)
            # generate() warns of min_new_tokens past max_new_tokens (the short lengths): both calls alike.
            # _quiet_loading: MTP's generator loads its layers (from_pretrained) at every generate() call.
            with torch.no_grad(), deadline(timeout, "a greedy comparison"), warnings.catch_warnings(), _quiet_loading():
                warnings.simplefilter("ignore", UserWarning)
                try:
                    plain = model.generate(ids, generation_config=reference)[0, prompt_length:].tolist()
                except Exception as exc:  # noqa: BLE001 - the installed plain decoding fails: no reference
                    raise PlainSamplingFails(f"plain greedy decoding raises {one_line(exc)} under "
                                             f"[{format_warpers(stack)}], prompt {list(prompt)}") from None
                seen.update(first=True, rounds=0, drafted=0)
                hook = model.register_forward_hook(count, with_kwargs=True)
                try:
                    speculative = model.generate(ids, generation_config=config,
                                                 **setup.generate_kwargs)[0, prompt_length:].tolist()
                except Timeout:
                    raise
                except Exception as exc:  # noqa: BLE001 - the generator under test (or the loop) failed
                    speculative = one_line(exc)
                finally:
                    hook.remove()
            loop["calls"] += 1
            if isinstance(speculative, list):
                loop["rounds"] += seen["rounds"]
                loop["drafted"] += seen["drafted"]
                # Each round emits its accepted drafts and one token of the target's own.
                loop["accepted"] += max(0, len(speculative) - seen["rounds"])
            informative = sum(argmax.informative(prompt + tuple(plain[:j]), case.scenario.vocab_size)
                              for j in range(len(plain)))
            comparisons.append(Comparison(stack, prompt, length, speculative, plain, informative, len(plain)))
    return comparisons, loop


def _plain_stub(case: Case, prompt_length: int):
    """The fixed-logits target (for capturing the processors ``generate()`` builds)."""
    from lossless_check.laws.stubs import fixed_logits_lm

    return fixed_logits_lm(case.scenario.target, prompt_length=prompt_length)


def run_greedy_case(case: Case, seed: int = 0, timeout: float = 600.0) -> CaseResult:
    """Greedy equivalence of one case: ``lossless`` when every comparison gives identical tokens,
    ``not_lossless`` at the first that differs, ``vacuous`` when no generator bug could have shown
    (module docstring), ``skipped`` (:func:`skip_reason`) or ``error`` (the speculative call raised).

    Exact: no statistics, no share of alpha (``alpha_case`` 0, no p-value). ``samples`` is the
    number of comparisons; ``greedy_equivalence`` holds what was compared and what the loop did.
    """
    result = case.result()
    reason = skip_reason(case)
    if reason is not None:
        result.verdict, result.reason = "skipped", reason
        return result

    def run() -> CaseResult:
        started = time.perf_counter()
        comparisons, loop = compare(case, seed, timeout)
        return _verdict(result, comparisons, loop, time.perf_counter() - started)

    return guarded(case, run)


def _verdict(result: CaseResult, comparisons: list[Comparison], loop: dict, seconds: float) -> CaseResult:
    stacks = list(dict.fromkeys(format_warpers(c.stack) for c in comparisons))
    differ = [c for c in comparisons if c.first_difference is not None]
    raised = [c for c in comparisons if c.raised]
    informative = sum(c.informative for c in comparisons)
    positions = sum(c.positions for c in comparisons)
    result.samples, result.seconds = len(comparisons), seconds
    result.samples_per_second = len(comparisons) / seconds if seconds > 0 else None
    result.alpha_case = 0.0
    facts = result.greedy_equivalence = {
        "exact": True, "stacks": stacks, "prompts": [list(p) for p in dict.fromkeys(c.prompt for c in comparisons)],
        "lengths": sorted({c.max_new_tokens for c in comparisons}), "comparisons": len(comparisons),
        "differing": len(differ), "differing_stacks": list(dict.fromkeys(format_warpers(c.stack) for c in differ)),
        "raised": len(raised), "informative_positions": informative, "positions": positions,
        **loop}
    pairs = " and in pairs" if len(stacks) > len(GREEDY_OPTIONS) + 1 else ""
    what = (f"{len(comparisons)} comparisons with plain greedy decoding ({len(stacks)} stacks: none, "
            f"{len(GREEDY_OPTIONS)} processors alone{pairs}; {len(facts['prompts'])} prompts; max_new_tokens "
            f"{', '.join(map(str, facts['lengths']))}); {loop['drafted']} drafts proposed, {loop['accepted']} kept; "
            f"the argmax depends on the history at {informative} of {positions} positions; exact: no statistics, "
            "no share of alpha")
    errors = ""
    if raised:
        errors = (f"generate() raised in {len(raised)} of {len(comparisons)} comparisons (plain greedy decoding did "
                  f"not), first under [{format_warpers(raised[0].stack)}], prompt {list(raised[0].prompt)}, "
                  f"max_new_tokens={raised[0].max_new_tokens}: {raised[0].speculative}")
        facts["first_error"] = {"warpers": format_warpers(raised[0].stack), "prompt": list(raised[0].prompt),
                                "max_new_tokens": raised[0].max_new_tokens, "error": raised[0].speculative}
    if differ:
        first = differ[0]
        result.verdict, result.exact_failure, result.failed_checks = "not_lossless", True, ["greedy"]
        facts["first_difference"] = {"warpers": format_warpers(first.stack), "prompt": list(first.prompt),
                                     "max_new_tokens": first.max_new_tokens, "position": first.first_difference,
                                     "speculative": first.speculative, "plain": first.plain}
        result.reason = "; ".join(p for p in (
            f"greedy output differs from plain greedy decoding in {len(differ)} of {len(comparisons)} comparisons; "
            f"first: {first.describe()}", errors, what) if p)
    elif raised:
        result.verdict = "error"
        result.reason = f"{errors}; the other comparisons give identical tokens; {what}"
    elif loop["drafted"] == 0:
        result.verdict = "vacuous"
        result.reason = (f"the generator proposed no draft: speculative decoding was plain greedy decoding, no "
                         f"generator bug could show; {what}")
    elif informative == 0:
        result.verdict = "vacuous"
        result.reason = (f"the processed target's argmax does not depend on the history at any position reached: "
                         f"only the length and EOS rules were tested; {what}")
    else:
        result.verdict = "lossless"
        untested = ("" if loop["accepted"] < loop["drafted"]
                    else "; no draft was rejected (cropping after a rejection untested)")
        result.reason = f"identical tokens in all {what}{untested}"
    return result


__all__ = ["GREEDY_OPTIONS", "LENGTHS", "PROMPTS", "greedy_stacks", "run_greedy_case", "skip_reason"]
