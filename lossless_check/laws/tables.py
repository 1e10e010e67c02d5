"""Fixed logits tables: the exact distributions a stub model emits.

A table gives the next-token logits as a function of where the token lands and, optionally, of the
previous token. Three shapes are supported:

- ``iid``: one vector, used at every position;
- ``per_position``: one vector per generated position (row ``j`` is for the ``j``-th token after
  the prompt; positions past the last row reuse it);
- ``markov``: one vector per previous token (row ``t`` is used when the previous token is ``t``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from lossless_check.core.errors import UsageError

TableKind = Literal["iid", "per_position", "markov"]
TABLE_KINDS: tuple[str, ...] = ("iid", "per_position", "markov")

#: Dtypes a stub model may emit its logits in: float32, and the half precisions real models run in.
LOGITS_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class FixedLogits:
    """A logits table. ``rows`` is a float64 array of shape ``(n_rows, vocab_size)``.

    ``-inf`` entries are allowed (a token the model never emits); NaN and ``+inf`` are not, and a
    row must keep at least one finite entry. ``dtype`` is the dtype a stub model emits the logits in:
    the rows rounded to it (round to nearest even, as ``Tensor.to`` does) are what the model returns.
    """

    kind: TableKind
    rows: np.ndarray
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.kind not in TABLE_KINDS:
            raise UsageError(f"table kind must be one of {', '.join(TABLE_KINDS)}, got {self.kind!r}")
        try:
            rows = np.array(self.rows, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"logits table is not numeric: {exc}") from None
        if rows.ndim == 1:
            rows = rows[None, :]
        if rows.ndim != 2 or rows.shape[0] == 0 or rows.shape[1] == 0:
            raise UsageError(f"logits table must be a non-empty 1-D or 2-D array, got shape {rows.shape}")
        if rows.shape[1] < 2:
            raise UsageError("logits table needs a vocabulary of at least 2 tokens")
        if np.isnan(rows).any():
            raise UsageError("logits table contains NaN")
        if np.isposinf(rows).any():
            raise UsageError("logits table contains +inf")
        if not np.isfinite(rows).any(axis=1).all():
            raise UsageError("logits table has a row where every entry is -inf")
        if self.dtype not in LOGITS_DTYPES:
            raise UsageError(f"logits dtype must be one of {', '.join(LOGITS_DTYPES)}, got {self.dtype!r}")
        if self.kind == "iid" and rows.shape[0] != 1:
            raise UsageError(f"an iid table has exactly one row, got {rows.shape[0]}")
        if self.kind == "markov" and rows.shape[0] != rows.shape[1]:
            raise UsageError(f"a markov table needs one row per token ({rows.shape[1]}), got {rows.shape[0]}")
        rows.setflags(write=False)
        object.__setattr__(self, "rows", rows)

    @classmethod
    def iid(cls, vector: Sequence[float]) -> "FixedLogits":
        return cls("iid", np.asarray(vector, dtype=np.float64)[None, :])

    @classmethod
    def per_position(cls, rows: Sequence[Sequence[float]]) -> "FixedLogits":
        return cls("per_position", np.asarray(rows, dtype=np.float64))

    @classmethod
    def markov(cls, rows: Sequence[Sequence[float]]) -> "FixedLogits":
        return cls("markov", np.asarray(rows, dtype=np.float64))

    @property
    def vocab_size(self) -> int:
        return int(self.rows.shape[1])

    @property
    def torch_dtype(self):
        """The ``torch.dtype`` the stub models emit these logits in."""
        import torch

        return getattr(torch, self.dtype)

    def in_dtype(self, dtype: str) -> "FixedLogits":
        """The same table, emitted in ``dtype``."""
        return FixedLogits(self.kind, self.rows, dtype)

    def emitted_rows(self):
        """All rows as the stub models hold and return them: a ``(n_rows, vocab_size)`` tensor in :attr:`dtype`.

        One conversion, float64 to :attr:`dtype`, shared by the stubs and the exact laws, so the laws
        are those of the logits the models really return.
        """
        import torch

        return torch.tensor(self.rows, dtype=torch.float64).to(self.torch_dtype)

    def emitted(self, generated_index: int, previous_token: int):
        """The logits a stub model returns for one position: a ``(vocab_size,)`` tensor in :attr:`dtype`."""
        import torch

        idx = int(self.row_index(np.asarray([generated_index]), np.asarray([previous_token]))[0])
        # Elementwise, so one row converted alone is bitwise that row of emitted_rows().
        return torch.tensor(self.rows[idx], dtype=torch.float64).to(self.torch_dtype)

    def row_index(self, generated_index: np.ndarray, previous_token: np.ndarray) -> np.ndarray:
        """Row used for the token at ``generated_index`` (0 = first token after the prompt)."""
        if self.kind == "iid":
            return np.zeros_like(generated_index)
        if self.kind == "per_position":
            return np.clip(generated_index, 0, self.rows.shape[0] - 1)
        return previous_token

    def logits(self, generated_index: int, previous_token: int) -> np.ndarray:
        """The float64 logits vector for one position."""
        idx = self.row_index(np.asarray([generated_index]), np.asarray([previous_token]))[0]
        return self.rows[idx]
