"""What a candidate generator returns, checked before anything is verified.

A generator that returns malformed output gets verdict ``error`` with a one-line reason
(:class:`~lossless_check.core.errors.GeneratorFailure`), never a traceback and never a silent pass.
"""

from __future__ import annotations

import torch

from lossless_check.core.errors import GeneratorFailure


def check_candidates(input_ids, candidate_ids, candidate_logits, vocab_size: int, max_length: int) -> None:
    """Raise :class:`GeneratorFailure` if a generator's output for ``input_ids`` (``(B, L)``) is malformed.

    Expected: ``candidate_ids`` of shape ``(B, L + gamma)`` starting with ``input_ids``, tokens in
    the (target's) vocabulary, at most ``max_length`` long; ``candidate_logits`` ``None`` or of shape
    ``(B, gamma, vocab_size)`` with no NaN, no ``+inf`` and no row that is ``-inf`` everywhere, in
    any floating dtype (a bf16/fp16 q is what the verifier softmaxes, in that dtype). More columns
    than the target's vocabulary (a padded drafter head) is an error, as it is for the real verifier.
    """
    rows, length = input_ids.shape
    if not isinstance(candidate_ids, torch.Tensor) or candidate_ids.dim() != 2 or candidate_ids.shape[0] != rows:
        shape = tuple(candidate_ids.shape) if isinstance(candidate_ids, torch.Tensor) else type(candidate_ids).__name__
        raise GeneratorFailure(f"candidate_input_ids must be a ({rows}, length) tensor, got {shape}")
    if candidate_ids.shape[1] < length or not torch.equal(candidate_ids[:, :length].cpu(), input_ids.cpu()):
        raise GeneratorFailure("candidate_input_ids does not start with the input_ids it was given")
    if candidate_ids.shape[1] > max_length:
        raise GeneratorFailure(f"candidates run past max_length ({candidate_ids.shape[1]} > {max_length})")
    new = candidate_ids[:, length:]
    if bool(((new < 0) | (new >= vocab_size)).any()):
        raise GeneratorFailure(f"candidate token outside the vocabulary [0, {vocab_size})")
    if candidate_logits is None:
        return
    gamma = candidate_ids.shape[1] - length
    if (isinstance(candidate_logits, torch.Tensor) and candidate_logits.dim() == 3
            and tuple(candidate_logits.shape[:2]) == (rows, gamma) and candidate_logits.shape[2] > vocab_size):
        # A padded drafter head's q. Not a harness limitation: the real verifier cannot take it either
        # (5.24 _speculative_sampling, generation/utils.py line 4489, subtracts q from p and raises at
        # the first rejection); a generator must slice q to the target's columns, and may only if it
        # never drafts a padded id (fixtures/mutants/assisted_padded_vocabulary.py).
        raise GeneratorFailure(
            f"candidate_logits has {candidate_logits.shape[2]} columns for a target vocabulary of {vocab_size} "
            "(a padded drafter head?): _speculative_sampling raises on it at the first rejection (p - q)"
        )
    if not isinstance(candidate_logits, torch.Tensor) or tuple(candidate_logits.shape) != (rows, gamma, vocab_size):
        shape = tuple(candidate_logits.shape) if isinstance(candidate_logits, torch.Tensor) else "not a tensor"
        raise GeneratorFailure(f"candidate_logits has shape {shape}, expected {(rows, gamma, vocab_size)}")
    # One reduction on the common path: a row's max is finite unless the row holds NaN or +inf,
    # or is -inf everywhere.
    if gamma == 0 or bool(torch.isfinite(candidate_logits.amax(dim=-1)).all()):
        return
    if torch.isnan(candidate_logits).any():
        raise GeneratorFailure("candidate_logits contains NaN")
    if torch.isposinf(candidate_logits).any():
        raise GeneratorFailure("candidate_logits contains +inf")
    raise GeneratorFailure("candidate_logits has a row that is -inf everywhere")
