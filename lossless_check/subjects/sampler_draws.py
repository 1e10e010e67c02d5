"""Controlled randomness for the exact sampler check: every draw a sampler makes becomes a choice point,
and its calls are replayed down every path of choices (depth-first, by re-execution).

While :func:`controlled` is active, torch's sampling primitives return chosen values instead of random ones:

- uniforms (``torch.rand``, ``torch.rand_like``, ``Tensor.uniform_``): each element is a choice among
  :data:`CELLS` cells of ``[0, 1)``, probed at both ends: ``c / CELLS`` and the largest value of the dtype's
  ``torch.rand`` grid below ``(c + 1) / CELLS`` (float32: ``k / 2^24``, ``ATen/core/TransformationHelper.h``);
  so ``0`` and the values next to every multiple of ``1 / CELLS`` are among them;
- categorical draws (``torch.multinomial``, ``Tensor.multinomial``, and ``Categorical.sample`` through them):
  each sampled element is a choice among the tokens of positive probability in the law it is handed,
  weighted by that probability (the input is first checked by the real primitive, so a law torch
  refuses raises as it would);
- Bernoulli draws (``torch.bernoulli``, ``Tensor.bernoulli``, ``Tensor.bernoulli_``): each element a choice
  among the outcomes of positive probability.

Any other sampling primitive (normal, exponential, integer draws, permutations, Gumbel noise...) raises
:class:`~lossless_check.subjects.sampler.Untraceable`: its draws cannot be enumerated. So does a call
that changes the state of torch's, numpy's or Python's global generator (a draw through something not
intercepted, e.g. ``from torch import rand`` bound before the check), and a tree of more than
:data:`MAX_PATHS` paths.
"""

from __future__ import annotations

import random
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np
import torch

from lossless_check.core.patching import call_argument, replace_attribute
from lossless_check.subjects.sampler import Untraceable

#: Cells of ``[0, 1)`` a uniform draw is enumerated over. Algorithm 1's thresholds in the designs are
#: multiples of ``1 / CELLS``, so its decisions are constant on each cell.
CELLS = 4
#: Most paths (sampler calls) one enumeration (one draft tuple of a design) may take before the sampler
#: counts as untraceable: ``k + 1`` uniforms and a categorical draw over 4 tokens take 2,048 at k = 2.
MAX_PATHS = 5_000
#: How far two probabilities of an emitted law may differ and still count as equal: the float32 rounding
#: of the sampler's own arithmetic on the laws it hands torch. Normalising a law whose entries are not
#: dyadic fractions (a residual of mass 3/4, say) rounds each entry by up to 2^-24 relatively and their
#: sum by up to V 2^-24; 2^-17 = 128 float32 ulps of 1 bounds that at V = 8 with room, and is far below
#: the smallest probability of any law the designs state (1/64). A departure smaller than this is not
#: seen by comparing laws; a threshold off by one grid step is seen on its cell (see the module docstring).
ROUNDING = Fraction(1, 2**17)
UNIFORM, CATEGORICAL, BERNOULLI = "uniform", "categorical", "bernoulli"


def same_law(a: dict, b: dict) -> bool:
    """Whether two laws (``{outcome: probability}``) are equal up to :data:`ROUNDING`."""
    return all(abs(a.get(x, 0) - b.get(x, 0)) <= ROUNDING for x in set(a) | set(b))
#: Primitives whose draws cannot be enumerated: a sampler using one is checked statistically.
UNTRACEABLE = {torch: ("randn", "randn_like", "randint", "randint_like", "randperm", "normal", "poisson",
                       "binomial", "_standard_gamma", "_sample_dirichlet"),
               torch.Tensor: ("normal_", "exponential_", "geometric_", "cauchy_", "log_normal_", "random_")}


def grid_step(dtype: torch.dtype) -> float:
    """The spacing of ``torch.rand``'s values in ``dtype`` (``2^-24`` in float32, ``2^-53`` in float64)."""
    return torch.finfo(dtype).eps / 2


def uniform_values(dtype: torch.dtype) -> list[float]:
    """The probes of one uniform draw: each cell's left end, then its right end (``(c + 1)/CELLS - step``)."""
    step = grid_step(dtype)
    return [v for c in range(CELLS) for v in (c / CELLS, (c + 1) / CELLS - step)]


@dataclass(frozen=True)
class Point:
    """One choice point: a draw's kind, what it was called through, its options and their weights."""

    kind: str
    where: str
    options: tuple
    weights: tuple[Fraction, ...]

    def describe(self, index: int) -> str:
        return f"{self.where} -> {self.options[index]!r}"


#: Why a sampler is untraceable when a path's draws differ between two runs.
UNSEEN = ("its draws differ between two runs down the same path of choices (randomness the check does not "
          "see, e.g. a private generator)")


@dataclass
class Path:
    """One run: the choices it follows (``prefix``, then the first option at every new point). ``expected``:
    the points an earlier run met along ``prefix``; meeting others is randomness the check does not see."""

    prefix: tuple[int, ...]
    expected: tuple[Point, ...] = ()
    points: list[Point] = field(default_factory=list)
    #: Values that replace the chosen option at these depths (a uniform moved off 0, see ``zeros_needed``).
    values: dict[int, object] = field(default_factory=dict)

    def choose(self, point: Point) -> object:
        depth = len(self.points)
        self.points.append(point)
        if depth < len(self.expected) and point != self.expected[depth]:
            raise Untraceable(UNSEEN)
        if depth in self.values:
            return self.values[depth]
        index = self.prefix[depth] if depth < len(self.prefix) else 0
        if index >= len(point.options):
            if not self.values:  # the same choices met another draw: randomness the check does not see
                raise Untraceable(UNSEEN)
            index = 0  # a moved value changed the draws after it: the first option there
        return point.options[index]

    def zeros(self) -> list[int]:
        """The depths of the uniform draws this path gave exactly 0."""
        return [d for d, (p, i) in enumerate(zip(self.points, self.choices))
                if p.kind == UNIFORM and p.options[i] == 0.0 and d not in self.values]

    @property
    def choices(self) -> tuple[int, ...]:
        return tuple(self.prefix[i] if i < len(self.prefix) else 0 for i in range(len(self.points)))

    def describe(self) -> str:
        """The draws of this path, in order (for a failure's witness)."""
        return "; ".join(p.describe(i) for p, i in zip(self.points, self.choices)) or "no draws"


class _Patches:
    """The controlled primitives of one path (:func:`controlled`)."""

    def __init__(self, path: Path, originals: dict):
        #: The path the current run follows (set before each run).
        self.path = path
        self.original = originals
        self.private = torch.Generator().manual_seed(0)  # validates inputs without touching the global stream

    def uniform_tensor(self, shape, dtype, where: str) -> torch.Tensor:
        dtype = dtype or torch.get_default_dtype()
        if not dtype.is_floating_point:
            raise Untraceable(f"{where} in {dtype}")
        values = uniform_values(dtype)
        # A cell's left end carries the cell's weight; its right end must give the same law (Enumeration).
        weights = (Fraction(1, CELLS), Fraction(0)) * CELLS
        n = int(np.prod(shape)) if len(shape) else 1
        drawn = [self.path.choose(Point(UNIFORM, f"{where}[{i}]", tuple(values), weights)) for i in range(n)]
        return torch.tensor(drawn, dtype=dtype).reshape(shape)

    def rand(self, *size, generator=None, out=None, dtype=None, device=None, **kwargs):
        shape = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else tuple(size)
        if "size" in kwargs:
            shape = tuple(kwargs.pop("size"))
        result = self.uniform_tensor(shape, dtype or (out.dtype if out is not None else None), "torch.rand")
        if out is not None:
            return out.copy_(result)
        return result.to(device) if device is not None else result

    def rand_like(self, input, *args, dtype=None, device=None, **kwargs):
        return self.uniform_tensor(tuple(input.shape), dtype or input.dtype, "torch.rand_like").to(
            device if device is not None else input.device)

    def uniform_(self, tensor, *args, **kwargs):
        low, high = call_argument(args, kwargs, 0, "from", 0.0), call_argument(args, kwargs, 1, "to", 1.0)
        u = self.uniform_tensor(tuple(tensor.shape), tensor.dtype, "Tensor.uniform_")
        return tensor.copy_(u * (high - low) + low)

    def multinomial(self, input, num_samples, *args, **kwargs):
        replacement = call_argument(args, kwargs, 0, "replacement", False)
        _checked(self.original["multinomial"], input, num_samples, replacement, generator=self.private)
        if num_samples > 1 and not replacement:
            raise Untraceable("torch.multinomial of several samples without replacement")
        rows = input.detach().reshape(-1, input.shape[-1]).double().cpu()
        drawn = []
        for r, row in enumerate(rows):
            law = row / row.sum()
            support = tuple(int(t) for t in torch.nonzero(law > 0).reshape(-1))
            weights = tuple(Fraction(float(law[t])) for t in support)
            where = "torch.multinomial" + (f"[row {r}]" if len(rows) > 1 else "")
            drawn.append([self.path.choose(Point(CATEGORICAL, where, support, weights)) for _ in range(num_samples)])
        result = torch.tensor(drawn, dtype=torch.long, device=input.device)
        result = result.reshape(*input.shape[:-1], num_samples)
        out = kwargs.get("out")
        return out.copy_(result) if out is not None else result

    def bernoulli_law(self, probs: torch.Tensor, dtype, device, where: str) -> torch.Tensor:
        law = probs.detach().double().cpu().reshape(-1)
        drawn = []
        for i, p in enumerate(law.tolist()):
            outcomes = tuple(o for o, w in ((0, 1.0 - p), (1, p)) if w > 0)
            weights = tuple(Fraction(1) - Fraction(p) if o == 0 else Fraction(p) for o in outcomes)
            drawn.append(self.path.choose(Point(BERNOULLI, f"{where}[{i}]", outcomes, weights)))
        return torch.tensor(drawn, dtype=dtype, device=device).reshape(probs.shape)

    def bernoulli(self, input, *args, **kwargs):
        p = call_argument(args, kwargs, 0, "p")
        generator_free = {k: v for k, v in kwargs.items() if k not in ("generator", "out")}
        _checked(self.original["bernoulli"], input, *args, generator=self.private, **generator_free)
        probs = torch.full_like(input, float(p), dtype=torch.float64) if isinstance(p, (int, float)) else input
        result = self.bernoulli_law(probs, input.dtype, input.device, "torch.bernoulli")
        out = kwargs.get("out")
        return out.copy_(result) if out is not None else result

    def bernoulli_(self, tensor, *args, **kwargs):
        p = call_argument(args, kwargs, 0, "p", 0.5)
        probs = (torch.full(tensor.shape, float(p), dtype=torch.float64) if isinstance(p, (int, float))
                 else torch.as_tensor(p, dtype=torch.float64).expand(tensor.shape))
        _checked(self.original["bernoulli"], probs, generator=self.private)
        return tensor.copy_(self.bernoulli_law(probs, tensor.dtype, tensor.device, "Tensor.bernoulli_"))


class ControlBroken(BaseException):
    """A controlled primitive failed on a valid call: the harness's own bug, never the sampler's (a
    ``BaseException``, so that the sampler's call does not report it as the sampler raising)."""


def _guarded(method):
    """``method`` with its own failures raised as :class:`ControlBroken`. What torch's real primitive
    raises on an invalid input (checked first, see :class:`_Patches`) stays the sampler's."""

    def call(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except _TorchRefused as refused:
            raise refused.error from None
        except Exception as exc:  # noqa: BLE001 - anything else is ours
            raise ControlBroken(f"{method.__name__}: {type(exc).__name__}: {exc}") from exc

    return call


class _TorchRefused(Exception):
    """What torch's real primitive raised on the sampler's input (re-raised to the sampler as is)."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


def _checked(original, *args, **kwargs) -> None:
    """Run torch's real primitive on the input (private generator): an input it refuses raises as it would."""
    try:
        original(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - re-raised to the sampler unchanged
        raise _TorchRefused(exc) from None


def _refuse(name: str):
    def untraceable(*args, **kwargs):
        raise Untraceable(f"it draws through {name}, whose draws the exact check cannot enumerate")

    return untraceable


def _global_states():
    return (torch.random.get_rng_state(), np.random.get_state()[1].copy(), np.random.get_state()[2],
            random.getstate())


def _same_states(before, after) -> bool:
    return (torch.equal(before[0], after[0]) and np.array_equal(before[1], after[1]) and before[2] == after[2]
            and before[3] == after[3])


def _private_generator_states() -> list[tuple[object, object]]:
    """Every numpy and Python random generator alive (found through the garbage collector: about a second
    with torch and transformers loaded, so only where a law failure is confirmed), with its state."""
    import gc

    states = []
    for o in gc.get_objects():
        kind = type(o)  # not isinstance: some objects' classes answer it with warnings
        if issubclass(kind, np.random.Generator):
            states.append((o, repr(o.bit_generator.state)))
        elif issubclass(kind, np.random.RandomState):
            states.append((o, repr(o.get_state())))
        elif issubclass(kind, random.Random) and not issubclass(kind, random.SystemRandom):  # no state there
            states.append((o, o.getstate()))
    return states


def private_generators_moved(run) -> bool:
    """Whether a numpy or Python generator alive before ``run()`` (a private one of the sampler's: the
    global ones are checked on every enumeration) moved while it ran."""
    before = _private_generator_states()
    run()
    after = {id(o): state for o, state in _private_generator_states()}
    return any(after.get(id(o), state) != state for o, state in before)


@contextmanager
def controlled():
    """While active, torch's sampling primitives follow the path set as ``.path`` on the yielded object
    (see the module docstring); restored after. Raises :class:`~lossless_check.subjects.sampler.Untraceable`
    at exit if a global generator moved meanwhile (checked once: a draw only ever moves it on)."""
    originals = {"multinomial": torch.multinomial, "bernoulli": torch.bernoulli}
    patches = _Patches(Path(()), originals)
    replaced = [(torch, "rand", patches.rand), (torch, "rand_like", patches.rand_like),
                (torch.Tensor, "uniform_", patches.uniform_), (torch, "multinomial", patches.multinomial),
                (torch.Tensor, "multinomial", patches.multinomial), (torch, "bernoulli", patches.bernoulli),
                (torch.Tensor, "bernoulli", patches.bernoulli), (torch.Tensor, "bernoulli_", patches.bernoulli_)]
    undo = [replace_attribute(owner, name, _guarded(method)) for owner, name, method in replaced]
    for owner, names in UNTRACEABLE.items():
        prefix = "torch." if owner is torch else "Tensor."
        undo += [replace_attribute(owner, name, _refuse(prefix + name)) for name in names if hasattr(owner, name)]
    before = _global_states()
    try:
        yield patches
    finally:
        for restore in reversed(undo):
            restore()
    if not _same_states(before, _global_states()):
        raise Untraceable("it drew from a global random generator through a function the check does not control "
                          "(a primitive bound before the check, numpy or Python's random)")


@dataclass
class Leaf:
    """One path's outcome: what the sampler emitted (or the failure it raised) and the path's weight."""

    emitted: tuple[int, ...] | None
    failure: str | None
    path: Path


def _tree_size(points: list[Point]) -> float:
    """The paths of a tree whose every path met these choice points (a float: it may be astronomical)."""
    return float(np.prod([float(len(p.options)) for p in points]))


class Enumeration:
    """Every path of one call (``run(path)`` runs it under :func:`controlled`), and the law of its outcomes.

    :meth:`law` returns ``{emitted: weight}`` (weights are exact fractions summing to 1), where a uniform
    draw's weight ``1/CELLS`` per cell goes to the cell's left end; the right end must give the same law
    (:attr:`inside_cell`, the first path where it does not). A path that raises stops the enumeration
    (:attr:`failure`)."""

    def __init__(self, run, max_paths: int = MAX_PATHS):
        self.run, self.max_paths, self.paths = run, max_paths, 0
        self.failure: Leaf | None = None
        self.inside_cell: tuple[Path, Path, dict, dict] | None = None
        self.leaves: list[Leaf] = []

    def _execute(self, prefix: tuple[int, ...], expected: tuple[Point, ...] = ()) -> Leaf:
        self.paths += 1
        if self.paths > self.max_paths:
            raise Untraceable(f"its draws make more than {self.max_paths} paths")
        path = Path(prefix, expected)
        leaf = self.run(path)
        self.leaves.append(leaf)
        if leaf.failure is not None and self.failure is None:
            self.failure = leaf
        return leaf

    def law(self) -> dict[tuple[int, ...], Fraction]:
        return self._explore((), None)

    def _explore(self, prefix: tuple[int, ...], first: Leaf | None, expected: tuple[Point, ...] = ()) -> dict:
        leaf = first if first is not None else self._execute(prefix, expected)
        if self.failure is not None:
            return {}
        points = leaf.path.points
        if not prefix and _tree_size(points) > self.max_paths:  # seen on the first path: stop at once
            raise Untraceable(f"its draws make about {_tree_size(points):.3g} paths (more than {self.max_paths})")
        if len(points) == len(prefix):
            return {leaf.emitted: Fraction(1)}
        point = points[len(prefix)]
        along = tuple(points[: len(prefix) + 1])
        children = [self._explore(prefix + (i,), leaf if i == 0 else None, along) for i in range(len(point.options))]
        if self.failure is not None:
            return {}
        law: dict = {}
        if point.kind == UNIFORM:
            for c in range(CELLS):
                left, right = children[2 * c], children[2 * c + 1]
                if not same_law(left, right) and self.inside_cell is None:
                    self.inside_cell = (self._witness(prefix + (2 * c,)), self._witness(prefix + (2 * c + 1,)),
                                        left, right)
        for child, weight in zip(children, point.weights):
            for emitted, w in (child.items() if weight else ()):
                law[emitted] = law.get(emitted, Fraction(0)) + w * weight
        return law

    def _witness(self, prefix: tuple[int, ...]) -> Path:
        """A path (already run) whose choices start with ``prefix``."""
        return next(leaf.path for leaf in self.leaves if leaf.path.choices[: len(prefix)] == prefix)
