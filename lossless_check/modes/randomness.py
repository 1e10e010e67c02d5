"""Where a batched case's draws come from: randomness the batch-1 replays cannot see.

A replay (:mod:`.replay`) forces every vocabulary-wide ``torch.multinomial`` of a batch-1 call to
the token the batched call drew for that row (and its vocabulary-wide noise to the row's), and so proves what a batch-1 call returns *given*
those draws. That speaks for the real loop only if a real batch-1 call's draws are fresh draws,
from torch's global stream, from the laws the generator hands the sampler: a generator that seeds,
restores or privately generates its randomness during a call (``torch.manual_seed``, a re-seeded
private stream, ``torch.set_rng_state``, ``torch.random.fork_rng``, a ``torch.Generator``) may draw the
same tokens on every call, or draws tied to the verifier's, at batch 1, and still pass every
forced replay. Two checks, both on the install being checked, and neither ever fails a case (each
only moves it to batch 1, where the real loop's own behaviour is tested):

- :class:`RandomnessWatch`, while every batched call and every replay runs: any call that seeds or
  restores a random stream, builds or seeds a ``torch.Generator``, or passes ``generator=`` to a
  sampling op, moves the case to batch 1;
- :func:`fresh_draws_evalue`, on :data:`FRESH_CALLS` unforced batch-1 calls in a case's first chunk:
  an anytime-valid e-value (Krichevsky-Trofimov mixture per law, :func:`~lossless_check.stats.mixture_log_evalues`)
  that the tokens those calls' ``torch.multinomial`` returned are fresh draws from the laws it was
  given; past ``1 / FRESH_LEVEL`` (Ville: a generator with fresh draws crosses it with probability at
  most :data:`FRESH_LEVEL`, which costs a needless batch-1 run, never a failure) the case moves to
  batch 1. It sees draws that repeat across calls or ignore their laws, whatever stream made them
  (e.g. a stream re-seeded through a function bound before the watch, ``from torch import manual_seed``).

What remains assumed: that a generator whose calls pass both is drawing, at batch 1, as the batched
rows' forced replays do: e.g. randomness from outside torch (``random``, ``numpy``) that only changes
which law a draw is taken from is not seen by either check. A sampler that draws by noise (Gumbel-max,
an exponential race) makes no ``torch.multinomial`` draw for the e-value to test: for it, beside
:class:`RandomnessWatch`, the unforced calls' noise tensors must all differ (:func:`repeated_noise`:
noise reused across calls); that it is otherwise fresh (e.g. not a function of the prompt) is assumed.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import torch

from lossless_check.modes.replay import BatchMismatch

#: Unforced batch-1 calls whose draws :func:`fresh_draws_evalue` tests, in a batched case's first chunk.
FRESH_CALLS = 40
#: Level of the fresh-draw test: how often a generator with fresh draws is needlessly run at batch 1.
FRESH_LEVEL = 1e-4

#: Functions that seed or restore a random stream (the owner's attribute, what it does).
_RESEEDING = (("manual_seed", "seeds torch's global stream (torch.manual_seed)"),
              ("seed", "re-seeds torch's global stream (torch.seed)"),
              ("set_rng_state", "restores torch's random state (set_rng_state)"),
              ("fork_rng", "forks and restores torch's random state (fork_rng)"))
#: Sampling ops that take ``generator=``.
_SAMPLING = ((torch, ("multinomial", "rand", "rand_like", "randn", "randn_like", "randint", "randint_like",
                      "randperm", "bernoulli", "normal", "poisson")),
             (torch.Tensor, ("multinomial", "uniform_", "exponential_", "normal_", "bernoulli_", "random_",
                             "geometric_", "cauchy_", "log_normal_")))


class RandomnessWatch:
    """Context manager: :attr:`seen` lists what, while active, seeded, restored or privately generated
    randomness (empty for a generator whose draws all come from torch's global stream as it stands)."""

    def __init__(self):
        self.seen: list[str] = []
        self._undo: list = []

    def __enter__(self) -> "RandomnessWatch":
        for owner in (torch, torch.random):
            for name, what in _RESEEDING:
                if hasattr(owner, name):
                    self._wrap(owner, name, lambda *a, _what=what, **k: _what)
        for owner, names in _SAMPLING:
            for name in names:
                if hasattr(owner, name):
                    self._wrap(owner, name, self._private_generator(name))
        self._replace_generator_class()
        return self

    def __exit__(self, *exc) -> None:
        while self._undo:
            self._undo.pop()()

    def _wrap(self, owner, name: str, what) -> None:
        original = getattr(owner, name)
        own = name in owner.__dict__

        def wrapper(*args, **kwargs):
            seen = what(*args, **kwargs)
            if seen and seen not in self.seen:
                self.seen.append(seen)
            return original(*args, **kwargs)

        setattr(owner, name, wrapper)
        self._undo.append((lambda: setattr(owner, name, original)) if own else (lambda: delattr(owner, name)))

    @staticmethod
    def _private_generator(name: str):
        def what(*args, **kwargs):
            generator = kwargs.get("generator")
            return None if generator is None else f"draws from a private torch.Generator ({name}(generator=...))"
        return what

    def _replace_generator_class(self) -> None:
        """``torch.Generator`` is a subclass recording that one was built (or seeded) while active."""
        original, seen = torch.Generator, self.seen

        class WatchedGenerator(original):
            def __init__(self, *args, **kwargs):
                note = "builds a private torch.Generator"
                if note not in seen:
                    seen.append(note)
                super().__init__(*args, **kwargs)

        torch.Generator = WatchedGenerator
        self._undo.append(lambda: setattr(torch, "Generator", original))


def fresh_draws_evalue(calls: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Log e-value against "every token ``torch.multinomial`` returned is a fresh draw from its row":
    ``calls`` are ``(probability rows, tokens)`` of unforced calls in order (a
    :class:`~.replay.SamplerLog`'s, normalised rows). Draws are grouped by their exact law; a token its
    law gives probability 0 is infinite evidence."""
    from lossless_check.stats import mixture_log_evalues

    laws: list[np.ndarray] = []
    index: dict[bytes, int] = {}
    ids, tokens = [], []
    for probs, drawn in calls:
        rows = probs.numpy()
        drawn = drawn.reshape(rows.shape[0], -1)
        for row, row_tokens in zip(rows, drawn.tolist()):
            for token in row_tokens:
                if row[token] <= 0:
                    return math.inf
                key = row.tobytes()
                if key not in index:
                    index[key] = len(laws)
                    laws.append(row)
                ids.append(index[key])
                tokens.append(token)
    if not tokens:
        return 0.0
    return float(mixture_log_evalues(np.array(ids), np.array(tokens), laws)[-1])


#: Said in the batch-1 reason (a case's state) of a generator the watch saw manage its own randomness.
OWN_RANDOMNESS = "its trials come from randomness it manages itself, not from the run's seeds"


def owns_randomness(state: str | None) -> bool:
    """Whether a case's state (its batch-1 reason) says its generator manages its own randomness: its
    trials then depend on the process that drew them (two processes may draw one private stream), so
    its chunks are never mixed across processes (:meth:`~.step_run.StepRun.facts`)."""
    return state is not None and OWN_RANDOMNESS in state


@contextmanager
def watched_randomness():
    """Raise :class:`~.replay.BatchMismatch` when the calls made inside seed, restore or privately
    generate randomness (:class:`~.randomness.RandomnessWatch`): the replays would not see it."""
    with RandomnessWatch() as watch:
        yield
    if watch.seen:
        raise BatchMismatch(f"the generator {watch.seen[0]} during get_candidates: its batch-1 draws may not be "
                            f"the fresh draws the forced replays stand for, and {OWN_RANDOMNESS} (the case runs "
                            f"in one process; its figures may differ between runs of the same seed)")


def repeated_noise(noise: list[torch.Tensor]) -> bool:
    """Whether two of the vocabulary-wide noise tensors of unforced calls are equal: fresh noise of ``V``
    continuous draws a tensor repeats with probability far below any level used here (two float32
    exponential draws coincide with probability about ``2**-23``; a tensor holds at least 8)."""
    seen: set[bytes] = set()
    for tensor in noise:
        key = tensor.numpy().tobytes() + str(tuple(tensor.shape)).encode()
        if key in seen:
            return True
        seen.add(key)
    return False
