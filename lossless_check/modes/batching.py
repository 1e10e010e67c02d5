"""How step mode batches its trials: the decision per case, the batch-1 arm, rows of a batched call.

The real loop only ever drafts one row. A case is batched only where the rows of one real
``get_candidates`` call are independent first rounds, each like a batch-1 call:

- a built-in family when its adapter says so (``batchable``, proven per family and release by
  ``tests/test_batching.py``);
- a user's own generator (a subclass, or a factory) when :func:`rows_consistent` finds each row's
  returned ``q`` a function of that row's own drafts, the same in a batched call and at batch 1.

Every batched case also keeps a batch-1 arm (:func:`batch1_trials_per_chunk`), and the analysis
tests the two arms against each other.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from ..engine import chunk_sizes
from ..errors import GeneratorFailure, NotApplicable

#: Rows per real ``get_candidates`` call in the batched arm.
BATCH_SIZE = 512
#: The batch-1 arm: this share of a case's trials, and at least this many.
BATCH1_SHARE = 1 / 25
MIN_BATCH1_TRIALS = 200

Draft = Callable[[int], tuple[torch.Tensor, torch.Tensor]]


def batch1_trials_per_chunk(samples: int) -> list[int]:
    """Batch-1 trials in each chunk: :data:`BATCH1_SHARE` of the case (at least
    :data:`MIN_BATCH1_TRIALS`), spread over the chunks in proportion to their sizes."""
    total = min(samples, max(MIN_BATCH1_TRIALS, round(samples * BATCH1_SHARE)))
    cumulative = np.cumsum(chunk_sizes(samples))
    upto = [round(total * c / samples) for c in cumulative]
    return [b - a for a, b in zip([0] + upto[:-1], upto)]


def family_flag(adapter, name: str) -> bool:
    """An adapter's capability flag (an attribute, or a method of the installed release)."""
    value = getattr(adapter, name, False)
    return bool(value() if callable(value) else value)


def decide_batching(generator, requested: int, draft: Draft, prompt_length: int) -> tuple[int, str]:
    """``(rows per call in the batched arm, why)`` for a resolved generator; 1 runs at batch 1 only."""
    adapter = generator.adapter
    factory = adapter.name == "factory"
    if requested <= 1:
        return 1, "batch 1 as requested"
    if not factory and not family_flag(adapter, "batchable"):
        return 1, f"batch 1: {adapter.name} cannot draft several rows in one call on this release"
    if factory or generator.generator_class is not adapter.installed_class():
        inconsistent = rows_consistent(draft, prompt_length)
        if inconsistent is not None:
            return 1, f"batch 1: {inconsistent}"
        return requested, "batched: rows checked consistent with batch 1"
    return requested, f"batched: {adapter.name} drafts independent rows"


def rows_consistent(draft: Draft, prompt_length: int, calls: int = 8, rows: int = 16, seed: int = 0) -> str | None:
    """``None`` when every row's returned ``q`` at draft position ``j`` is a function of that row's
    first ``j`` drafts alone, the same in a batched call and at batch 1; else why not.

    The stubs are deterministic given the drafted prefix, so a generator whose rows are independent
    passes; one that mixes rows, or whose ``q`` depends on the batch, does not. The global random
    state is left as it was.
    """
    seen: dict[tuple, torch.Tensor] = {}
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        try:
            made = [draft(rows)]
        except (GeneratorFailure, NotApplicable) as exc:
            return f"a call on {rows} rows failed ({exc})"
        made += [draft(1) for _ in range(calls)]
    for candidate_ids, candidate_logits in made:
        for r in range(candidate_ids.shape[0]):
            drafts = candidate_ids[r, prompt_length:].tolist()
            for j in range(len(drafts)):
                key = (j, tuple(drafts[:j]))
                row = candidate_logits[r, j].float()
                if key in seen and not torch.allclose(seen[key], row, rtol=1e-5, atol=1e-5):
                    return f"rows of one call return different q for the same drafts (position {j + 1})"
                seen.setdefault(key, row)
    return None


def draft_lengths(drafted: torch.Tensor, eos: frozenset[int], stops_at_eos: bool) -> list[int]:
    """Each row's draft length in a batched call.

    A family whose drafts come from the assistant's own ``generate()`` (``stops_at_eos``) ends a
    draft at EOS when it drafts alone, while ``generate()`` pads a finished row of a batch (with
    EOS, as the stubs set no pad token): such a row is read up to its first EOS, which is what the
    call at batch 1 returns (``tests/test_batching.py``; the batch-1 arm and the two-sample test
    check it again in every case).
    """
    gamma = drafted.shape[1]
    if not eos or not stops_at_eos:
        return [gamma] * drafted.shape[0]
    is_eos = torch.isin(drafted, torch.tensor(sorted(eos)))
    first = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, gamma)
    return first.tolist()
