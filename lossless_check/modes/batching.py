"""How step mode batches its trials: the decision per case, and the rows of a batched call.

The real loop only ever drafts one row. A case tries batched calls where the rows of one real
``get_candidates`` call can be independent first rounds: a built-in family whose adapter says it
can draft several rows in one call on this release (``batchable``; Universal, DifferentTokenizers
and prompt lookup read row 0 only), and a user's factory. Whether the rows really behave as batch-1
calls is never taken from that flag: every batched case replays rows of its own calls at batch 1
(:mod:`.replay`) and runs at batch 1 at the first difference.

**Batched rows never fail a case.** A batched stage that would fail (an exact failure, or a law test
at the case's alpha) starts the case again at batch 1 with its whole alpha, and only that stage's
result can be ``not_lossless`` (:meth:`~.step.StepRun._batch_1_only`): a false failure needs a
batch-1 test to reject, at most alpha. Power: a case that starts batched has two stages that may
miss a bug, the batched one (its rows, and its replays) and the batch-1 one it moves to, so each
states its ``tv_detectable`` at :data:`STAGE_POWER`; a bug at or above the stated figure is then
missed with probability at most ``(1 - STAGE_POWER) + (1 - STAGE_POWER) = 1 - POWER`` by the
union bound, whatever the two stages' dependence.
"""

from __future__ import annotations

import torch

from lossless_check.evidence.results import POWER

#: Rows per real ``get_candidates`` call in a batched case (at most; see :func:`rows_per_call`).
BATCH_SIZE = 512
#: Logits a batched call's ``(rows, vocabulary)`` tensors may hold: 128 rows at V = 32,000, 64 at 49,152.
#: A larger tensor is over glibc's largest mmap threshold (32 MiB), so every processor and softmax
#: over it maps fresh pages; measured per row on 2 cores, top-p over 32,000 logits took 4.3 ms at 512
#: rows and 3.6 ms at 128, torch.multinomial over 49,152 1.42 ms and 1.23 ms.
CALL_LOGITS = 2**22
#: The power each stage of a case that starts batched states its ``tv_detectable`` at (module docstring).
STAGE_POWER = 1.0 - (1.0 - POWER) / 2


def family_flag(adapter, name: str) -> bool:
    """An adapter's capability flag (an attribute, or a method of the installed release)."""
    value = getattr(adapter, name, False)
    return bool(value() if callable(value) else value)


def decide_batching(generator, requested: int) -> tuple[int, str]:
    """``(rows per call, why)`` for a resolved generator before any trial; 1 runs at batch 1."""
    adapter = generator.adapter
    if requested <= 1:
        return 1, "batch 1 as requested"
    if adapter.name != "factory" and not family_flag(adapter, "batchable"):
        return 1, f"batch 1: {adapter.name} cannot draft several rows in one call on this release"
    return requested, "batched: rows replayed at batch 1 match"


def rows_per_call(requested: int, vocab_size: int) -> int:
    """Rows of a batched call: ``requested``, cut to a power of two whose ``(rows, vocabulary)`` logits fit
    :data:`CALL_LOGITS` (at least 16). What a batched call proves does not depend on its rows."""
    fit = 1 << max(4, (CALL_LOGITS // max(vocab_size, 1)).bit_length() - 1)
    return max(1, min(requested, fit))


def draft_lengths(drafted: torch.Tensor, eos: frozenset[int], stops_at_eos: bool) -> list[int]:
    """Each row's draft length in a batched call.

    A family whose drafts come from the assistant's own ``generate()`` (``stops_at_eos``) ends a
    draft at EOS when it drafts alone, while ``generate()`` pads a finished row of a batch (with
    EOS, as the stubs set no pad token): such a row is read up to its first EOS, which is what the
    call at batch 1 returns (``tests/test_batching.py``; every batched case's replays check it again).
    """
    gamma = drafted.shape[1]
    if not eos or not stops_at_eos:
        return [gamma] * drafted.shape[0]
    is_eos = torch.isin(drafted, torch.tensor(sorted(eos)))
    first = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1) + 1, gamma)
    return first.tolist()
