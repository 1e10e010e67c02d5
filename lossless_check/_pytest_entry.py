"""pytest plugin of lossless-check, registered through the ``pytest11`` entry point ``lossless_check``.

Loaded by every pytest run in an environment where lossless-check is installed, so importing it is
cheap: no torch, no transformers (the first ``lossless.check`` of a session imports them). Disable
it with ``-p no:lossless_check``.

- Options (group ``lossless-check``): ``--lossless-alpha`` (family-wise false-failure rate of the
  session, default 1e-6), ``--lossless-samples`` (trials per check, default 5000),
  ``--lossless-seed`` (default 0), ``--lossless-report PATH`` (JSON of every check of the session,
  the schema of ``lossless-check run --json``).
- The ``lossless`` fixture (:class:`lossless_check.faces.pytest_plugin.Lossless`): ``check(...)`` returns
  a ``CaseResult``, ``assert_lossless(...)`` fails with a readable explanation; ``fuzz(...)`` and
  ``assert_fuzz_lossless(...)`` search random warper stacks; ``check_models(target=, assistant=, ...)`` and
  ``assert_models_lossless(...)`` check the test's own model pair (``lossless-check models``).
- The ``lossless`` marker tags tests that use the harness. Tests requesting the fixture get it
  automatically, so ``-m "not lossless"`` deselects every statistical test; the tagged tests are the
  ones the session's alpha is shared among; its keyword arguments ``samples``, ``scenario`` and
  ``seed`` are the test's defaults for its checks (see :mod:`lossless_check.faces.pytest_plugin`).
- A report-header line (seed, alpha, samples, transformers version) and a terminal-summary section
  listing every check (fuzz searches included) and its verdict.
- pytest-xdist: workers send their checks to the controller, which prints and writes them all.
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from lossless_check.core.options import positive_int, probability
from lossless_check.faces.pytest_plugin import (
    DEFAULT_ALPHA, DEFAULT_SAMPLES, DEFAULT_SEED, MARKER_OPTIONS, Lossless, SessionState,
)

_STATE = pytest.StashKey[SessionState]()
_WORKER_KEY = "lossless_check_records"
_VERDICT_MARKUP = {"lossless": {"green": True}, "not_lossless": {"red": True, "bold": True},
                   "error": {"yellow": True}, "vacuous": {"purple": True}, "skipped": {}}


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lossless-check",
                            "lossless-check: statistical checks that speculative decoding is lossless")
    group.addoption("--lossless-alpha", type=probability, default=DEFAULT_ALPHA, metavar="ALPHA",
                    help=f"family-wise false-failure rate of all checks in the session (default {DEFAULT_ALPHA:g})")
    group.addoption("--lossless-samples", type=positive_int, default=DEFAULT_SAMPLES, metavar="N",
                    help=f"trials per check unless the check says otherwise (default {DEFAULT_SAMPLES})")
    group.addoption("--lossless-seed", type=int, default=DEFAULT_SEED, metavar="SEED",
                    help=f"seed of every check's random stream (default {DEFAULT_SEED})")
    group.addoption("--lossless-report", metavar="PATH", default=None,
                    help="write every check of the session as JSON (the schema of lossless-check run --json)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"lossless({', '.join(f'{o}=...' for o in MARKER_OPTIONS)}): the test runs lossless-check cases and shares "
        "the session's --lossless-alpha; added automatically to tests that request the lossless fixture (deselect "
        "them all with -m 'not lossless'); its keyword arguments are the defaults of the test's checks",
    )
    config.stash[_STATE] = SessionState(
        alpha=config.getoption("lossless_alpha"),
        samples=config.getoption("lossless_samples"),
        seed=config.getoption("lossless_seed"),
        report=config.getoption("lossless_report"),
    )


def pytest_report_header(config: pytest.Config) -> str:
    state = config.stash[_STATE]
    try:
        transformers = version("transformers")
    except PackageNotFoundError:
        transformers = "not installed"
    return (f"lossless-check: seed {state.seed}, family alpha {state.alpha:g}, {state.samples} samples per check, "
            f"transformers {transformers}")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # tryfirst: before -m deselects, so that -m "not lossless" sees the marker.
    for item in items:
        if "lossless" in getattr(item, "fixturenames", ()) and item.get_closest_marker("lossless") is None:
            item.add_marker("lossless")


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[_STATE].budgeted = frozenset(
        item.nodeid for item in session.items if item.get_closest_marker("lossless") is not None)


@pytest.fixture
def lossless(request: pytest.FixtureRequest) -> Lossless:
    """Run lossless-check cases: ``lossless.check(generator, warpers="top_k=3", scenario="iid8", samples=None)``
    returns a ``CaseResult``; ``lossless.assert_lossless(...)`` fails the test with a readable explanation;
    ``lossless.fuzz(...)`` / ``lossless.assert_fuzz_lossless(...)`` search random warper stacks;
    ``lossless.check_models(target=..., assistant=...)`` / ``lossless.assert_models_lossless(...)`` check a model pair.
    ``@pytest.mark.lossless(samples=..., scenario=..., seed=...)`` sets the test's defaults."""
    marker = request.node.get_closest_marker("lossless")
    if marker is not None and marker.args:
        pytest.fail(f"@pytest.mark.lossless takes keyword arguments only ({', '.join(MARKER_OPTIONS)})",
                    pytrace=False)
    return Lossless(request.config.stash[_STATE], request.node.nodeid, marker.kwargs if marker else None)


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    state = config.stash[_STATE]
    if hasattr(config, "workeroutput"):
        config.workeroutput[_WORKER_KEY] = state.records
    elif state.report:
        path = Path(state.report)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(state.report_document(), indent=2) + "\n")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist, on the controller: merge a finished worker's checks."""
    node.config.stash[_STATE].records.extend(node.workeroutput.get(_WORKER_KEY, []))


def _summary_line(r: dict) -> str:
    """One check of the terminal summary (after its verdict): a step case, a fuzz search, a model pair, a sampler."""
    alpha = f"alpha {_fmt(r['alpha_case'], '.2g')}  {r['test']}"
    if r["mode"] == "fuzz":
        found = f"minimal failing stack [{r['warpers']}]" if r["warpers"] is not None else "no failing stack"
        return (f"{r['generator']} fuzz {r['scenario']}: {r['stacks_checked']} stacks, "
                f"{r['statistical_tests']} statistical tests, {found}  n={r['samples']}/stack  {alpha}")
    if r["mode"] == "sampler":
        return (f"{r['generator']} sampler ({r['protocol']} protocol): exact check {r['exact']}, "
                f"n={r['samples']}/pair  p={_fmt(r['p_value'], '.2g')}  {alpha}")
    if r["mode"] == "models":
        greedy = r["greedy"]
        greedy = f"{greedy['differ']}/{greedy['comparisons']} greedy outputs differ" if greedy else "no greedy check"
        return (f"{r['generator']} [{r['warpers']}] models {r['target']} / {r['assistant']}: "
                f"exact {r['exact'].get('verdict', '-')}, {r['samples']} tokens bet on, {greedy}  {alpha}")
    return (f"{r['generator']} [{r['warpers']}] {r['scenario']}  n={r['samples']}  TV {_fmt(r['tv'], '.4f')}  "
            f"p={_fmt(r['p_value'], '.2g')}  {alpha}")


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    state = config.stash[_STATE]
    if not state.records:
        return
    records = state.sorted_records()
    terminalreporter.write_sep("=", f"lossless-check: {len(records)} checks, family alpha {state.alpha:g}, "
                                    f"seed {state.seed}")
    for r in records:
        terminalreporter.write(f"{r['verdict']:<13}", **_VERDICT_MARKUP.get(r["verdict"], {}))
        terminalreporter.write_line(_summary_line(r))
    if state.report:
        terminalreporter.write_line(f"report: {state.report}")
