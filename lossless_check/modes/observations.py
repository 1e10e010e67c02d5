"""What the trials of the statistical modes emit, as arrays the analysis reads: step mode's
:class:`Observations` and generate mode's :class:`Generations`."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Observations:
    """What step-mode trials emitted. ``emitted[t, j]`` is -1 past the end of trial ``t``;
    ``drafts[t]`` is its draft length (a drafter may stop early, at EOS); ``impossible[t]`` counts
    its drafts that their returned q gives probability 0; ``replayed[t]`` says whether trial ``t``, a
    row of a batched call, was replayed at batch 1 (:mod:`.replay`). ``verifier_substituted[t]``: the
    verifier's draw of trial ``t`` was made by inverse CDF; ``drafts_substituted[t]``: its row's share
    (the call's count over its rows) of the draft tokens its batched call drew so (:mod:`.interception`)."""

    emitted: np.ndarray
    n_matches: np.ndarray
    drafts: np.ndarray
    impossible: np.ndarray
    replayed: np.ndarray
    seconds: float
    verifier_substituted: np.ndarray | None = None
    drafts_substituted: np.ndarray | None = None

    def __post_init__(self):
        # A chunk kept by a release of the harness before these fields has none: nothing counted.
        trials = len(self.n_matches)
        if self.verifier_substituted is None:
            self.verifier_substituted = np.zeros(trials, dtype=bool)
        if self.drafts_substituted is None:
            self.drafts_substituted = np.zeros(trials)

    @property
    def substituted_draws(self) -> dict[str, int]:
        """The draws made by inverse CDF (``CaseResult.substituted_draws``)."""
        return {"verifier": int(self.verifier_substituted.sum()), "batched_drafts": round(float(self.drafts_substituted.sum()))}

    @property
    def gamma(self) -> int:
        """The longest draft."""
        return self.emitted.shape[1] - 1

    @property
    def impossible_drafts(self) -> int:
        return int(self.impossible.sum())

    @classmethod
    def concatenate(cls, parts: list["Observations"]) -> "Observations":
        width = max(p.emitted.shape[1] for p in parts)
        return cls(
            np.concatenate([widen(p.emitted, width) for p in parts]),
            np.concatenate([p.n_matches for p in parts]),
            np.concatenate([p.drafts for p in parts]),
            np.concatenate([p.impossible for p in parts]),
            np.concatenate([p.replayed for p in parts]),
            sum(p.seconds for p in parts),
            np.concatenate([_kept(p, "verifier_substituted", bool) for p in parts]),
            np.concatenate([_kept(p, "drafts_substituted", np.float64) for p in parts]),
        )

    def head(self, trials: int) -> "Observations":
        """The first ``trials`` trials (the seconds scaled to them)."""
        return Observations(self.emitted[:trials], self.n_matches[:trials], self.drafts[:trials],
                            self.impossible[:trials], self.replayed[:trials], self.seconds * trials / len(self.n_matches),
                            self.verifier_substituted[:trials], self.drafts_substituted[:trials])


def _kept(observations: Observations, name: str, dtype) -> np.ndarray:
    """Per-trial counts of ``observations``, zeros for a chunk pickled before the field existed (unpickling
    restores the instance's own attributes and skips ``__post_init__``)."""
    value = observations.__dict__.get(name)
    return np.zeros(len(observations.n_matches), dtype=dtype) if value is None else value


def widen(emitted: np.ndarray, width: int) -> np.ndarray:
    """``emitted`` padded with -1 (nothing emitted) to ``width`` columns."""
    return np.pad(emitted, ((0, 0), (0, width - emitted.shape[1])), constant_values=-1)


@dataclass
class Generations:
    """What the generate() calls emitted. ``emitted[t, k]`` is -1 past the end of sample ``t``;
    ``violates[t]``: sample ``t`` breaks the length/EOS rules of plain sampling."""

    emitted: np.ndarray
    rounds: np.ndarray
    violates: np.ndarray
    seconds: float
    # ``aside[t]``: the output position of a draft the verifier accepted with its own p = 0 in sample
    # ``t`` (:func:`~lossless_check.evidence.attribution.watching_verifier`), else -1.
    aside: np.ndarray | None = None
    # ``filled[t]``: sample ``t`` drafted into a target row past ``max_length`` with no token left,
    # given zero logits (:mod:`~lossless_check.modes.past_budget`).
    filled: np.ndarray | None = None

    def __post_init__(self):
        if self.aside is None:
            self.aside = np.full(len(self.rounds), -1, dtype=np.int64)
        if self.filled is None:
            self.filled = np.zeros(len(self.rounds), dtype=bool)

    @property
    def stopping_violations(self) -> int:
        return int(self.violates.sum())

    @classmethod
    def concatenate(cls, parts: list["Generations"]) -> "Generations":
        arrays = {f: np.concatenate([getattr(p, f) for p in parts]) for f in ("emitted", "rounds", "violates", "aside")}
        # A chunk kept by a release of the harness before ``filled`` has none (its class default).
        arrays["filled"] = np.concatenate([p.filled if p.filled is not None else np.zeros(len(p.rounds), dtype=bool)
                                           for p in parts])
        return cls(**arrays, seconds=sum(p.seconds for p in parts))

    def head(self, trials: int) -> "Generations":
        """The first ``trials`` samples (their share of the time)."""
        share = trials / len(self.rounds) if len(self.rounds) else 0.0
        return Generations(self.emitted[:trials], self.rounds[:trials], self.violates[:trials], self.seconds * share,
                           self.aside[:trials], self.filled[:trials])

    def before_eos(self, eos: frozenset[int]) -> np.ndarray:
        """``emitted`` with every token after an EOS blanked (-1): plain sampling has no law there, and
        the stopping check already counts such samples."""
        emitted = self.emitted.copy()
        if eos:
            stopped = np.cumsum(np.isin(emitted, list(eos)), axis=1) > 0
            emitted[:, 1:][stopped[:, :-1]] = -1
        return emitted
