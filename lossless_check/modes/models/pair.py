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
   A position whose ``top_k`` boundary lies within float rounding (:data:`BOUNDARY_TOLERANCE`) is not bet on:
   ``generate()``'s own forward pass may have drawn that boundary on the other side of a near-tie.
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
import math
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from lossless_check.core.compat import release_warpers
from lossless_check.core.errors import PlainSamplingFails
from lossless_check.laws.expected import processed
from lossless_check.modes.loop_models import ASSISTED, PROMPT_LOOKUP, driving, installed_class
from lossless_check.evidence.results import one_line
from lossless_check.stats.betting import COMPONENTS, BettingState, PowerSimulation, log_factors
from lossless_check.laws.warpers import capture_processors, format_warpers
from lossless_check.modes.models.drafting import DraftingRecord, intercepting

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


#: How close (times ``max(1, |logit|)``) the k-th and (k+1)-th largest logits may be before a ``top_k``
#: boundary is ambiguous: ``generate()`` computes the target's logits with its cache, several tokens per
#: pass, the harness in one pass without cache, and float rounding can swap two near-tied tokens, putting a
#: token in one support and not the other (a false exact failure). Measured on the tests' pair (float32,
#: V = 49,152, top_k=50): the two passes differ by at most 9e-5 at |logit| about 9 (1e-5 relative), and
#: 0.8% of positions have a boundary gap under 1e-4. The tolerances are 100x that for float32, and about
#: 10 units in the last place for half precision.
BOUNDARY_TOLERANCE = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 6e-2}


def top_k_ambiguous(row: torch.Tensor, k: int, relative: float) -> bool:
    """Whether the ``k``-th and ``(k+1)``-th largest of ``row`` lie within ``relative * max(1, |k-th|)``."""
    if k >= row.numel():
        return False
    values = torch.topk(row, k + 1).values
    kth, after = float(values[k - 1]), float(values[k])
    return math.isfinite(after) and kth - after <= relative * max(1.0, abs(kth))


class _Laws:
    """Processed next-token laws of a model after every prefix of one output (one forward pass)."""

    def __init__(self, model, processors):
        from transformers import LogitsProcessorList, TopKLogitsWarper

        self.model, self.processors = model, processors
        # The processors before top_k give the row its boundary is drawn on.
        at = next((i for i, p in enumerate(processors) if isinstance(p, TopKLogitsWarper)), None)
        self.top_k = None if at is None else (LogitsProcessorList(processors[:at]), processors[at].top_k)
        self.tolerance = BOUNDARY_TOLERANCE.get(model.dtype, BOUNDARY_TOLERANCE[torch.float32])

    @torch.no_grad()
    def __call__(self, full: torch.Tensor, prompt_length: int) -> tuple[list[np.ndarray], list[np.ndarray], list[bool]]:
        """The processed laws, the raw ones (softmax of the logits), and whether the top_k boundary is
        ambiguous (:func:`top_k_ambiguous`), one per emitted position."""
        n = full.shape[1] - prompt_length
        logits = self.model(full, use_cache=False).logits[0, prompt_length - 1:prompt_length - 1 + n].float()
        laws, raw, ambiguous = [], [], []
        for t in range(n):
            row, history = logits[t:t + 1], full[:, :prompt_length + t]
            raw.append(torch.softmax(row[0].double(), dim=-1).cpu().numpy())
            if self.top_k is not None:
                before, k = self.top_k
                boundary_row = processed(before, history, row.clone()) if len(before) else row
                ambiguous.append(top_k_ambiguous(boundary_row[0], k, self.tolerance))
            else:
                ambiguous.append(False)
            if len(self.processors) > 0:
                row = processed(self.processors, history, row.clone())
            laws.append(torch.softmax(row[0].double(), dim=-1).cpu().numpy())
        return laws, raw, ambiguous


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


def _routing(family: str, target, assistant, generator_class) -> tuple[object, dict]:
    """The target (the class under test wired in where generate() builds its family) and generate() kwargs."""
    kwargs = {} if family == PROMPT_LOOKUP else {"assistant_model": assistant}
    base = installed_class(family)
    if generator_class is not base:
        target = driving(copy.copy(target), generator_class, base)  # a shallow copy: the user's model is untouched
    return target, kwargs


@dataclass(frozen=True)
class RowSettings:
    """Everything one sampling ``generate()`` call of a row depends on (picklable: a task of the engine)."""

    target: str
    assistant: str
    device: str
    generator: str  # the spec resolve_generator takes
    stack: tuple  # the warper stack's items
    prompts: tuple
    max_new_tokens: int
    seed: int


@dataclass
class CallObservation:
    """What one sampling call gave: per emitted token its bet's log factors (``None``: outside the
    target's support) and its power-simulation step, its TV figures, and the call's drafting record."""

    record: DraftingRecord
    factors: list = field(default_factory=list)
    power_steps: list = field(default_factory=list)
    tv_pq: list = field(default_factory=list)
    bug_tv: list = field(default_factory=list)
    ambiguous: int = 0  # tokens at a top_k boundary float rounding may move (not bet on)
    error: str = ""  # generate() raised
    skipped: str = ""  # plain sampling itself fails under the stack


#: ``(settings, prompt length) -> processors``, per process: capture_processors builds a model from the config.
_PROCESSORS: dict = {}


def observe_call(settings: RowSettings, call: int) -> CallObservation:
    """Sampling call ``call`` of a row: a function of ``settings`` and ``call`` alone (its torch seed is
    ``seed * 1_000_003 + call``, its power stream ``default_rng([seed, 7, call])``), so it gives the same
    data in an engine worker as here."""
    from transformers import GenerationConfig

    from lossless_check.subjects.adapters import resolve_generator
    from lossless_check.modes.models.loading import load_pair

    target, assistant = load_pair(settings.target, settings.assistant, settings.device)
    resolved = resolve_generator(settings.generator)
    family, stack = resolved.adapter.name, dict(settings.stack)
    device = next(target.parameters()).device
    config = GenerationConfig(do_sample=True, max_new_tokens=settings.max_new_tokens, **release_warpers(stack))
    if family == PROMPT_LOOKUP:
        config.prompt_lookup_num_tokens = PROMPT_LOOKUP_TOKENS
    routed, kwargs = _routing(family, target, assistant, resolved.generator_class)
    vocab = (assistant if family == ASSISTED else target).get_output_embeddings().weight.shape[0]
    observed = CallObservation(DraftingRecord())
    watched = intercepting(routed, vocab, observed.record)
    prompt = list(settings.prompts[call % len(settings.prompts)])
    key = (settings.target, settings.device, format_warpers(stack), settings.max_new_tokens, len(prompt))
    with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device]), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.manual_seed(settings.seed * 1_000_003 + call)
        ids = torch.tensor([prompt], dtype=torch.long, device=device)
        try:
            with torch.no_grad():
                full = watched.generate(ids, generation_config=config, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the generator under test (or the loop) failed
            observed.error = f"generate() raised {one_line(exc)}"
            return observed
        try:
            if key not in _PROCESSORS:
                probe = torch.zeros((1, len(prompt)), dtype=torch.long)
                _PROCESSORS[key] = capture_processors(target, probe, stack, settings.max_new_tokens)[0]
            p_laws, _, ambiguous = _Laws(target, _PROCESSORS[key])(full, len(prompt))
            q_laws, q_raw, _ = _Laws(assistant, _PROCESSORS[key])(full, len(prompt))
        except PlainSamplingFails as exc:  # the installed processors themselves fail on a history
            observed.skipped = str(exc)
            return observed
    rng = np.random.default_rng([settings.seed, 7, call])
    for x, p, q, qc, unsure in zip(full[0, len(prompt):].tolist(), p_laws, q_laws, q_raw, ambiguous):
        aimed = raw_logits_law(p, q, qc)
        step = PowerSimulation.step(p, q, aimed, rng)
        if unsure:
            # Decided from the prefix alone, before the token: a factor of 1 keeps the e-process's mean 1.
            observed.ambiguous += 1
            observed.factors.append(np.zeros(COMPONENTS))
            observed.power_steps.append((np.zeros_like(step[0]), step[1]))
        else:
            observed.factors.append(log_factors(p, q, np.array([x]), aimed)[0] if p[x] > 0.0 else None)
            observed.power_steps.append(step)
        observed.bug_tv.append(0.5 * float(np.abs(aimed - p).sum()))
        observed.tv_pq.append(0.5 * float(np.abs(p - q).sum()))
    return observed


def check_row(engine, settings: RowSettings, resolved, samples: int, alpha: float) -> PairRow:
    """Run the three checks of one generator (a :class:`~lossless_check.subjects.adapters.ResolvedGenerator`) under
    the stack of ``settings``; ``samples`` is the most sampling ``generate()`` calls (cycling through the
    prompts), ``alpha`` the statistical test's share of the family-wise rate.

    The calls run on ``engine`` (:class:`~lossless_check.running.engine.Engine`), a wave of two per worker at a
    time, and are folded here in call order, stopping after the call where the test stops: the bet is
    the same whatever the number of workers (calls past the stop are discarded), so is the report.
    """
    started = time.perf_counter()
    row = PairRow(resolved.display_name, format_warpers(dict(settings.stack)))
    if resolved.generator_class is None:
        row.verdict, row.reason = "skipped", f"{resolved.adapter.name} is not in the installed transformers"
        return row
    record = DraftingRecord()
    bet = BettingState.start()
    power = PowerSimulation(alpha)
    bug_tv: list[float] = []
    tv_pq: list[float] = []
    wave = 1 if engine.workers <= 1 else 2 * engine.workers
    calls, ambiguous, stopped = 0, 0, False
    while calls < samples and not stopped:
        batch = range(calls, min(samples, calls + wave))
        for observed in engine.map(observe_call, [(settings, i) for i in batch]):
            calls += 1
            record.merge(observed.record, calls)
            if observed.error:
                row.verdict, row.reason, row.exact = "error", observed.error, record.to_dict()
                return row
            if observed.skipped:
                row.verdict, row.reason = "skipped", observed.skipped
                return row
            for factors, step in zip(observed.factors, observed.power_steps):
                bet.add(factors, alpha)
                power.add(*step)
            ambiguous += observed.ambiguous
            bug_tv += observed.bug_tv
            tv_pq += observed.tv_pq
            if bet.rejected_at is not None or bet.support_violations:
                stopped = True
                break
    row.exact = record.to_dict()
    row.statistical = {
        "test": "betting e-process toward q (anytime-valid, Ville)", "alpha": alpha, "tokens": bet.tokens,
        "calls": calls, "log_evalue": bet.log_evalue, "max_log_evalue": bet.max_log_evalue,
        "rejected_at_token": bet.rejected_at, "support_violations": bet.support_violations,
        "ambiguous_top_k_boundary": ambiguous,
        "tv_target_drafter": _quantiles(tv_pq), "tv_raw_logits_bug_first_position": _quantiles(bug_tv),
        "power": power.summary(),
    }
    from lossless_check.modes.models.loading import load_pair

    target, assistant = load_pair(settings.target, settings.assistant, settings.device)
    routed, kwargs = _routing(resolved.adapter.name, target, assistant, resolved.generator_class)
    row.greedy = greedy_equivalence(routed, kwargs, dict(settings.stack),
                                    [list(p) for p in settings.prompts[:GREEDY_PROMPTS]], settings.max_new_tokens,
                                    resolved.adapter.name)
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
    unsure = row.statistical["ambiguous_top_k_boundary"]
    unsure = f", {unsure} at a top_k boundary within float rounding not bet on" if unsure else ""
    statistical = (f"statistical: no rejection in {bet.tokens} tokens{unsure} (log E {bet.log_evalue:.3g}; a departure "
                   f"toward q of per-position TV {power['median_tv_at_hit_positions']:.3g} would be caught with "
                   f"probability "
                   f"{power['power']:.2f})") if bet.rejected_at is None and not bet.support_violations else ""
    if failures:
        row.verdict, row.reason = "not_lossless", "; ".join(failures + ([statistical] if statistical else []))
        return
    row.reason = (f"exact: {record.reason()}; {statistical}; "
                  f"greedy: identical in {row.greedy['comparisons']} comparisons")
