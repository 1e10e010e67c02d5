"""Provenance mode: an exact, zero-variance check that the returned ``q`` is what was sampled from.

While a real generator's ``get_candidates`` runs, the sampling primitives it may use are
intercepted: ``torch.multinomial`` / ``Tensor.multinomial`` and
``torch.distributions.Categorical.sample`` (sampled tokens: the probability rows they were given),
``torch.argmax`` / ``Tensor.argmax`` over the vocabulary (deterministic tokens), and the noise
sources of Gumbel-max sampling (``torch.rand``, ``torch.rand_like``, ``Tensor.uniform_``,
``Tensor.exponential_``). Each draft token is matched to the draw that produced it, and the
distribution it was drawn from is compared with ``softmax(candidate_logits)`` row by row.

Only *vocabulary-wide* calls are recorded (last dimension equal to the vocabulary size): an argmax
over an attention mask is not a token choice. A draft token that no recorded draw explains, or
that several explain, is an *interception gap*, never a guess.

The check traces the law each draft was drawn from, not that the draws are fresh: a drafter that
manages its own randomness (seen by :class:`~.randomness.RandomnessWatch`, or whose sampled draws
leave torch's global stream where it was: a private, re-seeded or restored stream) may draw the same
tokens on every call from the right law, which is not lossless. Such a trial is a gap too (no
verdict here; step mode tests the real calls' draws).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import torch

from lossless_check.core.errors import GeneratorFailure, NotApplicable
from lossless_check.evidence.results import Case, CaseResult, one_line
from lossless_check.modes.interception import ARGMAX, NOISE, SAMPLE, TOLERANCE, WITHOUT_REPLACEMENT, Draw, Interception
from lossless_check.modes.randomness import RandomnessWatch
from lossless_check.subjects.candidates import check_candidates


def match_draws(draws: list[Draw], drafts: list[int]) -> list[Draw] | str:
    """The draw that produced each draft token, in order, or the reason no unambiguous match exists.

    Sampling primitives only choose tokens, so they are tried first; argmax also serves other ends
    (processors call it), so it is used only when the sampled draws cannot explain the drafts.
    Every sampled draw must end up as a draft token: a sample that was discarded means the token
    was not simply drawn from its row.
    """
    sampled = [d for d in draws if d.kind in (SAMPLE, WITHOUT_REPLACEMENT)]
    choices = [d for d in draws if d.kind != NOISE]
    for pool in (sampled, choices):
        count, chosen = _embeddings(pool, drafts)
        if count == 1:
            break
        if count > 1:
            return "draws cannot be matched to draft tokens unambiguously"
    else:
        noise = " (vocabulary-wide random noise was drawn: Gumbel-max?)" if any(d.kind == NOISE for d in draws) else ""
        return f"draft tokens {drafts} are not produced, in order, by the intercepted draws{noise}"
    unused = len(sampled) - sum(d.kind != ARGMAX for d in chosen)
    if unused:
        return f"{unused} sampled token(s) were drawn but not drafted"
    if any(d.kind == WITHOUT_REPLACEMENT for d in chosen):
        return "a draft token was sampled without replacement after another: its law is not its row"
    noisy = False
    for d in draws:
        noisy |= d.kind == NOISE
        if noisy and d.kind == ARGMAX and any(d is c for c in chosen):
            return "an argmax draft token followed vocabulary-wide random noise (Gumbel-max?): its law is unknown"
    return chosen


def _embeddings(pool: list[Draw], drafts: list[int]) -> tuple[int, list[Draw]]:
    """Number of in-order matches of ``drafts`` into ``pool`` (capped at 2), and the match if unique."""
    n, m = len(pool), len(drafts)
    # ways[i][j]: matches of drafts[j:] into pool[i:], capped at 2.
    ways = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n + 1):
        ways[i][m] = 1
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            take = ways[i + 1][j + 1] if pool[i].token == drafts[j] else 0
            ways[i][j] = min(2, ways[i + 1][j] + take)
    if ways[0][0] != 1:
        return ways[0][0], []
    chosen, j = [], 0
    for i in range(n):
        if j < m and pool[i].token == drafts[j] and ways[i + 1][j + 1]:
            chosen.append(pool[i])
            j += 1
    return 1, chosen


@dataclass
class PositionProvenance:
    """Draft position ``position`` (1-based), worst case over the trials."""

    position: int
    rule: str  # "sampled", "argmax", or both joined by "+"
    max_abs_diff: float  # max_v |q_returned(v) - q_sampled(v)|
    tv: float  # total variation between the two
    foreign_mass: float  # returned-q mass on tokens the drafter gives probability 0
    inflation: float  # 1 / Z, Z = returned-q mass on the sampled support: acceptance ratios grow by it
    consistent: bool


@dataclass
class ProvenanceResult:
    """The provenance sub-verdict of one case."""

    verdict: str  # "consistent" | "inconsistent" | "gap"
    reason: str
    positions: list[PositionProvenance] = field(default_factory=list)
    trials: int = 0
    tolerance: float = TOLERANCE
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def compare_row(draw: Draw, q_returned: torch.Tensor, position: int) -> PositionProvenance:
    """Compare one draft's source with the softmax of its returned logits row (in the dtype returned)."""
    q = q_returned.to(torch.float64)
    if draw.kind == ARGMAX:
        source = torch.zeros_like(q)
        source[draw.token] = 1.0  # a deterministic token needs a point mass
    else:
        source = draw.row
    diff = (q - source).abs()
    tv = 0.5 * float(diff.sum())
    support = source > 0
    z = float(q[support].sum())
    return PositionProvenance(
        position=position,
        rule="argmax" if draw.kind == ARGMAX else "sampled",
        max_abs_diff=float(diff.max()),
        tv=tv,
        foreign_mass=float(q[~support].sum()),
        inflation=1.0 / z if z > 0 else math.inf,
        # The exact part: the verifier divides by q(token), which must not be 0.
        consistent=tv <= TOLERANCE and float(q[draw.token]) > 0,
    )


def _worst(rows: list[PositionProvenance]) -> PositionProvenance:
    return PositionProvenance(
        position=rows[0].position,
        rule="+".join(sorted({r.rule for r in rows})),
        max_abs_diff=max(r.max_abs_diff for r in rows),
        tv=max(r.tv for r in rows),
        foreign_mass=max(r.foreign_mass for r in rows),
        inflation=max(r.inflation for r in rows),
        consistent=all(r.consistent for r in rows),
    )


def provenance_check(case: Case, trials: int = 3, seed: int = 0) -> ProvenanceResult:
    """Draft ``trials`` times under interception and compare each draft's source with the returned q.

    Verdicts: ``inconsistent`` if any draft position's returned q differs from what its token was
    drawn from (beyond :data:`TOLERANCE`, or q(token) = 0); else ``gap`` if some draft token could
    not be traced to one intercepted draw; else ``consistent``. The global CPU random state is left
    as it was (the stubs run on CPU).

    Raises :class:`GeneratorFailure` if the generator fails to build, raises, or returns malformed
    candidates (the case's verdict is then ``error``, as in step mode). Callers skip the cases
    :func:`~lossless_check.modes.step.skip_reason` skips.
    """
    if trials < 1:
        raise ValueError("provenance_check needs at least one trial")
    started = time.perf_counter()
    from lossless_check.modes.step import StepCase

    step = StepCase(case)
    vocab, prompt = case.scenario.vocab_size, step.prompt_ids
    session = step.session()
    by_position: dict[int, list[PositionProvenance]] = {}
    gaps = []
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for t in range(trials):
            state = torch.get_rng_state()
            with RandomnessWatch() as watch, Interception(vocab) as seen:
                try:
                    candidate_ids, candidate_logits = session.draft(prompt)
                except Exception as exc:  # noqa: BLE001
                    raise GeneratorFailure(f"get_candidates raised {one_line(exc)}") from exc
            check_candidates(prompt, candidate_ids, candidate_logits, vocab, step.generation_config.max_length)
            if candidate_logits is None or candidate_ids.shape[1] == prompt.shape[1]:
                raise NotApplicable("returns no candidate_logits: provenance applies to drafters that return a q")
            drafts = candidate_ids[0, prompt.shape[1]:].tolist()
            matched = match_draws(seen.draws, drafts)
            if isinstance(matched, str):
                gaps.append(f"trial {t + 1}: {matched}")
                continue
            own = drew_own_randomness(watch, matched, state)
            if own is not None:
                gaps.append(f"trial {t + 1}: the generator {own} during get_candidates: the law of each draft is "
                            f"traced, not that the draws are fresh (step mode tests that)")
                continue
            # The verifier's view of q: a softmax of what was returned, in the dtype returned, as
            # _speculative_sampling computes it (5.24 generation/utils.py line 4464: no upcast; a bf16
            # q is quantised, an fp16 one underflows).
            q_returned = torch.softmax(candidate_logits[0], dim=-1)
            for j, draw in enumerate(matched):
                by_position.setdefault(j + 1, []).append(compare_row(draw, q_returned[j], j + 1))
    positions = [_worst(rows) for _, rows in sorted(by_position.items())]
    result = ProvenanceResult("consistent", "", positions, trials, TOLERANCE, 0.0)
    bad = [p for p in positions if not p.consistent]
    if bad:
        worst = max(bad, key=lambda p: p.tv)
        result.verdict = "inconsistent"
        result.reason = (
            f"returned q is not the distribution the drafts were drawn from at position(s) "
            f"{', '.join(str(p.position) for p in bad)}: TV {worst.tv:.4g} (max |diff| {worst.max_abs_diff:.4g}) "
            f"> {TOLERANCE:g}"
        )
        if worst.foreign_mass > TOLERANCE:
            result.reason += (
                f"; returned q puts {worst.foreign_mass:.4g} on tokens the drafter never proposes: "
                f"acceptance ratios inflated x{worst.inflation:.4g}"
            )
    elif gaps:
        result.verdict = "gap"
        result.reason = "interception gap: " + "; ".join(gaps)
    else:
        result.reason = (
            f"returned q is what each draft was drawn from at all {len(positions)} positions over {trials} trial(s) "
            f"(max TV {max(p.tv for p in positions):.2g} <= {TOLERANCE:g})"
        )
    result.seconds = time.perf_counter() - started
    return result


def drew_own_randomness(watch: RandomnessWatch, matched: list[Draw], state: torch.Tensor) -> str | None:
    """What shows that a call's sampled draws came from randomness the generator manages itself (the
    watch's first sighting, or torch's global stream left at ``state``, where the call found it,
    although a draft was sampled), or ``None``."""
    if watch.seen:
        return watch.seen[0]
    sampled = any(d.kind in (SAMPLE, WITHOUT_REPLACEMENT, NOISE) for d in matched)
    if sampled and torch.equal(torch.get_rng_state(), state):
        return "sampled its drafts without advancing torch's global stream (a private, re-seeded or restored one)"
    return None


#: The statistical verdict each provenance verdict implies in step mode, where the verifier is the
#: installed ``_speculative_sampling`` and only the drafter's honesty is in question.
IMPLIED = {"consistent": "lossless", "inconsistent": "not_lossless"}
#: Drafts inspected per provenance case: the check is exact, a few rounds cover every position.
PROVENANCE_TRIALS = 3


def run_provenance_case(case: Case, seed: int) -> CaseResult:
    """A provenance-mode case: verdict from the exact check (no sampling error, no alpha spent)."""
    from lossless_check.modes.step import skip_reason

    result = case.result()
    reason = skip_reason(case)
    if reason is not None:
        result.verdict, result.reason = "skipped", reason
        return result
    try:
        prov = provenance_check(case, PROVENANCE_TRIALS, seed)
    except NotApplicable as exc:
        result.verdict, result.reason = "skipped", str(exc)
        return result
    except GeneratorFailure as exc:
        result.verdict, result.reason = "error", str(exc)
        return result
    result.provenance = prov.to_dict()
    result.samples, result.seconds = prov.trials, prov.seconds
    # A gap is the harness failing to trace the drafts (e.g. drafts mapped between vocabularies after
    # the draw): no verdict about the generator, so not an error of it either.
    result.verdict = {"consistent": "lossless", "inconsistent": "not_lossless", "gap": "skipped"}[prov.verdict]
    result.exact_failure = prov.verdict == "inconsistent"
    if result.exact_failure:
        result.failed_checks.append("provenance")
    result.reason = prov.reason
    return result


def attach_provenance(step: CaseResult, case: Case, seed: int) -> None:
    """Put the provenance sub-verdict beside a decided step verdict; say loudly when they disagree."""
    if step.verdict not in ("lossless", "not_lossless"):
        return
    try:
        prov = provenance_check(case, PROVENANCE_TRIALS, seed)
    except (GeneratorFailure, NotApplicable) as exc:
        step.provenance = {"verdict": "error" if isinstance(exc, GeneratorFailure) else "skipped", "reason": str(exc)}
        return
    step.provenance = prov.to_dict()
    note = disagreement(step.verdict, prov, step.tv_detectable)
    if note is not None:
        step.reason = f"{note}; {step.reason}"


def disagreement(statistical_verdict: str, result: ProvenanceResult, tv_detectable: float | None = None) -> str | None:
    """A loud one-line warning when the provenance and statistical verdicts contradict each other."""
    implied = IMPLIED.get(result.verdict)
    if implied is None or statistical_verdict not in IMPLIED.values() or implied == statistical_verdict:
        return None
    if statistical_verdict == "lossless":
        power = f" (detectable TV {tv_detectable:.3g})" if tv_detectable is not None else ""
        return (f"DISAGREEMENT: provenance says {result.verdict} ({result.reason}) but the statistics did not "
                f"detect it{power}: the effect is below the run's power, or provenance misread the draws")
    return (
        f"DISAGREEMENT: provenance says {result.verdict} but the statistical verdict is {statistical_verdict}: "
        "a harness bug, an interception gap, or a statistical false alarm"
    )
