"""A user's rejection sampler checked: exactly where its draws can be enumerated
(:mod:`.sampler_exact`), statistically in every case (:mod:`.sampler_statistical`), one verdict.

The verdict is ``not_lossless`` on any exact failure (whatever the sampler draws: a token of target
probability 0, a call that raises, a malformed return; with every draw enumerated: an emitted law that is
not the target's, or a decision that changes inside a cell) or when the statistical check rejects at the
family rate ``alpha``. It is ``lossless`` otherwise, and says on what: "exact" only where every design was
enumerated, else "statistical" with the total variation it detects (a sampler whose draws the exact check
could not see is never passed on an exact check).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from lossless_check.subjects.sampler import Sampler, load_sampler
from lossless_check.subjects.sampler_exact import ExactOutcome, exact_check
from lossless_check.subjects.sampler_statistical import POWER, StatisticalOutcome, statistical_check
from lossless_check.subjects.verifier import VerifierCheck, rand_grid


@dataclass
class SamplerReport:
    """What :func:`check_sampler` found: the exact checks (one per design), the statistical tests, the verdict."""

    sampler: str
    protocol: str
    transformers_version: str
    torch_version: str
    premises: list[VerifierCheck]
    exact: ExactOutcome
    statistical: StatisticalOutcome
    verdict: str = field(init=False)
    reason: str = field(init=False)

    def __post_init__(self) -> None:
        self.verdict = "not_lossless" if self.exact.failed or self.statistical.failed else "lossless"
        self.reason = self._reason()

    @property
    def lossless(self) -> bool:
        return self.verdict == "lossless"

    @property
    def exact_failure(self) -> bool:
        return bool(self.exact.failed or self.statistical.exact_failures)

    def _reason(self) -> str:
        stats = self.statistical
        detects = (f"statistical: {len(stats.tests)} position tests over {len({t.design for t in stats.tests})} "
                   f"draft/target pairs at {stats.samples} trials each, family alpha {stats.alpha:g}, detects TV >= "
                   f"{stats.tv_detectable:.3f} at position 1 of every pair with power {POWER}")
        if self.exact.failed:
            first = self.exact.failed[0]
            rate = f" ({first.rate})" if first.rate else ""
            return (f"exact: {len(self.exact.failed)} of {len(self.exact.checks)} designs fail; {first.name}: "
                    f"{first.observed}{rate}")
        if stats.exact_failures:
            return f"statistical run: {stats.exact_failures[0]}"
        if stats.rejected:
            worst = min(stats.rejected, key=lambda t: t.p_value_adjusted)
            return (f"statistical: {len(stats.rejected)} position tests reject at family alpha {stats.alpha:g}; "
                    f"{worst.design}, position {worst.position}: TV {worst.tv:.4f} (n={worst.samples}, Holm-adjusted "
                    f"p={worst.p_value_adjusted:.2g})")
        if self.exact.traced:
            scheme = ("Algorithm 1's law for every draft" if self.exact.algorithm_1 else
                      "a different acceptance law than Algorithm 1's (lossless, fewer drafts accepted)")
            return (f"exact: the target's law in all {len(self.exact.checks)} designs, every draw enumerated "
                    f"({self.exact.paths} paths; {scheme}); {detects}")
        return f"exact check not applicable: {self.exact.untraceable}; checked statistically only: {detects}"

    def to_dict(self) -> dict:
        return {"sampler": self.sampler, "protocol": self.protocol, "transformers_version": self.transformers_version,
                "torch_version": self.torch_version, "verdict": self.verdict, "reason": self.reason,
                "exact": {"traced": self.exact.traced, "untraceable": self.exact.untraceable, "paths": self.exact.paths,
                          "algorithm_1": self.exact.algorithm_1,
                          "premises": [asdict(c) for c in self.premises],
                          "checks": [asdict(c) for c in self.exact.checks]},
                "statistical": {"alpha": self.statistical.alpha, "samples": self.statistical.samples,
                                "p_value": self.statistical.p_value, "tv_detectable": self.statistical.tv_detectable,
                                "power": POWER, "exact_failures": self.statistical.exact_failures,
                                "tests": [asdict(t) for t in self.statistical.tests]}}


def check_sampler(sampler: str | Sampler, protocol: str | None = None, samples: int = 5_000, alpha: float = 1e-6,
                  seed: int = 0) -> SamplerReport:
    """Check a rejection sampler (``module:function``, a function, or a :class:`~.sampler.Sampler`)."""
    import torch
    import transformers

    sampler = load_sampler(sampler, protocol)
    return SamplerReport(sampler.spec, sampler.protocol, transformers.__version__, torch.__version__, [rand_grid()],
                         exact_check(sampler), statistical_check(sampler, samples, alpha, seed))
