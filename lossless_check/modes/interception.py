"""The interception of sampling primitives: what a generator drew from, recorded while its call runs.

While active, :class:`Interception` records ``torch.multinomial`` / ``Tensor.multinomial``,
``Categorical.sample``, vocabulary-wide ``argmax`` and the noise sources of Gumbel-max sampling; the
provenance check (:mod:`lossless_check.modes.provenance`) matches them to draft tokens, and the replays
(:mod:`lossless_check.modes.replay`) force them.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from types import CodeType

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


#: The vocabulary from which the installed verifier's draw is made by inverse CDF (:class:`VerifierDraws`):
#: measured on one CPU core, torch's kernel and the inverse CDF cost the same at V = 8, and torch's
#: twice as much at 1,024, 13 times at 32,000.
ONE_ROW_FROM_VOCAB = 1024
#: The weight dtypes the inverse CDF stands in for torch's kernel on. For float32 and float64 rows both
#: draw token ``i`` with probability ``w_i / sum(w)`` up to float64 round-off (``tests/test_verifier_draws.py``
#: measures it on the installed verifier's residual and bonus draws). Not for half precision: torch's own
#: kernel on a bfloat16 row is biased (0.50122 for a token of weight 0.5, z = 3.5), and that bias is
#: part of what a run on such rows must see, so those rows keep torch's kernel.
EXACT_DTYPES = (torch.float32, torch.float64)


@dataclass
class DrawTally:
    """How many tokens a substitution drew by inverse CDF instead of ``torch.multinomial``."""

    substituted: int = 0
    _taken: int = 0

    def take(self) -> int:
        """The tokens substituted since the last ``take()``."""
        new, self._taken = self.substituted - self._taken, self.substituted
        return new


def inverse_cdf_tokens(weights: torch.Tensor) -> torch.Tensor:
    """One token per row of a 2-D matrix of finite, non-negative weights with positive row sums, by
    inverse CDF in float64: ``searchsorted(cumsum(w), u * sum(w), right=True)``, ``u`` uniform in [0, 1)
    from torch's global stream. Token ``i`` comes out with probability ``w_i / sum(w)`` up to float64
    round-off (a zero weight is an empty interval, never drawn)."""
    cdf = weights.detach().to(torch.float64).cumsum(-1)
    total = cdf[:, -1:]
    # u <= 1 - 2^-53, so u * sum(w) rounds below sum(w): the index is a token's, never V.
    return torch.searchsorted(cdf, torch.rand(total.shape, dtype=torch.float64) * total, right=True)


def _substitutable(args, kwargs, min_rows: int) -> bool:
    """Whether a ``multinomial`` call is one token a row of at least ``min_rows`` rows of float32/float64
    CPU weights, valid (finite, non-negative, each row summing above zero), with nothing else asked."""
    weights = call_argument(args, kwargs, 0, "input")
    if (len(args) + len(kwargs) > 3 or set(kwargs) - {"input", "num_samples", "replacement"}
            or call_argument(args, kwargs, 1, "num_samples") != 1 or not isinstance(weights, torch.Tensor)
            or weights.dim() != 2 or weights.shape[1] < 1 or weights.dtype not in EXACT_DTYPES
            or weights.shape[0] < min_rows or weights.device.type != "cpu" or not float(weights.amin()) >= 0):
        return False  # NaN: not >= 0
    totals = weights.detach().to(torch.float64).sum(-1)  # NaN or inf in a row makes its sum so
    return bool((torch.isfinite(totals) & (totals > 0)).all())


def inverse_cdf_multinomial(original, tally: DrawTally | None = None):
    """``torch.multinomial`` (or ``Tensor.multinomial``) drawing one token a row of a 2-D matrix of at
    least two rows of float32/float64 weights by :func:`inverse_cdf_tokens` (the law ``torch.multinomial``
    samples; on CPU at V = 49,152 about a tenth of its kernel's cost, which draws an exponential per
    token), each such token counted in ``tally``. Anything else goes to ``original``, which draws (or
    raises) as it would: several tokens, one row, another dtype, a private ``generator``, ``out=``, a
    weight that is negative, NaN or infinite, a row that sums to zero.
    """
    def sample(*args, **kwargs):
        if not _substitutable(args, kwargs, min_rows=2):
            return original(*args, **kwargs)
        weights = call_argument(args, kwargs, 0, "input")
        if tally is not None:
            tally.substituted += weights.shape[0]
        return inverse_cdf_tokens(weights)

    return sample


@lru_cache(maxsize=None)
def verifier_draw_site(code: CodeType) -> int | None:
    """The line of ``code`` (the installed ``_speculative_sampling``'s) whose ``torch.multinomial`` call
    draws the residual or bonus token: the one line of its source calling ``torch.multinomial(p_prime,
    num_samples=1)``, as every release from 4.37 to 5.25 does; ``None`` if there is not exactly one (a
    release that draws otherwise keeps torch's kernel)."""
    import inspect

    try:
        lines, start = inspect.getsourcelines(code)
    except (OSError, TypeError):
        return None
    sites = [start + i for i, line in enumerate(lines)
             if re.search(r"\btorch\.multinomial\(\s*p_prime\s*,\s*num_samples\s*=\s*1\s*\)", line)]
    return sites[0] if len(sites) == 1 else None


class VerifierDraws:
    """While active, the installed ``_speculative_sampling``'s residual or bonus draw (the one
    ``torch.multinomial`` call of :func:`verifier_draw_site`, one token from one row) is made by
    :func:`inverse_cdf_tokens` where the row holds :data:`ONE_ROW_FROM_VOCAB` or more float32/float64
    weights (0.05 ms against torch's 0.65 ms at V = 32,000): the same law. Every other call, from
    anywhere else (the generator's own draws included), of another dtype or a smaller vocabulary, and
    every call at all with ``torch_draws``, is torch's own. :attr:`tally` counts the substituted draws.

    The call site is recognised by the caller's frame: its code object must be the installed
    verifier's (:func:`~lossless_check.core.compat.installed_verifier`) and its line the draw's."""

    def __init__(self, vocab_size: int, torch_draws: bool = False):
        self.active = vocab_size >= ONE_ROW_FROM_VOCAB and not torch_draws
        self.tally = DrawTally()
        self._undo = None

    def __enter__(self) -> "VerifierDraws":
        if not self.active:
            return self
        from lossless_check.core.compat import installed_verifier

        code = installed_verifier().__code__
        line = verifier_draw_site(code)
        if line is None:
            return self
        original, tally = torch.multinomial, self.tally

        def multinomial(*args, **kwargs):
            caller = sys._getframe(1)
            if caller.f_code is not code or caller.f_lineno != line or not _substitutable(args, kwargs, min_rows=1):
                return original(*args, **kwargs)
            tally.substituted += 1
            return inverse_cdf_tokens(call_argument(args, kwargs, 0, "input"))

        self._undo = replace_attribute(torch, "multinomial", multinomial)
        return self

    def __exit__(self, *exc) -> None:
        if self._undo is not None:
            self._undo()
            self._undo = None
