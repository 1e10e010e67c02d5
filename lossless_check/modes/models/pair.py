"""One row of ``lossless-check models``: a generator family on the user's pair under one warper stack.

Three checks, in the real ``generate()`` of the installed release (``do_sample=True`` unless said):

1. **Exact** (:mod:`.drafting`): every drafting round's returned q against the law its drafts were
   drawn from. No statistics; applies to generators that return candidate logits and draw with torch's
   sampling primitives (a draw it cannot trace, e.g. Gumbel-max, is a *gap*).
2. **Statistical**: every emitted token ``x_t`` against ``p_t``, the law the verifier itself used at that
   position (taken from the call itself, :mod:`.sampling`, which says why a lossless decoder emits ``x_t``
   from ``p_t``), by the test-by-betting e-process of :mod:`lossless_check.stats.betting` (anytime-valid; the
   calls stop at its first rejection). Its power is measured on the laws met (:mod:`lossless_check.stats.power`).
3. **Greedy**: ``do_sample=False`` speculative decoding returns plain greedy decoding's tokens.

**No pass without power.** A row whose exact check could not see its drafts (a gap, or no q returned, as
prompt lookup) is ``lossless`` only when the statistical check would have caught a departure of per-position
TV :data:`MAX_DETECTABLE_TV` with probability :data:`~lossless_check.stats.power.TARGET_POWER` in every
simulated direction; else it is ``inconclusive``, with what it could detect and about how many tokens more
it would take.
"""

from __future__ import annotations

import copy
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from lossless_check.core.compat import release_warpers
from lossless_check.evidence.results import DEFAULT_MAX_DETECTABLE_TV, one_line
from lossless_check.laws.warpers import format_warpers
from lossless_check.modes.loop_models import ASSISTED, DIFFERENT_TOKENIZERS, PROMPT_LOOKUP
from lossless_check.modes.models.drafting import DraftingRecord
from lossless_check.modes.models.sampling import PROMPT_LOOKUP_TOKENS, RowSettings, observe_call, routing
from lossless_check.stats.betting import BettingState
from lossless_check.stats.power import DIRECTIONS, TARGET_POWER, PowerSimulation

#: Families a model pair drives: the assistant model itself, and prompt lookup (no drafter model).
FAMILIES = (ASSISTED, PROMPT_LOOKUP)
#: Driven when the two folders hold different tokenizers. generate() builds it under do_sample=False only,
#: so its row is the greedy check alone. (Its sampling sibling, UniversalSpeculativeDecodingGenerator, drafts
#: in the assistant's vocabulary: neither the exact check's draft tracing nor a q at the target's prefix
#: applies without its vocabulary translation; not driven.)
TWO_TOKENIZERS = (DIFFERENT_TOKENIZERS,)
#: Greedy comparisons per row (the first prompts).
GREEDY_PROMPTS = 4
#: Options that act on sampling only: left out of the greedy comparison's config.
SAMPLING_ONLY = ("temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")


@dataclass
class PairRow:
    """The verdict of one generator under one warper stack on the pair."""

    generator: str
    warpers: str
    verdict: str = "lossless"  # lossless | not_lossless | inconclusive | error | skipped
    reason: str = ""
    exact: dict = field(default_factory=dict)
    statistical: dict = field(default_factory=dict)
    greedy: dict = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        """A case of the JSON report (``samples``: the tokens the statistical test saw; ``tv_detectable``: the
        smallest simulated per-position TV caught with power :data:`~lossless_check.stats.power.TARGET_POWER`
        in every direction, ``None`` if none was)."""
        return {"generator": self.generator, "warpers": self.warpers, "mode": "models", "verdict": self.verdict,
                "samples": self.statistical.get("tokens", 0),
                "tv_detectable": self.statistical.get("power", {}).get("detectable_tv"), "reason": self.reason,
                "exact": self.exact, "statistical": self.statistical, "greedy": self.greedy, "seconds": self.seconds}


#: The largest per-position total variation a row whose drafts the exact check could not see must be able to
#: detect (at power :data:`~lossless_check.stats.power.TARGET_POWER`, in every simulated direction) to be
#: ``lossless``: the project's stated size (one of the simulated sizes, so its power is read, not interpolated).
MAX_DETECTABLE_TV = DEFAULT_MAX_DETECTABLE_TV


def _quantiles(values: list[float]) -> dict:
    if not values:
        return {"median": None, "p95": None, "positions": 0}
    return {"median": float(np.median(values)), "p95": float(np.quantile(values, 0.95)), "positions": len(values)}


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
    if resolved.adapter.name in TWO_TOKENIZERS:
        row.greedy = _greedy_row(settings, resolved)
        _decide(row, DraftingRecord(), BettingState.start(), None)
        row.seconds = time.perf_counter() - started
        return row
    record = DraftingRecord()
    bet = BettingState.start()
    power = PowerSimulation(alpha)
    bug_tv: list[float] = []
    tv_pq: list[float] = []
    wave = 1 if engine.workers <= 1 else 2 * engine.workers
    calls, stopped, drafter_law = 0, False, True
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
            for observation in observed.observations:
                bet.add(observation, alpha)
                if bet.rejected_at is not None or bet.support_violations:
                    stopped = True
                    break
            power.add(observed.power)
            drafter_law &= observed.drafter_law
            bug_tv += observed.bug_tv
            tv_pq += observed.tv_pq
            if stopped:
                break
    directions = stated_directions(drafter_law)
    row.exact = record.to_dict()
    row.statistical = {
        "test": "betting e-process toward q, sharper, flatter and on PIT values (anytime-valid, Ville)",
        "null": "the verifier's law: generate()'s scores (return_dict_in_generate, output_scores)",
        "alpha": alpha, "tokens": bet.tokens, "calls": calls, "log_evalue": bet.log_evalue,
        "family_log_evalues": bet.family_log_evalues(), "max_log_evalue": bet.max_log_evalue,
        "rejected_at_token": bet.rejected_at, "support_violations": bet.support_violations,
        "tv_target_drafter": _quantiles(tv_pq), "tv_raw_logits_bug_first_position": _quantiles(bug_tv),
        "power": {**power.summary(), "directions": list(directions),
                  "detectable_tv": power.detectable_tv(directions),
                  "tokens_needed_at_max_detectable_tv": power.tokens_needed(MAX_DETECTABLE_TV, directions)},
    }
    row.greedy = _greedy_row(settings, resolved)
    _decide(row, record, bet, power)
    row.seconds = time.perf_counter() - started
    return row


def stated_directions(drafter_law: bool) -> tuple[str, ...]:
    """The simulated directions a row's power is stated for (toward and away from q only where a drafter law aimed q)."""
    return tuple(d for d in DIRECTIONS if drafter_law or d not in ("toward_q", "away_from_q"))


def _greedy_row(settings: RowSettings, resolved) -> dict:
    """The greedy check of a row, on the first prompts."""
    from lossless_check.modes.models.loading import load_pair, load_tokenizer

    target, assistant = load_pair(settings.target, settings.assistant, settings.device)
    family = resolved.adapter.name
    tokenizers = ((load_tokenizer(settings.target), load_tokenizer(settings.assistant, "--assistant"))
                  if family == DIFFERENT_TOKENIZERS else None)
    routed, kwargs = routing(family, target, assistant, resolved.generator_class, tokenizers)
    return greedy_equivalence(routed, kwargs, dict(settings.stack), [list(p) for p in settings.prompts[:GREEDY_PROMPTS]],
                              settings.max_new_tokens, family)


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
    # An encoder-decoder's outputs are its decoder's ids (the start tokens included: the same in both, or a difference).
    decoder_only = not target.config.is_encoder_decoder
    differences = []
    for prompt in prompts:
        ids = torch.tensor([prompt], dtype=torch.long, device=device)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            skip = len(prompt) if decoder_only else 0
            plain = target.generate(ids, generation_config=copy.deepcopy(config))[0, skip:].tolist()
            try:
                speculative = target.generate(ids, generation_config=copy.deepcopy(speculative_config),
                                              **kwargs)[0, skip:].tolist()
            except Exception as exc:  # noqa: BLE001
                speculative = one_line(exc)
        if speculative != plain:
            differences.append({"prompt": prompt, "speculative": speculative, "plain": plain})
    return {"warpers": format_warpers(greedy_stack), "comparisons": len(prompts), "differ": len(differences),
            "first_difference": differences[0] if differences else None}


def _decide(row: PairRow, record: DraftingRecord, bet: BettingState, power: PowerSimulation | None) -> None:
    failures = []
    if record.verdict == "inconsistent":
        failures.append(f"exact: {record.reason()}")
    if bet.support_violations:
        failures.append(f"statistical: {bet.support_violations} emitted token(s) have probability 0 under the "
                        f"verifier's law")
    if bet.rejected_at is not None:
        failures.append(f"statistical: the e-value reached 1/alpha after {bet.rejected_at} tokens")
    if row.greedy.get("differ"):
        failures.append(f"greedy: {row.greedy['differ']} of {row.greedy['comparisons']} outputs differ from plain "
                        f"greedy decoding")
    if power is None:  # a greedy-only generator
        if failures:
            row.verdict, row.reason = "not_lossless", "; ".join(failures)
        else:
            row.reason = (f"greedy only (generate() builds it under do_sample=False): identical in "
                          f"{row.greedy['comparisons']} comparisons")
        return
    if failures:
        row.verdict, row.reason = "not_lossless", "; ".join(failures)
        return
    stated = row.statistical["power"]
    detectable, directions = stated["detectable_tv"], stated["directions"]
    if detectable is not None:
        could = (f"a departure of per-position TV {detectable:g} in any of {len(directions)} directions "
                 f"({', '.join(directions)}) would be caught with probability >= {TARGET_POWER:g}")
    else:
        weakest = min(directions, key=lambda d: _power_at(stated, d, MAX_DETECTABLE_TV))
        could = (f"no departure up to per-position TV {MAX_DETECTABLE_TV:g} is caught with probability "
                 f"{TARGET_POWER:g} in every direction (at TV {MAX_DETECTABLE_TV:g}, {weakest}: "
                 f"{_power_at(stated, weakest, MAX_DETECTABLE_TV):.2f})")
    statistical = f"statistical: no rejection in {bet.tokens} tokens (log E {bet.log_evalue:.3g}); {could}"
    blind = record.verdict in ("gap", "not_applicable")
    if blind and (detectable is None or detectable > MAX_DETECTABLE_TV):
        needed = stated["tokens_needed_at_max_detectable_tv"]
        more = (f"about {needed - bet.tokens} more tokens (about {needed} in all) would give power "
                f"{TARGET_POWER:g} at TV {MAX_DETECTABLE_TV:g}" if needed else
                f"the simulated e-value did not grow at TV {MAX_DETECTABLE_TV:g}: more tokens would not help")
        row.verdict = "inconclusive"
        row.reason = f"exact: {record.reason()}; {statistical}; {more}"
        return
    row.reason = f"exact: {record.reason()}; {statistical}; greedy: identical in {row.greedy['comparisons']} comparisons"


def _power_at(stated: dict, direction: str, size: float) -> float:
    return next(r["power"] for r in stated["rows"] if r["direction"] == direction and r["tv"] == size)
