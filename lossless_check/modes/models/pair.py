"""One row of ``lossless-check models``: a generator family on the user's pair under one warper stack.

Three checks, in the real ``generate()`` of the installed release (``do_sample=True`` unless said):

1. **Exact** (:mod:`.drafting`): every drafting round's returned q against the law its drafts were
   drawn from. No statistics; applies to generators that return candidate logits.
2. **Statistical**: every emitted token ``x_t`` against the target's processed law ``p_t`` at its own
   prefix: one forward pass of the target over the output (no cache), processed by the very
   ``LogitsProcessorList`` ``generate()`` builds for the stack (:func:`~lossless_check.laws.warpers.capture_processors`).
   The test is :class:`~lossless_check.stats.betting.BettingState` (anytime-valid, aimed at q, the
   drafter's processed law at the same prefix from one forward pass of the assistant). The calls stop at
   its first rejection. Its power on the laws met is measured (:class:`~lossless_check.stats.betting.PowerSimulation`).
3. **Greedy**: ``do_sample=False`` speculative decoding returns plain greedy decoding's tokens.

Figures: per emitted position, ``TV(p_t, q_t)`` (how far drafter and target disagree) and the TV to
``p_t`` of the law a round's *first* emitted token would follow if the verifier were handed the
drafter's raw logits while drafts follow its processed law (the seed bug class):
``r = qs min(1, p/qc) + (1 - sum qs min(1, p/qc)) norm(max(0, p - qc))``, ``qs`` the processed and
``qc = softmax(raw)`` the returned law. The correct algorithm (``qc = qs``) gives ``r = p`` exactly.
The test also bets on ``r`` itself (:mod:`~lossless_check.stats.betting`): the bug class the project
started from, aimed at directly; computed from the laws at the prefix, so validity is untouched.
"""

from __future__ import annotations

import copy
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from lossless_check.core.compat import release_warpers
from lossless_check.core.errors import PlainSamplingFails
from lossless_check.evidence.results import one_line
from lossless_check.laws.expected import processed
from lossless_check.laws.warpers import capture_processors, format_warpers
from lossless_check.modes.loop_models import ASSISTED, PROMPT_LOOKUP, driving, installed_class
from lossless_check.modes.models.drafting import DraftingRecord, intercepting
from lossless_check.stats.betting import BettingState, PowerSimulation

#: Families a model pair drives: the assistant model itself, and prompt lookup (no drafter model).
FAMILIES = (ASSISTED, PROMPT_LOOKUP)
#: Prompt lookup's draft length (generate()'s ``prompt_lookup_num_tokens``).
PROMPT_LOOKUP_TOKENS = 4
#: Greedy comparisons per row (the first prompts).
GREEDY_PROMPTS = 4
#: Options that act on sampling only: left out of the greedy comparison's config.
SAMPLING_ONLY = ("temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")


@dataclass
class PairRow:
    """The verdict of one generator under one warper stack on the pair."""

    generator: str
    warpers: str
    verdict: str = "lossless"  # lossless | not_lossless | error | skipped
    reason: str = ""
    exact: dict = field(default_factory=dict)
    statistical: dict = field(default_factory=dict)
    greedy: dict = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        """A case of the JSON report (``samples``: the tokens the statistical test saw)."""
        return {"generator": self.generator, "warpers": self.warpers, "mode": "models", "verdict": self.verdict,
                "samples": self.statistical.get("tokens", 0), "reason": self.reason, "exact": self.exact,
                "statistical": self.statistical, "greedy": self.greedy, "seconds": self.seconds}


class _Laws:
    """Processed next-token laws of a model after every prefix of one output (one forward pass)."""

    def __init__(self, model, processors):
        self.model, self.processors = model, processors

    @torch.no_grad()
    def __call__(self, full: torch.Tensor, prompt_length: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The processed laws and the raw ones (softmax of the logits), one per emitted position."""
        n = full.shape[1] - prompt_length
        logits = self.model(full, use_cache=False).logits[0, prompt_length - 1:prompt_length - 1 + n].float()
        laws, raw = [], []
        for t in range(n):
            row = logits[t:t + 1]
            raw.append(torch.softmax(row[0].double(), dim=-1).cpu().numpy())
            if len(self.processors) > 0:
                row = processed(self.processors, full[:, :prompt_length + t], row.clone())
            laws.append(torch.softmax(row[0].double(), dim=-1).cpu().numpy())
        return laws, raw


def raw_logits_law(p: np.ndarray, q_sampled: np.ndarray, q_claimed: np.ndarray) -> np.ndarray:
    """The law of a round's first emitted token when drafts follow ``q_sampled`` and the verifier is given
    ``q_claimed`` (module docstring); ``p`` itself when they are equal."""
    accepted = q_sampled * np.minimum(1.0, p / np.maximum(q_claimed, 1e-300))
    residual = np.maximum(0.0, p - q_claimed)
    return accepted + (1.0 - accepted.sum()) * (residual / residual.sum() if residual.sum() > 0 else 0.0)


def _quantiles(values: list[float]) -> dict:
    if not values:
        return {"median": None, "p95": None, "positions": 0}
    return {"median": float(np.median(values)), "p95": float(np.quantile(values, 0.95)), "positions": len(values)}


def _routing(family: str, target, assistant, generator_class, config) -> tuple[object, dict]:
    """The target (the class under test wired in where generate() builds its family) and generate() kwargs."""
    kwargs = {"assistant_model": assistant}
    if family == PROMPT_LOOKUP:
        kwargs = {}
        config.prompt_lookup_num_tokens = PROMPT_LOOKUP_TOKENS
    base = installed_class(family)
    if generator_class is not base:
        target = driving(copy.copy(target), generator_class, base)  # a shallow copy: the user's model is untouched
    return target, kwargs


def check_row(target, assistant, resolved, stack: dict, prompts: list[list[int]], max_new_tokens: int, samples: int,
              alpha: float, seed: int) -> PairRow:
    """Run the three checks of one generator (a :class:`~lossless_check.subjects.adapters.ResolvedGenerator`) under
    ``stack``; ``samples`` is the most sampling ``generate()`` calls (cycling through ``prompts``), ``alpha``
    the statistical test's share of the family-wise rate."""
    from transformers import GenerationConfig

    started = time.perf_counter()
    family = resolved.adapter.name
    row = PairRow(resolved.display_name, format_warpers(stack))
    if resolved.generator_class is None:
        row.verdict, row.reason = "skipped", f"{family} is not in the installed transformers"
        return row
    device = next(target.parameters()).device
    processors_by_length: dict[int, object] = {}

    def processors_for(length: int):
        if length not in processors_by_length:
            probe_prompt = torch.zeros((1, length), dtype=torch.long)
            processors_by_length[length] = capture_processors(target, probe_prompt, stack, max_new_tokens)[0]
        return processors_by_length[length]

    config = GenerationConfig(do_sample=True, max_new_tokens=max_new_tokens, **release_warpers(stack))
    routed, kwargs = _routing(family, target, assistant, resolved.generator_class, config)
    vocab = (assistant if family == ASSISTED else target).get_output_embeddings().weight.shape[0]
    record = DraftingRecord()
    watched = intercepting(routed, vocab, record)
    bet = BettingState.start()
    power = PowerSimulation(alpha, seed)
    bug_tv: list[float] = []
    tv_pq: list[float] = []
    try:
        with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device]), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for i in range(samples):
                torch.manual_seed(seed * 1_000_003 + i)
                prompt = prompts[i % len(prompts)]
                ids = torch.tensor([prompt], dtype=torch.long, device=device)
                try:
                    with torch.no_grad():
                        full = watched.generate(ids, generation_config=copy.deepcopy(config), **kwargs)
                except Exception as exc:  # noqa: BLE001 - the generator under test (or the loop) failed
                    row.verdict, row.reason = "error", f"generate() raised {one_line(exc)}"
                    row.exact = record.to_dict()
                    return row
                processors = processors_for(len(prompt))
                p_laws, _ = _Laws(target, processors)(full, len(prompt))
                q_laws, q_raw = _Laws(assistant, processors)(full, len(prompt))
                emitted = full[0, len(prompt):].tolist()
                for x, p, q, qc in zip(emitted, p_laws, q_laws, q_raw):
                    aimed = raw_logits_law(p, q, qc)
                    bet.update(p, q, aimed, x, alpha)
                    power.observe(p, q, aimed)
                    bug_tv.append(0.5 * float(np.abs(aimed - p).sum()))
                    tv_pq.append(0.5 * float(np.abs(p - q).sum()))
                if bet.rejected_at is not None or bet.support_violations:
                    break
    except PlainSamplingFails as exc:  # the installed processors themselves fail on a history
        row.verdict, row.reason = "skipped", str(exc)
        return row
    row.exact = record.to_dict()
    row.statistical = {
        "test": "betting e-process toward q (anytime-valid, Ville)", "alpha": alpha, "tokens": bet.tokens,
        "calls": i + 1, "log_evalue": bet.log_evalue, "max_log_evalue": bet.max_log_evalue,
        "rejected_at_token": bet.rejected_at, "support_violations": bet.support_violations,
        "tv_target_drafter": _quantiles(tv_pq), "tv_raw_logits_bug_first_position": _quantiles(bug_tv),
        "power": power.summary(),
    }
    row.greedy = greedy_equivalence(routed, kwargs, stack, prompts[:GREEDY_PROMPTS], max_new_tokens, family)
    _decide(row, record, bet)
    row.seconds = time.perf_counter() - started
    return row


def greedy_equivalence(target, kwargs: dict, stack: dict, prompts: list[list[int]], max_new_tokens: int,
                       family: str) -> dict:
    """``do_sample=False`` speculative decoding against plain greedy decoding, token for token."""
    from transformers import GenerationConfig

    device = next(target.parameters()).device
    greedy_stack = {k: v for k, v in stack.items() if k not in SAMPLING_ONLY}
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, **release_warpers(greedy_stack))
    speculative_config = copy.deepcopy(config)
    if family == PROMPT_LOOKUP:
        speculative_config.prompt_lookup_num_tokens = PROMPT_LOOKUP_TOKENS
    differences = []
    for prompt in prompts:
        ids = torch.tensor([prompt], dtype=torch.long, device=device)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            plain = target.generate(ids, generation_config=copy.deepcopy(config))[0, len(prompt):].tolist()
            try:
                speculative = target.generate(ids, generation_config=copy.deepcopy(speculative_config),
                                              **kwargs)[0, len(prompt):].tolist()
            except Exception as exc:  # noqa: BLE001
                speculative = one_line(exc)
        if speculative != plain:
            differences.append({"prompt": prompt, "speculative": speculative, "plain": plain})
    return {"warpers": format_warpers(greedy_stack), "comparisons": len(prompts), "differ": len(differences),
            "first_difference": differences[0] if differences else None}


def _decide(row: PairRow, record: DraftingRecord, bet: BettingState) -> None:
    failures = []
    if record.verdict == "inconsistent":
        failures.append(f"exact: {record.reason()}")
    if bet.support_violations:
        failures.append(f"statistical: {bet.support_violations} emitted token(s) have probability 0 under the "
                        f"target's processed law")
    if bet.rejected_at is not None:
        failures.append(f"statistical: the e-value reached 1/alpha after {bet.rejected_at} tokens")
    if row.greedy.get("differ"):
        failures.append(f"greedy: {row.greedy['differ']} of {row.greedy['comparisons']} outputs differ from plain "
                        f"greedy decoding")
    power = next(r for r in row.statistical["power"]
                 if r["contamination"] == 0.25 and r["fraction_of_positions"] == 1.0)
    statistical = (f"statistical: no rejection in {bet.tokens} tokens (log E {bet.log_evalue:.3g}; a departure "
                   f"toward q of per-position TV {power['median_tv_at_hit_positions']:.3g} would be caught with "
                   f"probability "
                   f"{power['power']:.2f})") if bet.rejected_at is None and not bet.support_violations else ""
    if failures:
        row.verdict, row.reason = "not_lossless", "; ".join(failures + ([statistical] if statistical else []))
        return
    row.reason = (f"exact: {record.reason()}; {statistical}; "
                  f"greedy: identical in {row.greedy['comparisons']} comparisons")
