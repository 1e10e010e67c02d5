"""The verifier's ``new_logits`` in step mode: the target's logits at every candidate position, processed.

As ``_assisted_decoding`` computes them: the target's forward pass over the candidate, upcast to
float32, each position processed by the real ``LogitsProcessorList`` with the candidate prefix as
history. They are a deterministic function of the candidate (fixed tables, deterministic processors),
so they are computed once and kept: per candidate, or, under a
:func:`~lossless_check.laws.expected.history_free` stack, per table row.
"""

from __future__ import annotations

import numpy as np
import torch

from lossless_check.laws.expected import history_free, processed
from lossless_check.laws.tables import FixedLogits

#: Memory the per-case cache of processed target logits by candidate may hold.
TARGET_CACHE_BYTES = 256 * 2**20


class TargetLogits:
    """Processed target logits of a case's candidates, computed once each (:meth:`of`)."""

    def __init__(self, table: FixedLogits, target, processors, prompt_ids: torch.Tensor):
        self.table, self.target, self.processors, self.prompt_ids = table, target, processors, prompt_ids
        self._by_candidate: dict[tuple[int, ...], torch.Tensor] = {}
        #: Under a history-free stack, processed rows by table row.
        self.by_row: dict[int, torch.Tensor] | None = {} if history_free(processors) else None

    def of(self, candidate_ids: torch.Tensor) -> torch.Tensor:
        """``new_logits`` for a one-row candidate, a tensor the verifier may modify.

        A small vocabulary has few distinct candidates: each is computed once per case and process
        (up to :data:`TARGET_CACHE_BYTES`: a large vocabulary has many distinct, large ones) and
        copied for every trial. Under a history-free stack a processed position depends only on the
        table row the target emits there: rows are kept instead (a handful at V = 49,152, where a
        candidate's processing costs about 1 ms), and a candidate whose rows are all kept is put
        together from them.
        """
        if self.by_row is not None:
            return self._from_rows(candidate_ids)
        key = tuple(candidate_ids[0].tolist())
        kept = self._by_candidate.get(key)
        if kept is None:
            kept = self.computed(candidate_ids)
            if (len(self._by_candidate) + 1) * kept.numel() * kept.element_size() <= TARGET_CACHE_BYTES:
                self._by_candidate[key] = kept
            return kept
        return kept.clone()

    def _from_rows(self, candidate_ids: torch.Tensor) -> torch.Tensor:
        length = self.prompt_ids.shape[1]
        positions = candidate_ids.shape[1] - length + 1
        rows = self.table.row_index(np.arange(positions), candidate_ids[0, length - 1 :].numpy())
        kept = [self.by_row.get(int(row)) for row in rows]
        if all(part is not None for part in kept):
            return torch.stack(kept)[None]
        logits = self.computed(candidate_ids)
        for i, row in enumerate(rows):
            self.by_row.setdefault(int(row), logits[0, i].clone())
        return logits

    def computed(self, candidate_ids: torch.Tensor) -> torch.Tensor:
        """:meth:`of` computed afresh: the target's forward pass, then the processors."""
        length, gamma = self.prompt_ids.shape[1], candidate_ids.shape[1] - self.prompt_ids.shape[1]
        logits = self.target(candidate_ids).logits[:, -gamma - 1 :].to(torch.float32)
        for i in range(gamma + 1):
            logits[:, i, :] = processed(self.processors, candidate_ids[:, : length + i], logits[:, i, :])
        return logits
