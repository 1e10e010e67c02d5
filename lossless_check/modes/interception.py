"""The interception of sampling primitives: what a generator drew from, recorded while its call runs.

While active, :class:`Interception` records ``torch.multinomial`` / ``Tensor.multinomial``,
``Categorical.sample``, vocabulary-wide ``argmax`` and the noise sources of Gumbel-max sampling; the
provenance check (:mod:`lossless_check.modes.provenance`) matches them to draft tokens, and the replays
(:mod:`lossless_check.modes.replay`) force them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

#: Largest total variation between the sampled row and ``softmax(returned candidate_logits)`` that
#: still counts as equal. Both sides are float32 softmaxes of (ideally) the same float32 logits (a
#: generator returning half-precision logits gets its q softmaxed in half precision, as the verifier does);
#: different kernels (row-wise vs batched, fused vs not) differ by a few float32 ulps per token,
#: relatively, so their total variation stays near 1e-6 whatever the vocabulary size (measured here:
#: below 1e-7). Total variation bounds every per-token absolute difference, and a difference within
#: it moves the acceptance probability sum_v min(p, q) by at most 1e-5, far below what any
#: statistical run resolves.
TOLERANCE = 1e-5

#: Draw kinds. A ``sample`` is a draw from its recorded row; a later sample without replacement is
#: not (the row's earlier draws were removed), so a draft token it produced cannot be checked.
SAMPLE, ARGMAX, WITHOUT_REPLACEMENT, NOISE = "sample", "argmax", "sample_without_replacement", "noise"


@dataclass(frozen=True)
class Draw:
    """One recorded token choice (or, for ``noise``, a vocabulary-wide random tensor)."""

    kind: str
    token: int | None = None
    row: torch.Tensor | None = None  # float64, normalised; only for sampled kinds


def call_argument(args, kwargs, index, name, default=None):
    return args[index] if len(args) > index else kwargs.get(name, default)


class Interception:
    """Context manager recording the sampling primitives called while it is active.

    Every patched function calls the original with the original arguments, so random streams are
    exactly those of an un-intercepted run, and returns its result unless the recorder returns a
    replacement (a subclass forcing draws; this class never does). Nested calls (``Categorical.sample``
    calls ``torch.multinomial``) are recorded once, at the outermost level.
    """

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.draws: list[Draw] = []
        self._depth = 0
        self._undo: list = []

    def __enter__(self) -> "Interception":
        from torch.distributions import Categorical

        patches = [
            (torch, "multinomial", self._multinomial),
            (torch.Tensor, "multinomial", self._multinomial),
            (Categorical, "sample", self._categorical),
            (torch, "argmax", self._argmax),
            (torch.Tensor, "argmax", self._argmax),
            (torch, "rand", self._noise),
            (torch, "rand_like", self._noise),
            (torch.Tensor, "uniform_", self._noise),
            (torch.Tensor, "exponential_", self._noise),
        ]
        for owner, name, record in patches:
            self._patch(owner, name, record)
        return self

    def __exit__(self, *exc) -> None:
        while self._undo:
            self._undo.pop()()

    def _patch(self, owner, name, record) -> None:
        original = getattr(owner, name)
        own = name in owner.__dict__  # Tensor methods live on TensorBase: restore by deleting

        def wrapper(*args, **kwargs):
            if self._depth:
                return original(*args, **kwargs)
            self._depth += 1
            try:
                out = original(*args, **kwargs)
                replaced = record(out, args, kwargs)
            finally:
                self._depth -= 1
            return out if replaced is None else replaced

        setattr(owner, name, wrapper)
        self._undo.append((lambda: setattr(owner, name, original)) if own else (lambda: delattr(owner, name)))

    def _rows(self, probs: torch.Tensor) -> torch.Tensor | None:
        if probs.dim() == 0 or probs.shape[-1] != self.vocab_size:
            return None
        rows = probs.detach().to(torch.float64).reshape(-1, self.vocab_size)
        return rows / rows.sum(-1, keepdim=True)  # multinomial takes unnormalised weights

    def _multinomial(self, out, args, kwargs) -> None:
        rows = self._rows(call_argument(args, kwargs, 0, "input"))
        if rows is None:
            return
        replacement = call_argument(args, kwargs, 2, "replacement", False)
        tokens = out.reshape(rows.shape[0], -1).tolist()
        for row, row_tokens in zip(rows, tokens):
            for s, token in enumerate(row_tokens):
                self.draws.append(Draw(SAMPLE if s == 0 or replacement else WITHOUT_REPLACEMENT, token, row))

    def _categorical(self, out, args, kwargs) -> None:
        rows = self._rows(args[0].probs)
        if rows is None:
            return
        # ``out`` is sample_shape + batch_shape: one draw per (sample, batch row), in that order.
        for sample in out.reshape(-1, rows.shape[0]).tolist():
            self.draws.extend(Draw(SAMPLE, token, row) for token, row in zip(sample, rows))

    def _argmax(self, out, args, kwargs) -> None:
        scores = call_argument(args, kwargs, 0, "input")
        dim = call_argument(args, kwargs, 1, "dim")
        if not scores.is_floating_point() or scores.dim() == 0 or scores.shape[-1] != self.vocab_size:
            return
        if dim in (-1, scores.dim() - 1) or (dim is None and scores.numel() == self.vocab_size):
            self.draws.extend(Draw(ARGMAX, token) for token in out.reshape(-1).tolist())

    def _noise(self, out, args, kwargs) -> None:
        if out.dim() and out.shape[-1] == self.vocab_size:
            self.draws.append(Draw(NOISE))
