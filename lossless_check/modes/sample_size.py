"""The sample size a run needs: how many trials per case let each statistical case detect a given TV
(``--detect-tv``), with the run's alpha split as the run splits it.
"""

from __future__ import annotations


def samples_to_detect(cases, tv: float, alpha: float, max_new_tokens: int = 4, sequential: bool = False) -> int:
    """Samples per case so that each statistical case detects ``tv`` at position 1 with power 0.99.

    The run's alpha is split over the cases that can give evidence (not skipped, not vacuous by the
    exact laws), as :func:`~lossless_check.faces.api.run_cases` splits it.

    A sequential run gives its fixed-sample test half of each case's alpha (the anytime test has the
    other half), and a clean case stops exactly there. A batched step case's guarantee for batch-1
    calls adds what its replays leave unproven (:func:`~lossless_check.modes.replay.replay_detectable_tv`),
    and its replays grow with its trials: the smallest count where the sum is at most ``tv``.
    """
    from lossless_check.evidence.analysis import tested_cells
    from lossless_check.evidence.results import POWER
    from lossless_check.modes import skip_reason
    from lossless_check.modes.batching import STAGE_POWER
    from lossless_check.modes.informativeness import evidence_plan
    from lossless_check.modes.replay import replay_detectable_tv, total_replays
    from lossless_check.stats import verdict_detectable_tv, verdict_samples_for_tv

    statistical = [c for c in cases if c.mode not in ("provenance", "greedy")] or cases
    positions = max(max_new_tokens if c.mode == "generate" else c.scenario.gamma + 1 for c in statistical)
    vocab = max(tested_cells(c.scenario.vocab_size) for c in statistical)
    # As run_cases splits the alpha: over the cases that can give evidence.
    sharing = sum(i != [] and skip_reason(c) is None for c, i in zip(statistical, evidence_plan(statistical)))
    alpha_position = alpha / max(1, sharing) / positions / (2 if sequential else 1)
    samples = verdict_samples_for_tv(tv, vocab, alpha_position, POWER)
    if not any(c.mode in ("step", "all") for c in statistical):
        return samples

    def detectable(n: int) -> float:
        # A batched case states its figure at STAGE_POWER (it may also move to a batch-1 stage).
        return (verdict_detectable_tv([n], vocab, None, alpha_position, STAGE_POWER)
                + replay_detectable_tv(total_replays(n), STAGE_POWER))

    low, high = samples - 1, samples
    while detectable(high) > tv:
        low, high = high, 2 * high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if detectable(mid) <= tv else (mid, high)
    return high
