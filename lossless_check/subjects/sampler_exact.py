"""The exact check of a user's rejection sampler: its emitted law on known laws, computed with every draw
enumerated (:mod:`.sampler_draws`), against the law a lossless round must emit.

**What must hold.** Drafts ``d_i ~ q_i`` and a round that emits ``y_1 .. y_m`` (the accepted drafts, then
one token) is lossless iff, for every position ``j`` and every draft prefix ``d_{<j}``, the token at
``j`` given that the round reaches ``j`` with ``y_{<j} = d_{<j}`` follows the target ``p_j``: the next
round starts from the emitted prefix, so each emitted token must be a draw from the target given the
tokens before it (by induction over positions). Each design below enumerates the drafts over ``q``'s
support (weighted by ``q``), the sampler's draws over their choice points, and checks that equality
exactly, in rational arithmetic. Beside it, the law Algorithm 1 (Leviathan et al.) emits for the same
drafts (accept ``d_i`` with probability ``min(1, p_i/q_i)``, at the first rejection a token from
``normalize(max(p - q, 0))``, after a full accept the bonus token from ``p_{k+1}``) is the law each
design states; a sampler that emits the target's law with a different acceptance law (fewer accepts,
a different residual to match) is lossless, and the report says it accepts differently.

**Why a finite enumeration is the exact law.** Every design (:mod:`.sampler_designs`) is built from laws
uniform on 1, 2 or 4 of 8 tokens (logits 0 and ``-inf``: every softmax, ratio and residual is exact in float32, bfloat16 and
float16), so every probability, every ratio ``p/q`` a draft can have (0, 1/2, 1, 2) and every
cumulative sum of a residual or bonus law, in any token order, is a multiple of ``1/4``. Algorithm 1's
decisions, and an inverse-CDF draw's token, are then constant on each cell ``[c/4, (c + 1)/4)`` of a
uniform, so its law on torch's float32 grid is the average over cells. Each cell is probed at both
ends (its left end, 0 for the first, and the grid value just below the next multiple of 1/4, so
``r = p/q`` and the value just under it are both probes); a sampler whose emitted law differs between
the two ends of a cell changes its decision strictly inside a cell, where Algorithm 1's law does not
(e.g. ``r <= p/q``: at ``r = p/q = 1/2`` it accepts, at the cell's right end it rejects: acceptance
probability ``p/q + 2^-24``). Categorical and Bernoulli draws are enumerated over their support with
their own probabilities.

**Exact failures** (a single path shows them, whatever else the sampler draws): a token of target
probability 0 emitted (e.g. ``r = 0`` accepting a draft with ``p = 0``: probability ``2^-24`` per such
draft on float32 CPU; the draws of exactly 0 a failing path needs are found by moving each off 0, and
one needed convicts at rate ``2^-24``, two or more at once, ``2^-48`` or less, are said but do not),
a call that raises on a valid input, a malformed return. A sampler whose draws the check cannot
enumerate (:class:`~.sampler.Untraceable`) gets no exact verdict: it is checked statistically
(:mod:`.sampler_statistical`); exact failures seen on the way still stand.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from lossless_check.subjects.sampler import Sampler, SamplerFailure, Untraceable
from lossless_check.subjects.sampler_designs import Design, algorithm_1, design_text, designs_for, fractions, law_text
from lossless_check.subjects.sampler_draws import (
    CELLS,
    UNSEEN,
    Enumeration,
    Leaf,
    Path,
    controlled,
    private_generators_moved,
    same_law,
)
from lossless_check.subjects.verifier import VerifierCheck

LAW = ("given the accepted drafts before it, each emitted token follows p_j (drafts enumerated over q); "
       "Algorithm 1: accept iff r < p/q, residual normalize(max(p-q,0)), bonus from p_{k+1}")
ZERO_RATE = "2^-24 = 5.96e-08 per draw of a float32 torch.rand (the probability of that value)"


@dataclass
class DesignOutcome:
    """What the enumeration of one design found."""

    check: VerifierCheck
    untraceable: str | None = None
    paths: int = 0
    algorithm_1: bool | None = None  # whether it emitted Algorithm 1's law for every draft tuple


class _Run:
    """One call of the sampler on a design's laws and drafts, down a given path of draws."""

    def __init__(self, sampler: Sampler, design: Design, drafts: tuple[int, ...], patches):
        self.sampler, self.design, self.drafts, self.patches = sampler, design, drafts, patches
        self.p = torch.tensor(np.stack(design.p), dtype=torch.float32)
        self.q = torch.tensor(np.stack(design.q), dtype=torch.float32)

    def __call__(self, path: Path) -> Leaf:
        self.patches.path = path
        try:
            with torch.no_grad():
                emitted = self.sampler.emit(self.p, self.q, list(self.drafts), self.design.draft_dtype,
                                            self.design.is_done)
        except SamplerFailure as exc:
            return Leaf(None, str(exc), path)
        if self.design.is_done and len(emitted) > len(self.drafts):
            return Leaf(None, f"emits {emitted}: a bonus token after a full accept, with is_done_candidate", path)
        return Leaf(tuple(emitted), None, path)


def _support_failure(design: Design, leaf: Leaf) -> str | None:
    """The emitted token of target probability 0, if any, as a sentence."""
    for j, token in enumerate(leaf.emitted):
        if design.p[j][token] == 0:
            what = "accepts draft" if j < len(leaf.emitted) - 1 else "emits"
            return f"{what} {token} at position {j + 1}, where p{j + 1}({token}) = 0"
    return None


def position_failures(design: Design, joint: dict[tuple[tuple[int, ...], tuple[int, ...]], Fraction]) -> list[str]:
    """Where the emitted law departs from the target: ``joint`` maps ``(drafts, emitted)`` to probability.
    At position ``j``, for each draft prefix ``d_{<j}`` the round reaches ``j`` through, the law of the
    token there must be ``p_j`` (up to :data:`~.sampler_draws.ROUNDING`)."""
    failures = []
    for j in range(design.k + 1):
        expected = {x: m for x, m in enumerate(fractions(design.p[j])) if m}
        for prefix in sorted({drafts[:j] for drafts, _ in joint}):
            reach = Fraction(0)
            tokens: dict[int, Fraction] = {}
            for (drafts, emitted), w in joint.items():
                if drafts[:j] == prefix and len(emitted) > j:
                    reach += w
                    tokens[emitted[j]] = tokens.get(emitted[j], Fraction(0)) + w
            observed = {x: w / reach for x, w in tokens.items()} if reach else {}
            if reach and not same_law(observed, expected):
                after = f" after drafts {list(prefix)}" if prefix else ""
                failures.append(f"position {j + 1}{after}: emits {_dict_text(observed)}, the target is "
                                f"{_dict_text(expected)}")
    return failures


def _number(w: Fraction) -> str:
    return str(w) if w.denominator <= 4096 else f"{float(w):.7g}"


def _dict_text(law: dict) -> str:
    return "{" + ", ".join(f"{x}: {_number(w)}" for x, w in sorted(law.items()) if w) + "}"


def _text(law: dict[tuple[int, ...], Fraction]) -> str:
    return _dict_text({tuple(e): w for e, w in law.items()}).replace("(", "[").replace(",)", "]").replace(")", "]")


def _enumerate(sampler: Sampler, design: Design, drafts: tuple[int, ...]) -> tuple[Enumeration, dict | None, str | None]:
    """Every path for these drafts: the enumeration, its law (``None`` if it stopped), why it stopped untraced."""
    enumeration = Enumeration(lambda path: None)
    try:
        with controlled() as patches:
            enumeration = Enumeration(_Run(sampler, design, drafts, patches))
            return enumeration, enumeration.law(), None
    except Untraceable as exc:
        return enumeration, None, str(exc)


def check_design(sampler: Sampler, design: Design) -> DesignOutcome:
    """Enumerate one design (every draft tuple of ``q``'s support, every path of the sampler's draws)."""
    supports = [np.flatnonzero(q > 0).tolist() for q in design.q]
    joint: dict = {}
    same_as_algorithm_1 = True
    paths = 0
    runs: dict[tuple[int, ...], Enumeration] = {}
    inside_cell = None  # the first draft tuple whose decision changes inside a cell (a support failure wins)
    notes: list[str] = []  # support failures that need several draws of exactly 0 at once
    for drafts in itertools.product(*supports):
        weight = np.prod([Fraction(float(design.q[i][d])) for i, d in enumerate(drafts)])
        algorithm = algorithm_1(design, drafts)
        enumeration, law, untraced = _enumerate(sampler, design, drafts)
        paths += enumeration.paths
        runs[drafts] = enumeration
        failure, note = _leaf_failure(sampler, design, drafts, enumeration)
        notes += [note] if note else []
        if failure is not None:  # one path shows it, whatever else the sampler draws
            return DesignOutcome(failure, paths=paths)
        if untraced is not None:
            return DesignOutcome(_check(design, "", "; ".join([NOT_ENUMERABLE] + notes), False),
                                 untraceable=untraced, paths=paths)
        if enumeration.inside_cell is not None:
            inside_cell = inside_cell or (drafts, algorithm, enumeration)
            continue
        same_as_algorithm_1 &= same_law(law, algorithm)
        for emitted, w in law.items():
            joint[(drafts, emitted)] = joint.get((drafts, emitted), Fraction(0)) + weight * w
    if inside_cell is not None:
        drafts, algorithm, enumeration = inside_cell
        left, right, left_law, right_law = enumeration.inside_cell
        observed = (f"drafts {list(drafts)}: {left.describe()} emits {_text(left_law)}; {right.describe()} "
                    f"emits {_text(right_law)}: its decision changes inside a cell of width 1/{CELLS}, where "
                    "Algorithm 1's does not (a threshold off p/q by a grid step, e.g. r <= p/q)")
        return DesignOutcome(_check(design, f"drafts {list(drafts)}: {_text(algorithm)}", observed, False),
                             paths=paths, untraceable=_unseen_randomness(sampler, design, runs))
    failures = position_failures(design, joint)
    expected_text = "; ".join(f"position {j + 1}: {law_text(design.p[j])}" for j in range(design.k + 1))
    if failures:
        return DesignOutcome(_check(design, expected_text, "; ".join(failures[:2]), False), paths=paths,
                             untraceable=_unseen_randomness(sampler, design, runs))
    observed = "; ".join(["the target's law at every position" + (
        " (Algorithm 1's law for every draft tuple)" if same_as_algorithm_1 else
        "; a different acceptance law than Algorithm 1's: lossless, but accepts fewer drafts")] + notes)
    return DesignOutcome(_check(design, expected_text, observed, True), paths=paths,
                         algorithm_1=same_as_algorithm_1)


NOT_ENUMERABLE = "not enumerable"


def _check(design: Design, expected: str, observed: str, passed: bool, rate: str = "") -> VerifierCheck:
    return VerifierCheck(design.name, f"{design_text(design)}: {LAW}", expected, observed, passed, rate)


def _leaf_failure(sampler: Sampler, design: Design, drafts: tuple[int, ...],
                  enumeration: Enumeration) -> tuple[VerifierCheck | None, str]:
    """A raising call or a support failure among the paths run so far, as a failed check; and a note for a
    support failure that needs two or more draws of exactly 0 at once (probability at most 2^-48 a round,
    below the float32 rounding of any law: said, not convicted)."""
    if enumeration.failure is not None:
        leaf = enumeration.failure
        return _check(design, "a valid return on every path", f"{leaf.failure} (draws: {leaf.path.describe()})",
                      False), ""
    failing = [(leaf, found) for leaf in enumeration.leaves if leaf.emitted is not None
               and (found := _support_failure(design, leaf))][:MINIMISED]
    if not failing:
        return None, ""
    needed = [zeros_needed(sampler, design, drafts, leaf) for leaf, _ in failing]
    (leaf, found), zeros = min(zip(failing, needed), key=lambda pair: len(pair[1]))
    observed = f"{found}: emits {list(leaf.emitted)} (draws: {leaf.path.describe()})"
    if zeros:
        observed += f"; it needs {' and '.join(leaf.path.points[d].where for d in zeros)} = 0"
    if len(zeros) >= 2:
        return None, f"{observed} at once (probability 2^-{24 * len(zeros)})"
    return _check(design, "only tokens of the target's support", observed, False, ZERO_RATE if zeros else ""), ""


#: Support failures of one draft tuple whose draws of exactly 0 are minimised (the fewest needed is kept).
MINIMISED = 4


def zeros_needed(sampler: Sampler, design: Design, drafts: tuple[int, ...], leaf: Leaf) -> list[int]:
    """The depths of the path's draws of exactly 0 its support failure needs: each is moved to the smallest
    positive value of its grid in turn (and left there where the failure stays)."""
    moved: dict[int, object] = {}
    needed = []
    try:
        with controlled() as patches:
            run = _Run(sampler, design, drafts, patches)
            for depth in leaf.path.zeros():
                trial = {**moved, depth: _step(leaf.path.points[depth])}
                again = run(Path(leaf.path.choices, values=trial))
                if again.emitted is not None and _support_failure(design, again):
                    moved = trial
                else:
                    needed.append(depth)
    except Untraceable:
        return leaf.path.zeros()
    return needed


def _step(point) -> float:
    """The smallest positive value of a uniform's grid (its first cell's right end is ``1/CELLS - step``)."""
    return 1.0 / CELLS - point.options[1]


#: Times every path of a design is run again before a law failure there is reported: randomness the
#: controlled primitives and the global-state check do not see (a private numpy or Python generator)
#: changes a fixed path's draws or outcome between runs. A path whose outcome is a coin with odds
#: a : 1 - a repeats it on every rerun with probability at most max(a, 1 - a)^RERUNS, and a design has
#: tens to hundreds of paths.
RERUNS = 2


def _unseen_randomness(sampler: Sampler, design: Design, runs: dict[tuple[int, ...], Enumeration]) -> str | None:
    """Before a law failure is reported, every path of the design is run :data:`RERUNS` times more, watching
    every numpy and Python generator alive: ``None`` if each path gives the same draws and outcome again and
    no private generator moved, else why the check is void. (A generator the sampler makes afresh in each
    call from the system's entropy is seen only through the reruns' outcomes.)"""
    varied: list[str] = []

    def rerun() -> None:
        try:
            for drafts, enumeration in runs.items():
                with controlled() as patches:
                    run = _Run(sampler, design, drafts, patches)
                    for leaf in enumeration.leaves * RERUNS:
                        again = run(Path(leaf.path.choices, tuple(leaf.path.points)))
                        if again.emitted != leaf.emitted or len(again.path.points) != len(leaf.path.points):
                            varied.append(UNSEEN)
                            return
        except Untraceable as exc:
            varied.append(str(exc))

    if private_generators_moved(rerun):
        return PRIVATE
    return varied[0] if varied else None


PRIVATE = "it draws from a private numpy or Python generator, which the check does not control"


@dataclass
class ExactOutcome:
    """The exact check over every design: ``checks`` (one per design), why a design was not enumerable."""

    checks: list[VerifierCheck]
    untraceable: str | None
    paths: int
    algorithm_1: bool

    @property
    def failed(self) -> list[VerifierCheck]:
        return [c for c in self.checks if not c.passed and not c.observed.startswith(NOT_ENUMERABLE)]

    @property
    def traced(self) -> bool:
        """Whether every design was enumerated (only then can the exact check pass a sampler)."""
        return self.untraceable is None


#: Most paths the designs together may take (about a minute of calls on 2 cores) before the rest are
#: left to the statistical check.
MAX_TOTAL_PATHS = 100_000


def exact_check(sampler: Sampler) -> ExactOutcome:
    """Every design of :func:`designs_for`. A failed design stands even where another was not enumerable
    (support, raising and malformed-return failures on any path; law failures only where every path
    they rest on gave the same outcome again)."""
    checks, untraceable, paths, algorithm = [], None, 0, True
    for design in designs_for(sampler):
        if paths > MAX_TOTAL_PATHS:
            untraceable = untraceable or f"its draws make more than {MAX_TOTAL_PATHS} paths over the designs"
            checks.append(_check(design, "", NOT_ENUMERABLE, False))
            continue
        outcome = check_design(sampler, design)
        paths += outcome.paths
        if outcome.untraceable is not None:
            untraceable = untraceable or outcome.untraceable
            outcome.check.passed = False
            if not outcome.check.observed.startswith(NOT_ENUMERABLE):  # a law failure under unseen randomness
                outcome.check.observed = NOT_ENUMERABLE
        checks.append(outcome.check)
        algorithm &= outcome.algorithm_1 is not False
    return ExactOutcome(checks, untraceable, paths, algorithm)
