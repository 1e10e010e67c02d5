"""The pytest plugin as a downstream repository uses it: entry point, options, fixture, marker,
summary, report, and pytest-xdist."""

import json
import math
import shlex
import subprocess
import sys
from importlib.metadata import entry_points, version
from pathlib import Path

import pytest

from lossless_check.faces.cli import build_parser
from fixtures.releases import DFLASH, needs
from lossless_check.faces.pytest_plugin import check_alpha, failure_message, reproduce_command
from lossless_check.evidence.results import CaseResult

# In-process pytester runs restore sys.modules afterwards: a heavy module first imported inside one
# (transformers' generation utilities register torch ops) would be imported twice. Import it here.
import lossless_check.modes.step  # noqa: E402,F401

pytest_plugins = ["pytester"]

MUTANT_SOURCE = Path(__file__).parents[1] / "lossless_check" / "mutants" / "dflash_raw_logits.py"

DOWNSTREAM_TESTS = """
from mygen import DFlashReturnsRawLogits


def test_builtin_dflash_is_lossless(lossless):
    result = lossless.assert_lossless("DFlashTokenCandidateGenerator", warpers="top_k=3")
    assert result.verdict == "lossless" and result.samples == 5000


def test_raw_logits_mutant_is_lossless(lossless):
    lossless.assert_lossless(DFlashReturnsRawLogits, warpers="top_k=3")


def test_unrelated():
    pass
"""


def test_entry_point_is_registered_and_imports_no_torch():
    points = {e.name: e.value for e in entry_points(group="pytest11")}
    assert points.get("lossless_check") == "lossless_check._pytest_entry"
    code = ("import lossless_check._pytest_entry, sys; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_options_marker_and_header(pytester):
    help_text = pytester.runpytest("--help").stdout.str()
    assert "lossless-check:" in help_text
    for option in ("--lossless-alpha", "--lossless-samples", "--lossless-seed", "--lossless-report"):
        assert option in help_text
    pytester.runpytest("--markers").stdout.fnmatch_lines(
        ["@pytest.mark.lossless(samples=..., scenario=..., seed=...): *defaults of the test's checks"])
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest("--lossless-seed", "7", "--lossless-alpha", "1e-3")
    result.stdout.fnmatch_lines([f"lossless-check: seed 7, family alpha 0.001, 5000 samples per check, "
                                 f"transformers {version('transformers')}"])
    result.stdout.no_fnmatch_line("*lossless-check: * checks*")
    bad = pytester.runpytest("--lossless-alpha", "2")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--lossless-alpha*must lie strictly between 0 and 1*"])


def test_session_without_checks_stays_light(pytester):
    pytester.makepyfile("""
        import sys

        def test_no_heavy_imports():
            assert "torch" not in sys.modules and "transformers" not in sys.modules
    """)
    pytester.runpytest_subprocess("-p", "no:benchmark").assert_outcomes(passed=1)


def test_marker_is_added_and_unbudgeted_checks_fail(pytester):
    pytester.makepyfile(test_static="""
        def test_uses_fixture(lossless):
            pass

        def test_plain():
            pass
    """, test_dynamic="""
        def test_dynamic(request):
            request.getfixturevalue("lossless").check("DFlashTokenCandidateGenerator")
    """)
    pytester.runpytest("-m", "not lossless", "test_static.py").assert_outcomes(passed=1, deselected=1)
    result = pytester.runpytest("test_dynamic.py")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test_dynamic* is not counted in the lossless-check alpha budget*"
                                 "mark it @pytest.mark.lossless"])


def test_alpha_spending_stays_within_the_family_rate():
    assert check_alpha(1e-6, 1, 1) == pytest.approx(1e-6 * 6 / math.pi**2)
    assert check_alpha(1e-6, 4, 3) == pytest.approx(1e-6 / 4 * 6 / math.pi**2 / 9)
    spent = sum(check_alpha(1e-6, 5, k) for _ in range(5) for k in range(1, 100_000))
    assert spent < 1e-6


def test_reproduce_command_is_the_same_case_for_the_cli():
    alpha = check_alpha(1e-6, 3, 2)
    command = reproduce_command("my mod:Gen", "top_k=3,temperature=0.7", "iid8", 5000, 11, alpha)
    args = build_parser().parse_args(shlex.split(command)[1:])
    assert (args.generator, args.warpers, args.mode, args.scenario, args.samples, args.seed, args.alpha) == (
        ["my mod:Gen"], ["top_k=3,temperature=0.7"], "step", "iid8", 5000, 11, alpha)


def test_failure_message_for_a_generator_error():
    result = CaseResult("Gen", "top_k=3", "step", "iid8", verdict="error", reason="get_candidates raised ValueError")
    assert failure_message(result, "lossless-check run ...") == (
        "Gen could not be checked under warpers [top_k=3] (scenario iid8): get_candidates raised ValueError\n"
        "reproduce: lossless-check run ...")


def _run_downstream(pytester, *args):
    """Run the downstream suite; check its outcome, messages, summary and report; return the report's cases."""
    report = pytester.path / f"report{len(args)}.json"
    result = pytester.runpytest("-p", "no:benchmark", "--lossless-report", str(report), *args)
    result.assert_outcomes(passed=2, failed=1)
    alpha = 1e-6 / 2 * 6 / math.pi**2  # two budgeted tests, one check each
    result.stdout.fnmatch_lines([
        "lossless-check: seed 0, family alpha 1e-06, 5000 samples per check, transformers *",
        "*_ test_raw_logits_mutant_is_lossless _*",
        f"DFlashReturnsRawLogits is not lossless under warpers [[]top_k=3[]] (scenario iid8, 5000 samples, "
        f"alpha {alpha:.3g})",
        "  failed sub-checks: output_law@1*",
        "  output law at position 1: TV * > threshold * (p=*, n=5000)",
        "  acceptance rate * vs theory *: excess +* (acceptance law *)",
        "reproduce: lossless-check run --generator mygen:DFlashReturnsRawLogits --warpers top_k=3 --mode step "
        f"--scenario iid8 --samples 5000 --seed 0 --alpha {alpha!r} --fixed",
        "*= lossless-check: 2 checks, family alpha 1e-06, seed 0 =*",
        "lossless     DFlashTokenCandidateGenerator [[]top_k=3[]] iid8  n=5000  TV *test_builtin_dflash_is_lossless",
        "not_lossless DFlashReturnsRawLogits [[]top_k=3[]] iid8  n=5000  TV *test_raw_logits_mutant_is_lossless",
        f"report: {report}",
    ])
    doc = json.loads(report.read_text())
    assert doc["alpha_family"] == 1e-6 and doc["seed"] == 0 and doc["transformers_version"]
    cases = doc["cases"]
    assert [(c["test"], c["generator"], c["verdict"]) for c in cases] == [
        ("test_plugin_user.py::test_builtin_dflash_is_lossless", "DFlashTokenCandidateGenerator", "lossless"),
        ("test_plugin_user.py::test_raw_logits_mutant_is_lossless", "DFlashReturnsRawLogits", "not_lossless"),
    ]
    assert all(c["alpha_case"] == alpha and c["samples"] == 5000 and c["warpers"] == "top_k=3" for c in cases)
    return cases


# heavy (.ci/run's first step; issue 41): 20 s or more in the suite (38 s on 2 cores).
@needs(DFLASH)
@pytest.mark.heavy
def test_downstream_suite_serial_and_xdist(pytester, monkeypatch):
    """A correct generator passes, a mutant fails readably; under -n 2 the merged report has the same checks."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    pytester.makepyfile(mygen=MUTANT_SOURCE.read_text(), test_plugin_user=DOWNSTREAM_TESTS)
    serial = _run_downstream(pytester)
    parallel = _run_downstream(pytester, "-n", "2")

    def statistics(cases):
        return [{k: v for k, v in c.items() if k not in ("seconds", "samples_per_second")} for c in cases]

    assert statistics(parallel) == statistics(serial)


@needs(DFLASH)
def test_marker_options_are_the_tests_defaults(pytester, monkeypatch):
    """``@pytest.mark.lossless(samples=, scenario=, seed=)`` sets a test's defaults; a check's own argument wins;
    an unknown option fails the test in one line."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    pytester.makepyfile(test_marked="""
        import pytest

        @pytest.mark.lossless(samples=300, scenario="markov8", seed=5)
        def test_marked(lossless):
            assert lossless.check("DFlashTokenCandidateGenerator").samples == 300
            assert lossless.check("DFlashTokenCandidateGenerator", samples=200, scenario="iid8").samples == 200

        @pytest.mark.lossless(alpha=0.1)
        def test_bad_option(lossless):
            pass
    """)
    report = pytester.path / "report.json"
    result = pytester.runpytest("-p", "no:benchmark", "--lossless-report", str(report))
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*@pytest.mark.lossless takes samples, scenario, seed as keyword arguments, not alpha*"])
    cases = json.loads(report.read_text())["cases"]
    assert [(c["samples"], c["scenario"]) for c in cases] == [(300, "markov8"), (200, "iid8")]
    assert all(" --seed 5 " in c["reproduce"] for c in cases)


# heavy (.ci/run's first step): 36 s alone.
@needs(DFLASH)
@pytest.mark.heavy
def test_fuzz_checks_are_in_the_summary_and_the_report(pytester, monkeypatch):
    """A fuzz search is one check of its test: in the terminal summary and in --lossless-report (mode fuzz).
    800 trials a stack: a pass with power 0.99 at TV 0.3 (fewer is inconclusive, no pass)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    pytester.makepyfile(test_fuzzed="""
        def test_builtin_fuzzed(lossless):
            lossless.assert_fuzz_lossless("DFlashTokenCandidateGenerator", examples=2, samples=800,
                                          database="db")

        def test_greedy_mutant_fuzzed(lossless):
            lossless.assert_fuzz_lossless("lossless_check.mutants.dflash_greedy_draft:DFlashGreedyDraft", examples=3,
                                          samples=800, database="db")

        def test_step(lossless):
            lossless.check("DFlashTokenCandidateGenerator", samples=800)
    """)
    report = pytester.path / "report.json"
    result = pytester.runpytest("-p", "no:benchmark", "--lossless-report", str(report))
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "*= lossless-check: 3 checks, family alpha 1e-06, seed 0 =*",
        "lossless     DFlashTokenCandidateGenerator fuzz markov8: * stacks, * statistical tests, no failing stack  "
        "n=800/stack  alpha *  test_fuzzed.py::test_builtin_fuzzed",
        "not_lossless DFlashGreedyDraft fuzz markov8: * stacks, * statistical tests, minimal failing stack [[]*[]]  "
        "n=800/stack  alpha *  test_fuzzed.py::test_greedy_mutant_fuzzed",
        "lossless     DFlashTokenCandidateGenerator [[]top_k=3[]] iid8  n=800  *test_fuzzed.py::test_step",
    ])
    cases = json.loads(report.read_text())["cases"]
    assert [(c["test"].split("::")[1], c["mode"], c["verdict"]) for c in cases] == [
        ("test_builtin_fuzzed", "fuzz", "lossless"), ("test_greedy_mutant_fuzzed", "fuzz", "not_lossless"),
        ("test_step", "step", "lossless")]
    builtin, mutant, _ = cases
    assert builtin["warpers"] is None and builtin["reproduce"] is None and builtin["stacks_checked"] >= 1
    assert mutant["warpers"] and mutant["reproduce"].startswith("lossless-check run --generator lossless_check.mutants")
    alpha = 1e-6 / 3 * 6 / math.pi**2
    assert all(c["alpha_case"] == pytest.approx(alpha) and c["samples"] == 800 for c in cases)
    assert builtin["alpha_spent"] <= alpha


MODELS_TESTS = """
TARGET, ASSISTANT = {target!r}, {assistant!r}


def test_builtin_assisted_pair(lossless):
    result = lossless.assert_models_lossless(TARGET, ASSISTANT, "AssistedCandidateGenerator", samples=2,
                                             max_new_tokens=8)
    assert [r.verdict for r in result.rows] == ["lossless"] and result.exit_code == 0


def test_raw_logits_mutant_pair(lossless):
    lossless.assert_models_lossless(TARGET, ASSISTANT, "fixtures.mutants.assisted_raw_logits:AssistedReturnsRawLogits",
                                    samples=2, max_new_tokens=8)
"""


def test_a_downstream_test_checks_its_own_model_pair(pytester, tmp_path_factory, monkeypatch):
    """``lossless.assert_models_lossless`` on a saved pair: the built-in passes; the raw-logits mutant (the
    negative control) fails with what failed and the ``lossless-check models`` command; both rows are in
    the terminal summary and the report, at the check's share of the session's alpha."""
    from fixtures.model_pair import save_pair

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    target, assistant = save_pair(tmp_path_factory.mktemp("pair"))
    pytester.makepyfile(test_own_pair=MODELS_TESTS.format(target=target, assistant=assistant))
    report = pytester.path / "report.json"
    result = pytester.runpytest("-p", "no:benchmark", "--lossless-report", str(report))
    result.assert_outcomes(passed=1, failed=1)
    alpha = 1e-6 / 2 * 6 / math.pi**2
    result.stdout.fnmatch_lines([
        "*_ test_raw_logits_mutant_pair _*",
        f"the pair target {target} / assistant {assistant} is not lossless (alpha {alpha:.3g}, seed 0)",
        "  not_lossless AssistedReturnsRawLogits [[]top_k=50[]]: exact: returned q is not the law the drafts were "
        "drawn from at * draft tokens; first: call 1, round 1, draft position 1: *",
        f"reproduce: lossless-check models --target {target} --assistant {assistant} --generator "
        f"fixtures.mutants.assisted_raw_logits:AssistedReturnsRawLogits --warpers top_k=50 --max-new-tokens 8 "
        f"--samples 2 --seed 0 --alpha {alpha!r} --device cpu",
        "*= lossless-check: 2 checks, family alpha 1e-06, seed 0 =*",
        f"lossless     AssistedCandidateGenerator [[]top_k=50[]] models {target} / {assistant}: exact consistent, "
        f"16 tokens bet on, 0/4 greedy outputs differ  alpha *  test_own_pair.py::test_builtin_assisted_pair",
        "not_lossless AssistedReturnsRawLogits [[]top_k=50[]] models * exact inconsistent, *"
        "test_own_pair.py::test_raw_logits_mutant_pair",
    ])
    cases = json.loads(report.read_text())["cases"]
    assert [(c["test"].split("::")[1], c["mode"], c["verdict"], c["alpha_case"]) for c in cases] == [
        ("test_builtin_assisted_pair", "models", "lossless", alpha),
        ("test_raw_logits_mutant_pair", "models", "not_lossless", alpha)]
    assert cases[1]["exact"]["verdict"] == "inconsistent" and cases[1]["reproduce"].startswith("lossless-check models")
