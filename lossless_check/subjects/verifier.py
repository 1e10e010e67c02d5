"""Exact, white-box checks of the installed ``_speculative_sampling`` (``lossless-check verifier``).

Every other check of the harness treats the verifier as correct and tests the generator around it.
This one tests the verifier itself, with no sampling: it calls the installed function on known p and
q while its randomness is controlled. ``torch.rand_like`` (and ``torch.rand``) return a chosen ``r``
per draft (a float32 grid value, or the very ratio ``p/q`` the function computed and handed to
``rand_like``), and ``torch.multinomial`` records the distribution it is given and returns its last
possible token. Each call is then compared with Algorithm 1 of Leviathan et al.: accept draft ``i``
iff ``r_i < p_i/q_i`` (probability ``min(1, p/q)``); at the first rejection sample
``normalize(max(p - q, 0))``; after a full accept sample the bonus token from ``p_{gamma+1}``.

The distributions are uniform on subsets of an 8-token vocabulary (logits 0 and ``-inf``), so every
softmax, ratio and residual is exact in float32 and the comparisons are equalities, not tolerances:
p = 1/4 on {0,1,2,3}, q = 1/2 on {0,4} (draft 0: p/q = 1/2; draft 4: p = 0), bonus law 1/2 on {5,6}.

Why ``r = p/q`` must reject: float32 ``torch.rand`` on CPU is ``(32 random bits & (2^24 - 1)) * 2^-24``
(``ATen/core/TransformationHelper.h``, ``uniform_real``), uniform on the grid ``k / 2^24``,
``k = 0 .. 2^24 - 1``. Accepting iff ``r < p/q`` accepts with probability exactly ``p/q`` for every
``p/q`` on that grid, 0 included; accepting iff ``r <= p/q`` adds ``P(r = p/q) = 2^-24``, and for
``p = 0`` turns an impossible token into one emitted with probability ``2^-24 = 5.96e-8`` per
zero-probability draft. :func:`rand_grid` checks the grid claim on the installed torch.

``assistant_ensemble_weight`` (DIVERSE, where the installed signature has it) is checked against the
law its docstring states: verification against ``v = w p + (1 - w) q``, acceptance ``min(1, v/q) =
1 - w + w p/q``, the same residual ``normalize(max(p - q, 0))``: a documented bias (a draft with
``p = 0`` is accepted with probability ``1 - w``), verified as documented.
"""

from __future__ import annotations

import inspect
import math
import re
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from lossless_check.core.compat import speculative_sampling, verifier_parameters

GRID = 2**24
#: The largest value float32 ``torch.rand`` returns.
TOP = 1.0 - 2.0**-24
#: Probability of one given float32 ``torch.rand`` value (``r = 0`` among them).
RATE = 2.0**-24
VOCAB = 8
#: The ensemble weight the DIVERSE checks use (w = 1/2 keeps every ratio exact).
ENSEMBLE_WEIGHT = 0.5
#: A seed and draw index at which float32 ``torch.rand`` returns exactly 0 on CPU (found by search).
ZERO_DRAW = (3, 1_532_311)


def uniform(*support: int) -> np.ndarray:
    law = np.zeros(VOCAB)
    law[list(support)] = 1.0 / len(support)
    return law


P, Q, BONUS, FLAT = uniform(0, 1, 2, 3), uniform(0, 4), uniform(5, 6), uniform(*range(VOCAB))


@dataclass
class VerifierCheck:
    """One exact check: what the algorithm's law says and what the installed code did."""

    name: str
    law: str
    expected: str
    observed: str
    passed: bool
    rate: str = ""  # for a failure: how often real randomness reaches it


@dataclass
class VerifierReport:
    """The checks, and for a failure the line of the installed source it comes from."""

    transformers_version: str
    source: str
    checks: list[VerifierCheck] = field(default_factory=list)
    defects: list[dict] = field(default_factory=list)
    premises: list[VerifierCheck] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_dict(self) -> dict:
        return {"transformers_version": self.transformers_version, "source": self.source,
                "verdict": "lossless" if self.clean else "not_lossless",
                "premises": [asdict(c) for c in self.premises], "checks": [asdict(c) for c in self.checks],
                "defects": self.defects}


@dataclass
class Call:
    """What one controlled call of the verifier did."""

    tokens: list[int]
    n_matches: int
    ratios: list[float]
    sampled_from: list[np.ndarray]  # every distribution handed to torch.multinomial


def _r_values(ratio: torch.Tensor, spec: list) -> torch.Tensor:
    """``r`` per draft: a number, ``"at"`` (the ratio itself) or ``"below"`` (the grid value just under it)."""
    values = []
    for i, v in enumerate(ratio.reshape(-1).double().tolist()):
        s = spec[i] if i < len(spec) else TOP
        values.append(v if s == "at" else min(TOP, (math.ceil(v * GRID) - 1) / GRID) if s == "below" else float(s))
    return torch.tensor(values, dtype=ratio.dtype).reshape(ratio.shape)


@contextmanager
def controlled(spec: list, ratios: list, sampled_from: list):
    """Patch ``torch.rand_like``/``torch.rand``/``torch.multinomial`` while the verifier runs (restored after)."""
    originals = torch.rand_like, torch.rand, torch.multinomial

    def rand_like(tensor, *args, **kwargs):
        ratios.extend(tensor.reshape(-1).double().tolist())
        return _r_values(tensor, spec)

    def rand(*size, **kwargs):
        # No release calls torch.rand here; if one does, its r values follow ``spec`` in order.
        shape = torch.Size(size[0] if len(size) == 1 and not isinstance(size[0], int) else size)
        return _r_values(torch.full(shape, float("nan")), [s if s not in ("at", "below") else TOP for s in spec])

    def multinomial(probs, num_samples, *args, **kwargs):
        rows = probs.reshape(-1, probs.shape[-1]).detach()
        sampled_from.extend(row.double().numpy().copy() for row in rows)
        if not bool(torch.isfinite(rows).all()) or bool((rows < 0).any()) or bool((rows.sum(-1) <= 0).any()):
            raise RuntimeError("probability tensor contains either inf, nan or element < 0, or sums to 0")
        last = torch.tensor([int(torch.nonzero(row > 0)[-1]) for row in rows], dtype=torch.long)
        return last[:, None].expand(-1, num_samples).reshape(*probs.shape[:-1], num_samples)

    torch.rand_like, torch.rand, torch.multinomial = rand_like, rand, multinomial
    try:
        yield
    finally:
        torch.rand_like, torch.rand, torch.multinomial = originals


def _logits(laws: list[np.ndarray], dtype: torch.dtype) -> torch.Tensor:
    with np.errstate(divide="ignore"):
        return torch.tensor(np.log(np.stack(laws)), dtype=torch.float32)[None].to(dtype)


def call_verifier(p_rows: list[np.ndarray], q_rows: list[np.ndarray], drafts: list[int], spec: list,
                  dtype: torch.dtype = torch.float32, **extra) -> Call:
    """One call of the installed verifier on these laws and drafts, ``r`` per ``spec`` (see :func:`_r_values`)."""
    prompt = [7, 7]
    ratios: list[float] = []
    sampled_from: list[np.ndarray] = []
    with torch.no_grad(), controlled(spec, ratios, sampled_from):
        tokens, n = speculative_sampling()(torch.tensor([prompt + drafts]), _logits(q_rows, dtype), len(drafts),
                                           _logits(p_rows, torch.float32), **extra)
    return Call(tokens[0].tolist(), int(n), ratios, sampled_from)


def _describe(n: int, tokens: list[int], law: np.ndarray | None) -> str:
    where = f"; sampled from {_law_text(law)}" if law is not None else ""
    return f"n_matches={n}, emits {tokens}{where}"


def _law_text(law: np.ndarray) -> str:
    support = np.flatnonzero(law > 0)
    values = {round(float(law[i]), 6) for i in support}
    return (f"{values.pop():.4g} on {set(support.tolist())}" if len(values) == 1
            else "{" + ", ".join(f"{i}: {law[i]:.4g}" for i in support) + "}")


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``normalize(max(p - q, 0))``, the law of the token after a rejection."""
    mass = np.maximum(p - q, 0.0)
    return mass / mass.sum()


def run_check(name: str, law: str, p_rows, q_rows, drafts, spec, n_expected: int, next_law: np.ndarray,
              ratios: list[float] | None = None, dtype=torch.float32, rate: str = "", **extra) -> VerifierCheck:
    """Call the verifier once and compare: ``n_matches``, the accepted drafts, the law the next token is
    sampled from (exactly, in float32), the token emitted, and the ratios when given."""
    try:
        got = call_verifier(p_rows, q_rows, drafts, spec, dtype, **extra)
    except Exception as exc:  # noqa: BLE001 - a verifier that raises on a valid input fails the check
        return VerifierCheck(name, law, _describe(n_expected, drafts[:n_expected] + ["x"], next_law),
                             f"raises {type(exc).__name__}: {exc}", False, rate)
    observed_law = got.sampled_from[-1] if got.sampled_from else None
    exact = torch.tensor(next_law, dtype=torch.float32).double().numpy()
    picked = int(np.flatnonzero(next_law > 0)[-1])
    passed = (got.n_matches == n_expected and got.tokens == drafts[:n_expected] + [picked]
              and len(got.sampled_from) == 1 and np.array_equal(observed_law, exact)
              and (ratios is None or np.array_equal(np.array(got.ratios), np.array(ratios))))
    expected = _describe(n_expected, drafts[:n_expected] + [picked], next_law)
    if ratios is not None:
        expected += f"; ratios {ratios}"
    observed = _describe(got.n_matches, got.tokens, observed_law)
    if ratios is not None:
        observed += f"; ratios {[round(r, 6) for r in got.ratios]}"
    return VerifierCheck(name, law, expected, observed, passed, "" if passed else rate)


ZERO_RATE = f"a draft with p = 0 is accepted iff r = 0: probability 2^-24 = {RATE:.3g} per such draft"
AT_RATE = f"acceptance probability p/q + 2^-24 (+{RATE:.3g}) for every p/q on the float32 rand grid"


def standard_checks(dtype: torch.dtype = torch.float32, names: tuple[str, ...] | None = None) -> list[VerifierCheck]:
    """Algorithm 1, ``candidate_logits`` in ``dtype`` (``names``: only these checks)."""
    r_pq = residual(P, Q)
    law = "accept iff r < p/q"
    suffix = "" if dtype == torch.float32 else f" ({str(dtype).removeprefix('torch.')} q)"
    cases = [
        ("r just below p/q accepts; bonus from p_{gamma+1}", law + "; all accepted: bonus ~ p_{gamma+1}",
         [P, P, BONUS], [Q, Q], [0, 0], ["below", "below"], 2, BONUS, [0.5, 0.5], ""),
        ("r = p/q rejects", law + "; first rejection: normalize(max(p-q,0))",
         [P, P, BONUS], [Q, Q], [0, 0], ["at", 0.0], 0, r_pq, [0.5, 0.5], AT_RATE),
        ("r above p/q rejects", law + "; first rejection: normalize(max(p-q,0))",
         [P, P, BONUS], [Q, Q], [0, 0], [TOP, TOP], 0, r_pq, None, ""),
        ("p = 0 draft, r = 0 rejects (position 1)", "p = 0: acceptance probability 0",
         [P, P, BONUS], [Q, Q], [4, 0], [0.0, 0.0], 0, r_pq, [0.0, 0.5], ZERO_RATE),
        ("p = 0 draft, r = 0 rejects (position 2)", "p = 0: acceptance probability 0",
         [P, P, BONUS], [Q, Q], [0, 4], [0.0, 0.0], 1, r_pq, None, ZERO_RATE),
        ("p = q: largest r accepts (zero residual never formed)", "p/q = 1: acceptance probability 1",
         [P, P, BONUS], [P, P], [1, 2], [TOP, TOP], 2, BONUS, [1.0, 1.0], ""),
        ("p > q: largest r accepts", "p/q >= 1: acceptance probability 1",
         [P, P, BONUS], [FLAT, FLAT], [0, 1], [TOP, TOP], 2, BONUS, [2.0, 2.0], ""),
    ]
    return [run_check(name + suffix, law_, p, q, d, s, n, nxt, ratios, dtype, rate)
            for name, law_, p, q, d, s, n, nxt, ratios, rate in cases if names is None or name in names]


def ensemble_checks(weight: float = ENSEMBLE_WEIGHT) -> list[VerifierCheck]:
    """``assistant_ensemble_weight`` against its docstring's law (see the module docstring)."""
    w = weight
    law = f"DIVERSE w={w:g} (docstring): accept iff r < v/q = 1 - w + w p/q"
    at_zero = 1 - w  # v/q of a draft with p = 0
    at_half = 1 - w + w * 0.5
    return [
        run_check("DIVERSE: p = 0 draft, r just below 1-w accepts (documented bias)", law,
                  [P, P, BONUS], [Q, Q], [4, 0], ["below", TOP], 1, residual(P, Q), [at_zero, at_half],
                  assistant_ensemble_weight=w),
        run_check("DIVERSE: r = v/q rejects", law + "; residual normalize(max(v-q,0)) = normalize(max(p-q,0))",
                  [P, P, BONUS], [Q, Q], [4, 0], ["at", 0.0], 0, residual(P, Q), [at_zero, at_half],
                  rate=f"acceptance probability v/q + 2^-24 (+{RATE:.3g}) on the float32 rand grid",
                  assistant_ensemble_weight=w),
        run_check("DIVERSE: all accepted: bonus from p_{gamma+1}", law + "; bonus ~ p_{gamma+1}",
                  [P, P, BONUS], [Q, Q], [0, 0], [0.0, 0.0], 2, BONUS, [at_half, at_half],
                  assistant_ensemble_weight=w),
    ]


def rand_grid(draws: int = 2**22) -> VerifierCheck:
    """The premise of the rates: float32 CPU ``torch.rand`` values are ``k / 2^24``, and 0 is one of them."""
    generator = torch.Generator().manual_seed(0)
    values = torch.rand(draws, generator=generator).double() * GRID
    on_grid = bool((values == values.round()).all()) and float(values.max()) <= GRID - 1
    seed, index = ZERO_DRAW
    zero = float(torch.rand(index + 1, generator=torch.Generator().manual_seed(seed))[index])
    return VerifierCheck(
        "float32 torch.rand is uniform on k/2^24 and returns 0",
        "uniform_real: (random() & (2^24-1)) * 2^-24 (ATen TransformationHelper.h)",
        f"all of {draws} draws on the grid k/2^24; draw {index} after manual_seed({seed}) is 0",
        f"on grid: {on_grid}; that draw: {zero!r}", on_grid and zero == 0.0)


def acceptance_line() -> tuple[str, int, str]:
    """``(file, line, text)`` of the installed verifier's acceptance comparison (the line that uses the
    value ``torch.rand_like`` returned in a comparison)."""
    from transformers.generation.utils import _speculative_sampling

    lines, start = inspect.getsourcelines(_speculative_sampling)
    source = inspect.getsourcefile(_speculative_sampling)
    names = [m.group(1) for line in lines for m in [re.search(r"(\w+)\s*=\s*torch\.rand(?:_like)?\(", line)] if m]
    for offset, line in enumerate(lines):
        if any(re.search(rf"\b{name}\b\s*(<=|<|>=|>)", line) for name in names):
            return source, start + offset, line.strip()
    return source, start, lines[0].strip()


def verify() -> VerifierReport:
    """Run every check that applies to the installed release."""
    import transformers

    source, line, text = acceptance_line()
    report = VerifierReport(transformers.__version__, f"{source}:{line}")
    report.premises.append(rand_grid())
    report.checks += standard_checks()
    half_names = ("r just below p/q accepts; bonus from p_{gamma+1}", "r above p/q rejects",
                  "p = 0 draft, r = 0 rejects (position 1)")
    for dtype in (torch.bfloat16, torch.float16):
        report.checks += standard_checks(dtype, half_names)
    if "assistant_ensemble_weight" in verifier_parameters():
        report.checks += ensemble_checks()
    failing = [c for c in report.checks if not c.passed]
    if failing:
        report.defects.append({"file": source, "line": line, "source": text,
                               "checks": [c.name for c in failing],
                               "rates": sorted({c.rate for c in failing if c.rate})})
    return report
