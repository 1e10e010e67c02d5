"""What step-mode trials emit, as arrays the analysis reads."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Observations:
    """What step-mode trials emitted. ``emitted[t, j]`` is -1 past the end of trial ``t``;
    ``drafts[t]`` is its draft length (a drafter may stop early, at EOS); ``impossible[t]`` counts
    its drafts that their returned q gives probability 0; ``replayed[t]`` says whether trial ``t``, a
    row of a batched call, was replayed at batch 1 (:mod:`.replay`)."""

    emitted: np.ndarray
    n_matches: np.ndarray
    drafts: np.ndarray
    impossible: np.ndarray
    replayed: np.ndarray
    seconds: float

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
        )

    def head(self, trials: int) -> "Observations":
        """The first ``trials`` trials (the seconds scaled to them)."""
        return Observations(self.emitted[:trials], self.n_matches[:trials], self.drafts[:trials],
                            self.impossible[:trials], self.replayed[:trials], self.seconds * trials / len(self.n_matches))


def widen(emitted: np.ndarray, width: int) -> np.ndarray:
    """``emitted`` padded with -1 (nothing emitted) to ``width`` columns."""
    return np.pad(emitted, ((0, 0), (0, width - emitted.shape[1])), constant_values=-1)
