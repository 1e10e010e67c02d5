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

The watch also sees Python's ``random`` and numpy's: a call that seeds or restores their global
streams, or builds a ``random.Random`` or a numpy ``Generator``/``RandomState``. Their global streams
are seeded with each chunk's seed (:func:`seed_streams`, as ``transformers.set_seed`` does), so a
generator drawing from them as they stand still has trials that are a function of the seed alone.

**Batch-1 trials are watched too** (:class:`OwnRandomness`, recording only: they are the real loop's
calls already). A generator seen managing its own randomness (batched, replayed or at batch 1) has
trials that depend on the process that drew them, not on the run's seeds alone (a private stream
seeded once per process is the same stream in two processes): its case runs in one process
(:meth:`~.step_run.StepRun.facts`) and its reason says so. That includes a stream built before any
watch (a numpy ``Generator`` built at import): batch-1 calls that move none of torch's, numpy's and
Python's global streams and still draft differently (:data:`UNSEEN_STREAM`).

What remains assumed: that a generator whose calls pass both is drawing, at batch 1, as the batched
rows' forced replays do: e.g. randomness from a stream built before the watch (a module-level numpy
``Generator``) that only changes which law a torch draw is taken from is not seen by either check.
A sampler that draws by noise (Gumbel-max, an exponential race) makes no ``torch.multinomial`` draw
for the e-value to test: for it, beside
:class:`RandomnessWatch`, the unforced calls' noise tensors must all differ (:func:`repeated_noise`:
noise reused across calls); that it is otherwise fresh (e.g. not a function of the prompt) is assumed.
"""

from __future__ import annotations

import math
import random
from contextlib import contextmanager

import numpy as np
import torch

from lossless_check.modes.interception import replace_attribute
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
#: The same for Python's and numpy's global streams (the module, its attribute, what it does).
_RESEEDING_OTHERS = ((random, "seed", "seeds Python's random stream (random.seed)"),
                     (random, "setstate", "restores Python's random state (random.setstate)"),
                     (np.random, "seed", "seeds numpy's global stream (numpy.random.seed)"),
                     (np.random, "set_state", "restores numpy's random state (numpy.random.set_state)"),
                     (np.random, "default_rng", "builds a private numpy Generator (numpy.random.default_rng)"))
#: Classes of private streams: building one while watched is seen (the module, the class's name, what).
_PRIVATE_STREAMS = ((torch, "Generator", "builds a private torch.Generator"),
                    (random, "Random", "builds a private random.Random"),
                    (np.random, "Generator", "builds a private numpy Generator"),
                    (np.random, "RandomState", "builds a private numpy RandomState"))
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
        for owner, name, what in _RESEEDING_OTHERS:
            self._wrap(owner, name, lambda *a, _what=what, **k: _what)
        for owner, names in _SAMPLING:
            for name in names:
                if hasattr(owner, name):
                    self._wrap(owner, name, self._private_generator(name))
        for owner, name, what in _PRIVATE_STREAMS:
            self._replace_class(owner, name, what)
        return self

    def __exit__(self, *exc) -> None:
        while self._undo:
            self._undo.pop()()

    def _wrap(self, owner, name: str, what) -> None:
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            seen = what(*args, **kwargs)
            if seen and seen not in self.seen:
                self.seen.append(seen)
            return original(*args, **kwargs)

        self._undo.append(replace_attribute(owner, name, wrapper))

    @staticmethod
    def _private_generator(name: str):
        def what(*args, **kwargs):
            generator = kwargs.get("generator")
            return None if generator is None else f"draws from a private torch.Generator ({name}(generator=...))"
        return what

    def _replace_class(self, owner, name: str, note: str) -> None:
        """``owner.name`` is a subclass recording, while active, that one was built."""
        original, seen = getattr(owner, name), self.seen

        class Watched(original):
            def __init__(self, *args, **kwargs):
                if note not in seen:
                    seen.append(note)
                super().__init__(*args, **kwargs)

        setattr(owner, name, Watched)
        self._undo.append(lambda: setattr(owner, name, original))


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


def own_randomness_reason(seen: str) -> str:
    """What a case's reason says of a generator the watch saw do ``seen`` (:func:`owns_randomness`)."""
    return (f"the generator {seen} during get_candidates: {OWN_RANDOMNESS} (the case runs in one process; its "
            f"figures may differ between runs of the same seed)")


@contextmanager
def watched_randomness():
    """Raise :class:`~.replay.BatchMismatch` when the calls made inside seed, restore or privately
    generate randomness (:class:`~.randomness.RandomnessWatch`): the replays would not see it. It says
    so even when a replay inside failed first (a private stream is why replays differ, and the case's
    reason must say so: :func:`owns_randomness`)."""
    watch = RandomnessWatch()
    try:
        with watch:
            yield
    except BatchMismatch as exc:
        if watch.seen:
            raise BatchMismatch(f"{exc}; {own_randomness_reason(watch.seen[0])}") from exc
        raise
    if watch.seen:
        raise BatchMismatch(f"its batch-1 draws may not be the fresh draws the forced replays stand for: "
                            f"{own_randomness_reason(watch.seen[0])}")


#: What :class:`OwnRandomness` says of drafts that vary while every global stream stands still.
UNSEEN_STREAM = ("drafts differently on calls that leave torch's, numpy's and Python's global streams as they were "
                 "(it draws from a stream no watch sees, e.g. a numpy Generator built at import)")


class OwnRandomness:
    """Watches batch-1 calls, which are the real loop's (nothing to move): :attr:`seen` is the first
    thing a call did that seeds, restores or privately generates randomness, or ``None``.

    It also sees a stream built before the watch (which no wrapper of a call sees): every batch-1 call of
    a case starts from the same prompt, so two calls that leave torch's, numpy's and Python's global
    streams as they found them and still return different drafts drew from somewhere else
    (:data:`UNSEEN_STREAM`). A greedy drafter returns the same drafts every time, and one drawing
    from a global stream moves it: neither is counted.
    """

    def __init__(self):
        self.seen: str | None = None
        self._still_drafts: bytes | None = None  # the drafts of the first call that moved no global stream

    @contextmanager
    def watching(self):
        """Watch one batch-1 call; yields ``drafted(candidate_ids)``, to be called with what it returned."""
        drafts: list[torch.Tensor] = []
        if self.seen is not None:  # seen once is enough: the case already runs in one process
            yield drafts.append
            return
        before = _global_streams()
        with RandomnessWatch() as watch:
            yield drafts.append
        if watch.seen:
            self.seen = watch.seen[0]
        elif drafts and _global_streams() == before:
            key = drafts[0].cpu().numpy().tobytes() + str(tuple(drafts[0].shape)).encode()
            if self._still_drafts is None:
                self._still_drafts = key
            elif key != self._still_drafts:
                self.seen = UNSEEN_STREAM


def _global_streams() -> tuple:
    """The states of torch's, numpy's and Python's global streams, comparable with ``==``."""
    numpy_state = np.random.get_state(legacy=True)
    return (torch.get_rng_state().numpy().tobytes(), numpy_state[1].tobytes(), numpy_state[2:],
            random.getstate())


def seed_streams(seed: int) -> None:
    """Seed torch's, numpy's and Python's global streams with ``seed`` (as ``transformers.set_seed``):
    a generator drawing from any of them as they stand draws a function of the seed."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


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
