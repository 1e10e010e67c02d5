"""The interception of sampling primitives: what a generator drew from, recorded while its call runs.

While active, :class:`Interception` records ``torch.multinomial`` / ``Tensor.multinomial``,
``Categorical.sample``, vocabulary-wide ``argmax`` and the noise sources of Gumbel-max sampling; the
provenance check (:mod:`lossless_check.modes.provenance`) matches them to draft tokens, and the replays
(:mod:`lossless_check.modes.replay`) force them.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from lossless_check.core.patching import call_argument, replace_attribute

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

    def _patch(self, owner, name, record, sampler=None) -> None:
        """Patch ``owner.name``: ``record`` sees each outermost call's result; ``sampler(original)``, where
        given, makes the call instead of the original."""
        original = getattr(owner, name)
        call = original if sampler is None else sampler(original)

        def wrapper(*args, **kwargs):
            if self._depth:
                return original(*args, **kwargs)
            self._depth += 1
            try:
                out = call(*args, **kwargs)
                replaced = record(out, args, kwargs)
            finally:
                self._depth -= 1
            return out if replaced is None else replaced

        self._undo.append(replace_attribute(owner, name, wrapper))

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


#: The vocabulary from which one row's draw is also made by inverse CDF (:func:`inverse_cdf_multinomial`):
#: measured on one CPU core, torch's kernel and the inverse CDF cost the same at V = 8, and torch's
#: twice as much at 1,024, 13 times at 32,000.
ONE_ROW_FROM_VOCAB = 1024


def inverse_cdf_multinomial(original, one_row: bool = False):
    """``torch.multinomial`` (or ``Tensor.multinomial``) drawing one token a row of a 2-D weight matrix
    by inverse CDF in float64: ``searchsorted(cumsum(w), u * sum(w), right=True)``, ``u`` uniform in [0, 1).

    Token ``i`` comes out with probability ``w_i / sum(w)`` up to float64 round-off (a zero weight is an
    empty interval, never drawn), which is the law ``torch.multinomial`` samples; on CPU at V = 49,152 it
    costs about a tenth of torch's kernel, which draws an exponential per token. Anything else goes to
    ``original``, which draws (or raises) as it would: several tokens, one row (unless ``one_row`` and
    the row holds :data:`ONE_ROW_FROM_VOCAB` weights or more), a private ``generator``, ``out=``, a
    weight that is negative, NaN or infinite, a row that sums to zero.
    """
    def sample(*args, **kwargs):
        weights = call_argument(args, kwargs, 0, "input")
        if (len(args) + len(kwargs) > 3 or set(kwargs) - {"input", "num_samples", "replacement"}
                or call_argument(args, kwargs, 1, "num_samples") != 1 or not isinstance(weights, torch.Tensor)
                or weights.dim() != 2 or weights.shape[1] < 1 or not weights.is_floating_point()
                or weights.shape[0] < (1 if one_row and weights.shape[1] >= ONE_ROW_FROM_VOCAB else 2)
                or weights.device.type != "cpu" or not float(weights.amin()) >= 0):  # NaN: not >= 0
            return original(*args, **kwargs)
        cdf = weights.detach().to(torch.float64).cumsum(-1)
        total = cdf[:, -1:]  # NaN or inf in a row ends its cumulative sum there
        if not bool((torch.isfinite(total) & (total > 0)).all()):
            return original(*args, **kwargs)
        # u <= 1 - 2^-53, so u * sum(w) rounds below sum(w): the index is a token's, never V.
        return torch.searchsorted(cdf, torch.rand(total.shape, dtype=torch.float64) * total, right=True)

    return sample


@contextmanager
def one_row_draws_by_inverse_cdf(vocab_size: int):
    """While active, at a vocabulary of :data:`ONE_ROW_FROM_VOCAB` or more (below it, nothing changes), a
    ``torch.multinomial`` draw of one token from one row of that many weights is made by
    :func:`inverse_cdf_multinomial` (the same law: 0.05 ms against torch's 0.65 ms at V = 32,000), and
    every other call by torch. Step mode verifies its rows under it: the installed ``_speculative_sampling``
    draws its residual or bonus token from one such row, by ``torch.multinomial``."""
    if vocab_size < ONE_ROW_FROM_VOCAB:
        yield
        return
    undo = [replace_attribute(owner, "multinomial", inverse_cdf_multinomial(owner.multinomial, one_row=True))
            for owner in (torch, torch.Tensor)]
    try:
        yield
    finally:
        for restore in reversed(undo):
            restore()
