"""One row of ``lossless-check models``: a generator family on the user's pair under one warper stack.

Three checks, in the real ``generate()`` of the installed release (``do_sample=True`` unless said):

1. **Exact** (:mod:`.drafting`): every drafting round's returned q against the law its drafts were
   drawn from. No statistics; applies to generators that return candidate logits and draw with torch's
   sampling primitives (a draw it cannot trace, e.g. Gumbel-max, is a *gap*).
2. **Statistical**: every emitted token ``x_t`` against ``p_t``, the law the verifier itself used at that
   position, by the test-by-betting e-process of :mod:`lossless_check.stats.betting` (anytime-valid; the
   calls stop at its first rejection). Its power is measured on the laws met
   (:class:`~lossless_check.stats.betting.PowerSimulation`).
3. **Greedy**: ``do_sample=False`` speculative decoding returns plain greedy decoding's tokens.

**The null is what the call computed.** The sampling call runs with ``return_dict_in_generate=True,
output_scores=True``. In ``_assisted_decoding`` the scores are the rows of ``new_logits``, the target's
logits after every processor (and, before 4.45, after the separate warpers too, applied in place on
``new_logits``), which ``_speculative_sampling`` (or, for a generator returning no q, the loop's own
``new_logits.softmax``) turns into ``p``; one row per emitted token (``n_matches + 1`` a round, counted
after the EOS and length crops). Read in a release of every minor from 4.37 to 5.25 (4.37.0, 4.38.2, 4.39.3,
4.40.0, 4.41.2, 4.42.0, 4.43.4, 4.44.0, 4.45.0, 4.46.3, 4.47.0, 4.48.3, 4.49.0, 4.50.0, 4.51.3, 4.52.4, 4.53.3,
4.54.1, 4.55.4, 4.56.2, 4.57.6, then 5.0.0 to 5.25.0): the same in all, so no release needs the law
recomputed, and no top_k boundary rule is needed (a call whose scores do not number its emitted tokens is an
error). ``p_t`` is the softmax of the score row in its own dtype, as the verifier computes it, then float64:
its support is exactly the verifier's, under every truncating warper (``top_k``, ``top_p``, ``min_p``,
``typical_p``, epsilon, eta) and every float rounding of the cached passes. ``q_t`` (the drafter's processed
law at the prefix, from one uncached pass of the assistant, processed by the very ``LogitsProcessorList``
``generate()`` builds: :func:`~lossless_check.laws.warpers.capture_processors`) only aims the bets.

**Why a lossless decoder satisfies the null** (:mod:`lossless_check.stats.betting`: each emitted token
follows ``p_t`` given all the test has seen). Fix a round and a position ``j`` in it: the state before the
round, the drafts ``d_1..d_j`` so far all accepted (each emitted), the verifier's row ``p_j``. If the round
stops drafting there (``L = j``), the token is the bonus, drawn from ``p_j``. Otherwise ``d_{j+1}`` is drawn
from the returned ``q_j`` (the drafter's contract), accepted with probability ``min(1, p_j / q_j)``, else
the token is drawn from ``norm(max(p_j - q_j, 0))``: the emitted token follows ``q_j min(1, p_j/q_j) +
(1 - sum q_j min(1, p_j/q_j)) norm(max(p_j - q_j, 0)) = p_j`` (Leviathan et al., Algorithm 1). This needs
``p_j`` fixed before ``d_{j+1}`` is drawn: a function of the history and ``d_1..d_j``, not of later drafts.
In exact arithmetic the causal mask guarantees it; in floating point a row's last bits may depend on how
many positions its forward pass holds (which an adaptive drafter can choose from its drafts): that, and
torch's generator being an ideal random source, are what "at most alpha" assumes beyond the algorithm. The
harness's ``q_t``, ``r_t`` and ``V_t`` are functions of the prefix and of an independent stream, so
conditioning on them changes nothing. That the verifier's row is what plain sampling would compute at that
prefix is not this test's null: the two differ by the float rounding of a cached pass (up to 1.4e-4 in
``log p`` on the tests' pair), far below any departure a run resolves, and never a false failure here.

**No pass without power.** A row whose exact check could not see its drafts (a gap, or no q returned, as
prompt lookup) is ``lossless`` only when the statistical check would have caught a departure of per-position
TV :data:`MAX_DETECTABLE_TV` with probability :data:`~lossless_check.stats.betting.TARGET_POWER` in every
simulated direction; else it is ``inconclusive``, with what it could detect and about how many tokens more
it would take.

Figures: per emitted position, ``TV(p_t, q_t)`` (how far drafter and target disagree) and the TV to
``p_t`` of the law a round's *first* emitted token would follow if the verifier were handed the
drafter's raw logits while drafts follow its processed law (the seed bug class):
``r = qs min(1, p/qc) + (1 - sum qs min(1, p/qc)) norm(max(0, p - qc))``, ``qs`` the processed and
``qc = softmax(raw)`` the returned law. The correct algorithm (``qc = qs``) gives ``r = p`` exactly.
The test also bets on ``r`` itself (toward-q family): computed from the laws at the prefix, so validity is
untouched.
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
from lossless_check.modes.loop_models import ASSISTED, DIFFERENT_TOKENIZERS, PROMPT_LOOKUP, driving, installed_class
from lossless_check.modes.models.drafting import DraftingRecord, intercepting
from lossless_check.stats.betting import (
    DIRECTIONS,
    TARGET_POWER,
    BettingState,
    PowerCall,
    PowerSimulation,
    observe_token,
)

#: Families a model pair drives: the assistant model itself, and prompt lookup (no drafter model).
FAMILIES = (ASSISTED, PROMPT_LOOKUP)
#: Driven when the two folders hold different tokenizers. generate() builds it under do_sample=False only,
#: so its row is the greedy check alone. (Its sampling sibling, UniversalSpeculativeDecodingGenerator, drafts
#: in the assistant's vocabulary: neither the exact check's draft tracing nor a q at the target's prefix
#: applies without its vocabulary translation; not driven.)
TWO_TOKENIZERS = (DIFFERENT_TOKENIZERS,)
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
    verdict: str = "lossless"  # lossless | not_lossless | inconclusive | error | skipped
    reason: str = ""
    exact: dict = field(default_factory=dict)
    statistical: dict = field(default_factory=dict)
    greedy: dict = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        """A case of the JSON report (``samples``: the tokens the statistical test saw; ``tv_detectable``: the
        smallest simulated per-position TV caught with power :data:`~lossless_check.stats.betting.TARGET_POWER`
        in every direction, ``None`` if none was)."""
        return {"generator": self.generator, "warpers": self.warpers, "mode": "models", "verdict": self.verdict,
                "samples": self.statistical.get("tokens", 0),
                "tv_detectable": self.statistical.get("power", {}).get("detectable_tv"), "reason": self.reason,
                "exact": self.exact, "statistical": self.statistical, "greedy": self.greedy, "seconds": self.seconds}


#: The largest per-position total variation a row whose drafts the exact check could not see must be able to
#: detect (at power :data:`~lossless_check.stats.betting.TARGET_POWER`, in every simulated direction) to be
#: ``lossless``: the value of ``lossless_check.evidence.results.DEFAULT_MAX_DETECTABLE_TV``, the project's
#: stated size, which this mirrors.
MAX_DETECTABLE_TV = 0.3


def _drafter_laws(model, processors, full: torch.Tensor, prompt_length: int) -> tuple[list, list]:
    """``model``'s processed and raw next-token laws after every prefix of the output (one uncached pass):
    they aim the bets only."""
    n = full.shape[1] - prompt_length
    with torch.no_grad():
        logits = model(full, use_cache=False).logits[0, prompt_length - 1:prompt_length - 1 + n].float()
    laws, raw = [], []
    for t in range(n):
        row = logits[t:t + 1]
        raw.append(torch.softmax(row[0].double(), dim=-1).cpu().numpy())
        if len(processors) > 0:
            row = processed(processors, full[:, :prompt_length + t], row.clone())
        laws.append(torch.softmax(row[0].double(), dim=-1).cpu().numpy())
    return laws, raw


def verifier_laws(scores) -> np.ndarray:
    """The verifier's law at every emitted position from ``generate()``'s scores: the softmax in the scores'
    own dtype (as ``_speculative_sampling`` computes ``p``), then float64 ``(tokens, vocabulary)``."""
    rows = torch.stack([s[0] for s in scores])
    return torch.softmax(rows, dim=-1).double().cpu().numpy()


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


def _routing(family: str, target, assistant, generator_class, tokenizers=None) -> tuple[object, dict]:
    """The target (the class under test wired in where generate() builds its family) and generate() kwargs
    (``tokenizers``: the target's and the assistant's, for the two-tokenizer family)."""
    kwargs = {} if family == PROMPT_LOOKUP else {"assistant_model": assistant}
    if family == DIFFERENT_TOKENIZERS:
        kwargs.update(tokenizer=tokenizers[0], assistant_tokenizer=tokenizers[1])
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
    """What one sampling call gave: per emitted token its bets' observation (``None``: outside the
    verifier's support), the call's power-simulation replicates, its TV figures, and its drafting record."""

    record: DraftingRecord
    observations: list = field(default_factory=list)
    power: PowerCall = field(default_factory=PowerCall)
    tv_pq: list = field(default_factory=list)
    bug_tv: list = field(default_factory=list)
    drafter_law: bool = True  # False: no drafter law in the target's vocabulary aimed the bets (q = p)
    error: str = ""  # generate() raised, or its scores do not match its tokens
    skipped: str = ""  # the stack's processors fail on the drafter's pass


#: ``(settings, prompt length) -> processors``, per process: capture_processors builds a model from the config.
_PROCESSORS: dict = {}


def observe_call(settings: RowSettings, call: int) -> CallObservation:
    """Sampling call ``call`` of a row: a function of ``settings`` and ``call`` alone (its torch seed is
    ``seed * 1_000_003 + call``, its PIT uniforms ``default_rng([seed, 11, call])``, its power stream
    ``default_rng([seed, 7, call])``), so it gives the same data in an engine worker as here."""
    from transformers import GenerationConfig

    from lossless_check.modes.models.loading import load_pair
    from lossless_check.subjects.adapters import resolve_generator

    target, assistant = load_pair(settings.target, settings.assistant, settings.device)
    resolved = resolve_generator(settings.generator)
    family, stack = resolved.adapter.name, dict(settings.stack)
    device = next(target.parameters()).device
    config = GenerationConfig(do_sample=True, max_new_tokens=settings.max_new_tokens, return_dict_in_generate=True,
                              output_scores=True, **release_warpers(stack))
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
                output = watched.generate(ids, generation_config=config, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the generator under test (or the loop) failed
            observed.error = f"generate() raised {one_line(exc)}"
            return observed
        full = output.sequences
        emitted = full[0, len(prompt):].tolist()
        if len(output.scores) != len(emitted):
            observed.error = (f"generate() returned {len(output.scores)} score rows for {len(emitted)} emitted tokens: "
                              f"the verifier's law cannot be aligned with the tokens")
            return observed
        p_laws = verifier_laws(output.scores)
        try:
            if key not in _PROCESSORS:
                probe = torch.zeros((1, len(prompt)), dtype=torch.long)
                _PROCESSORS[key] = capture_processors(target, probe, stack, settings.max_new_tokens)[0]
            if assistant.get_output_embeddings().weight.shape[0] == target.get_output_embeddings().weight.shape[0]:
                q_laws, q_raw = _drafter_laws(assistant, _PROCESSORS[key], full, len(prompt))
            else:  # prompt lookup beside an assistant of another vocabulary: nothing aims toward a q
                q_laws = q_raw = list(p_laws)
                observed.drafter_law = False
        except PlainSamplingFails as exc:  # the installed processors themselves fail on a history
            observed.skipped = str(exc)
            return observed
    uniforms = np.random.default_rng([settings.seed, 11, call]).random(len(emitted))
    rng = np.random.default_rng([settings.seed, 7, call])
    for x, p, q, qc, v in zip(emitted, p_laws, q_laws, q_raw, uniforms):
        aimed = raw_logits_law(p, q, qc)
        observed.power.add(p, q, aimed, rng)
        observed.observations.append(observe_token(p, q, aimed, x, v))
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
    routed, kwargs = _routing(family, target, assistant, resolved.generator_class, tokenizers)
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
