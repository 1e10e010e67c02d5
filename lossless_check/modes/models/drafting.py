"""The exact check on a real pair: while ``generate()`` drafts, recover the law of every draft.

Every ``get_candidates`` call of the generator that the installed ``generate()`` builds runs under
:class:`~lossless_check.modes.interception.Interception`; its draft tokens are matched to the draws
that produced them (:func:`~lossless_check.modes.provenance.match_draws`) and each draw's row is
compared with ``softmax(returned candidate_logits)`` (:func:`~lossless_check.modes.provenance.compare_row`).
Nothing of ``transformers`` is patched for this: the target's class is swapped (on a shallow copy)
for a subclass whose ``_get_candidate_generator`` wraps the built generator's ``get_candidates``.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field

import torch

from lossless_check.modes.interception import TOLERANCE, Interception
from lossless_check.modes.provenance import compare_row, match_draws


@dataclass
class DraftingRecord:
    """What the intercepted drafting rounds showed, over every ``generate()`` call of a row."""

    rounds: int = 0
    drafted: int = 0  # draft tokens proposed
    checked: int = 0  # draft tokens traced to a draw and compared with the returned q
    without_q: int = 0  # rounds returning no candidate_logits (deterministic drafters: nothing to compare)
    inconsistent: int = 0
    max_tv: float = 0.0
    max_inflation: float = 1.0
    gaps: list[str] = field(default_factory=list)
    first_inconsistency: str = ""
    #: The ids the first drafting round was handed: the decoder's ids ``generate()`` began its loop with (one call's).
    began_with: list = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """``inconsistent`` (a q that is not the drafts' law), ``gap`` (drafts not traced), ``consistent``,
        or ``not_applicable`` (no round returned a q)."""
        if self.inconsistent:
            return "inconsistent"
        if self.gaps:
            return "gap"
        return "consistent" if self.checked else "not_applicable"

    def reason(self) -> str:
        if self.inconsistent:
            return (f"returned q is not the law the drafts were drawn from at {self.inconsistent} of {self.checked} "
                    f"draft tokens; first: {self.first_inconsistency}")
        if self.gaps:
            return f"interception gap in {len(self.gaps)} round(s): {self.gaps[0]}"
        if not self.checked:
            return f"no drafting round returned candidate_logits ({self.rounds} rounds): nothing to compare"
        return (f"returned q is the law of all {self.checked} draft tokens over {self.rounds} rounds "
                f"(max TV {self.max_tv:.2g} <= {TOLERANCE:g})")

    def to_dict(self) -> dict:
        report = {**asdict(self), "gaps": self.gaps[:5], "verdict": self.verdict, "reason": self.reason()}
        del report["began_with"]  # a call's prompt, not a finding
        return report

    def merge(self, other: DraftingRecord, call: int) -> None:
        """Add the record of ``generate()`` call ``call`` (1-based; its rounds are numbered within it)."""
        for name in ("rounds", "drafted", "checked", "without_q", "inconsistent"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.max_tv = max(self.max_tv, other.max_tv)
        self.max_inflation = max(self.max_inflation, other.max_inflation)
        self.gaps += [f"call {call}, {gap}" for gap in other.gaps]
        if other.first_inconsistency and not self.first_inconsistency:
            self.first_inconsistency = f"call {call}, {other.first_inconsistency}"

    def observe(self, input_ids, candidate_ids, candidate_logits, draws) -> None:
        if not self.rounds:
            self.began_with = input_ids[0].tolist()
        self.rounds += 1
        drafts = candidate_ids[0, input_ids.shape[1]:].tolist()
        self.drafted += len(drafts)
        if not drafts:
            return
        if candidate_logits is None:
            self.without_q += 1
            return
        matched = match_draws(draws, drafts)
        if isinstance(matched, str):
            self.gaps.append(f"round {self.rounds}: {matched}")
            return
        # The verifier's view of q (as provenance.py explains): a softmax in the dtype returned.
        q_returned = torch.softmax(candidate_logits[0].detach().cpu(), dim=-1)
        for j, draw in enumerate(matched):
            row = compare_row(draw, q_returned[j], j + 1)
            self.checked += 1
            self.max_tv = max(self.max_tv, row.tv)
            self.max_inflation = max(self.max_inflation, row.inflation)
            if not row.consistent:
                self.inconsistent += 1
                if not self.first_inconsistency:
                    self.first_inconsistency = (
                        f"round {self.rounds}, draft position {j + 1}: TV {row.tv:.4g} between the sampled law and "
                        f"softmax(returned logits), {row.foreign_mass:.4g} of returned q on tokens never proposed "
                        f"(acceptance ratios inflated x{row.inflation:.4g})")


def intercepting(target, vocab_size: int, record: DraftingRecord):
    """A shallow copy of ``target`` (same modules and weights) whose ``generate()`` drafts under interception."""
    base = type(target)

    def _get_candidate_generator(self, *args, **kwargs):
        generator = base._get_candidate_generator(self, *args, **kwargs)
        get_candidates = generator.get_candidates

        def intercepted(input_ids, *a, **kw):
            with Interception(vocab_size) as seen:
                candidate_ids, candidate_logits = get_candidates(input_ids, *a, **kw)
            # Interception's rows are CPU float64 copies; the draws' tokens are what was drafted.
            record.observe(input_ids, candidate_ids, candidate_logits, [_on_cpu(d) for d in seen.draws])
            return candidate_ids, candidate_logits

        generator.get_candidates = intercepted  # this instance only
        return generator

    watched = copy.copy(target)
    watched.__class__ = type(f"{base.__name__}Intercepted", (base,),
                             {"_get_candidate_generator": _get_candidate_generator})
    return watched


def _on_cpu(draw):
    if draw.row is None or draw.row.device.type == "cpu":
        return draw
    from dataclasses import replace

    return replace(draw, row=draw.row.cpu())
