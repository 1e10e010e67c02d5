"""The diagnostics of a step case: the acceptance law and the rejection residuals.

They assume the drafter samples the processed drafter table and the verifier checks its q, so they
explain a failure rather than define one: ``n_matches`` over ``0..gamma`` against the law from
``a_i = sum_x min(p_i(x), q_i(x))``, and the tokens emitted at a rejection against
``normalize(max(p - q, 0))``. A round of a generator that returns no q (:mod:`.loop_round`) has no
such theory: only its observed acceptance rate is reported.
"""

from __future__ import annotations

import numpy as np

from lossless_check.evidence.analysis import strata
from lossless_check.evidence.results import POWER, CaseResult
from lossless_check.laws.expected import ExactLaws
from lossless_check.modes.observations import Observations
from lossless_check.stats import Stratum, law_test


def residual_strata(obs: Observations, position: int, laws: ExactLaws) -> list[Stratum]:
    """Trials whose draft ``position + 1`` was rejected (not missing: a draft that stopped early
    ends in a token sampled from ``p``), against ``normalize(max(p - q, 0))``.

    ``q`` is the processed drafter table, the law a correct drafter samples from.
    """
    rejected = obs.emitted[(obs.n_matches == position) & (obs.drafts > position)]
    return strata(rejected, position, laws.residual, laws.scenario.vocab_size)


def diagnose(result: CaseResult, obs: Observations, laws: ExactLaws, positions: int, alpha_position: float,
             verified: bool = True) -> None:
    """Set ``result``'s acceptance figures and ``diagnostics`` (the checks that reject at
    ``alpha_position``, a position's share of the case's alpha; ``positions``: the scenario's
    ``gamma + 1``). ``verified``: whether the trials' drafts went through the verifier with a q."""
    diagnostics: list[str] = []
    result.diagnostics = diagnostics
    result.acceptance_rate = float(obs.n_matches.sum() / max(obs.drafts.sum(), 1))
    if not verified:
        return
    for j in range(min(positions - 1, obs.gamma)):
        residual = law_test(residual_strata(obs, j, laws), alpha_position, POWER)
        entry = result.positions[j]
        entry["residual_samples"], entry["residual_tv"] = residual.n, residual.statistic
        entry["residual_p_value"] = residual.pvalue
        if residual.n and residual.rejects(alpha_position):
            diagnostics.append(f"residual@{j + 1}")
    width = obs.gamma + 1
    result.acceptance_law = (np.bincount(obs.n_matches, minlength=width) / len(obs.n_matches)).tolist()
    # The theory is for drafts of one length; a drafter that stops early (at EOS) has no such law.
    law = laws.acceptance_law(obs.gamma) if obs.drafts.min() == obs.gamma else None
    if law is not None:
        result.expected_acceptance_rate = law.mean_acceptance_rate
        result.expected_acceptance_law = law.probabilities.tolist()
        counts = np.bincount(obs.n_matches, minlength=width)
        alpha = alpha_position * positions
        acceptance = law_test([Stratum(counts, law.probabilities)], alpha, POWER)
        result.acceptance_p_value = acceptance.pvalue
        result.acceptance_statistic = acceptance.statistic
        if acceptance.rejects(alpha):
            diagnostics.append("acceptance_law")


__all__ = ["diagnose", "residual_strata"]
