"""A user's own rejection sampler as the subject (``lossless-check verifier --sampler``, ``lc.check_sampler``,
``run --sampler``, the plugin's ``assert_sampler_lossless``).

The negative controls are ``fixtures/user_samplers.py``: one sampler per bug class, in both protocols, each
convicted; lossless samplers written differently (vectorised with ``torch.searchsorted``, ``u q < p``,
``torch.bernoulli``, a different lossless acceptance scheme, an exponential race the exact check cannot
enumerate, draws the exact check cannot see), each passed. The installed ``_speculative_sampling`` gets the
same verdict through ``--sampler`` as through ``lossless-check verifier``.
"""

from __future__ import annotations

import json

import pytest
import torch

from fixtures import user_samplers
from fixtures.forced_draws import force_r_0_at_impossible_drafts
from fixtures.releases import VERIFIER_ACCEPTS_AT_R_0, within
from lossless_check.core.errors import UsageError
from lossless_check.faces.api import check_sampler
from lossless_check.faces.cli import main
from lossless_check.subjects.sampler import load_sampler, protocol_of
from lossless_check.subjects.sampler_exact import NOT_ENUMERABLE, ZERO_RATE
from lossless_check.subjects.sampler_statistical import designs

ACCEPTS_AT_R_0 = within(VERIFIER_ACCEPTS_AT_R_0)
INSTALLED = "transformers.generation.utils:_speculative_sampling"
#: Trials per draft/target pair where the verdict rests on the exact check (the statistical part still
#: runs, at its stated false-failure rate).
FEW = 100
#: Trials per pair for a sampler only the statistical check can convict: its wrong residual is rejected at
#: a Holm-adjusted p of about 1e-12 at 300 (measured), far below alpha 1e-6.
STATISTICAL = 500
UNTRACEABLE_BUG = "exponential_race_residual_from_p"

pytest_plugins = ["pytester"]


def spec(name: str) -> str:
    return f"fixtures.user_samplers:{name}"


def both_protocols(names) -> list[str]:
    return [spec(n) for n in names] + [spec(f"tf_{n}") for n in names]


@pytest.mark.parametrize("sampler", both_protocols(user_samplers.BUGS) + [spec("fork_accepts_at_ratio"),
                                                                          spec("fork_ignores_is_done")])
def test_every_bug_class_is_convicted(sampler):
    untraceable = sampler.endswith(UNTRACEABLE_BUG)
    report = check_sampler(sampler, samples=STATISTICAL if untraceable else FEW)
    assert report.verdict == "not_lossless", report.reason
    if untraceable:  # its draws cannot be enumerated: only the statistical check sees the wrong residual
        assert not report.exact.traced and not report.exact.failed and report.statistical.rejected
    elif sampler.endswith("gumbel_max"):  # not enumerable either, but the one path run shows u = 0's token
        assert not report.exact.traced and report.exact.failed[0].rate == ZERO_RATE
        assert "it needs torch.rand_like[" in report.exact.failed[0].observed
    else:
        assert report.exact.traced and report.exact.failed and report.reason.startswith("exact: ")


@pytest.mark.parametrize("sampler", both_protocols(user_samplers.LOSSLESS) + [spec("fork"), spec("strict_installed")])
def test_every_equivalent_sampler_passes(sampler):
    report = check_sampler(sampler, samples=FEW)
    assert report.verdict == "lossless", report.reason
    assert not report.statistical.rejected and not report.statistical.exact_failures
    if sampler.endswith(("exponential_race", "gumbel_max_clamped")):
        assert not report.exact.traced and ("Tensor.exponential_" in report.exact.untraceable
                                            or "paths (more than" in report.exact.untraceable)
        assert report.reason.startswith("exact check not applicable") and "detects TV >=" in report.reason
        return
    assert report.exact.traced and not report.exact.failed
    # Lossless with fewer accepts than Algorithm 1: the exact check says so, and passes them.
    different = sampler.rpartition(":")[2].removeprefix("tf_") in ("half_acceptance", "q_as_one_hot")
    assert report.exact.algorithm_1 is not different


@pytest.mark.parametrize("name", user_samplers.HIDDEN)
def test_draws_the_check_does_not_see_are_never_passed_exactly(name):
    """``torch.rand`` bound at import (torch's global generator moves) and a private numpy generator (a fixed
    path's draws change between runs): not enumerable, so checked statistically, where they pass."""
    report = check_sampler(spec(name), samples=FEW)
    assert not report.exact.traced and report.verdict == "lossless"
    assert report.reason.startswith("exact check not applicable")
    assert all(c.observed == NOT_ENUMERABLE or c.passed for c in report.exact.checks)


def test_installed_verifier_gets_the_same_verdict_through_sampler(tmp_path):
    installed, sampler = tmp_path / "verifier.json", tmp_path / "sampler.json"
    expected = 1 if ACCEPTS_AT_R_0 else 0
    assert main(["verifier", "--json", str(installed)]) == expected
    assert main(["verifier", "--sampler", INSTALLED, "--samples", str(FEW), "--json", str(sampler)]) == expected
    doc = json.loads(sampler.read_text())
    assert doc["protocol"] == "transformers" and doc["exact"]["traced"]
    assert doc["verdict"] == json.loads(installed.read_text())["verdict"]
    if ACCEPTS_AT_R_0:  # the same defect: r = 0 accepts a draft of target probability 0, at the same rate
        zero = [c for c in doc["exact"]["checks"] if c["rate"] == ZERO_RATE]
        assert zero and all("where p" in c["observed"] and ") = 0" in c["observed"] for c in zero)
        assert "torch.rand_like[0] -> 0.0" in zero[0]["observed"]


def test_the_fixed_verifier_passes_through_sampler():
    """The installed verifier with findings/verifier_accepts_zero_probability's fix applied to its source."""
    assert main(["verifier", "--sampler", spec("strict_installed"), "--samples", str(FEW)]) == 0


def test_accepting_at_r_0_is_shown_with_its_draws_and_rate():
    """The rate of r = 0 is given where only r = 0 shows the failure; a wrong bonus law shows elsewhere too."""
    first = check_sampler(spec("accepts_at_ratio"), samples=FEW).exact.failed[0]
    assert first.rate == ZERO_RATE and "accepts draft 2 at position 2, where p2(2) = 0" in first.observed
    assert "torch.rand[1] -> 0.0" in first.observed
    bonus = check_sampler(spec("bonus_from_q"), samples=FEW).exact.failed[0]
    assert bonus.rate == "" and "at position 3, where p3(" in bonus.observed


def test_a_threshold_off_by_one_grid_step_is_seen_inside_its_cell():
    """``u <= p/q`` at a positive ratio (acceptance probability p/q + 2^-24): at u = p/q = 1/2 it accepts,
    at the grid value just under 3/4 it rejects, inside one cell of width 1/4."""
    report = check_sampler(spec("accepts_at_ratio"), samples=FEW)
    inside = [c for c in report.exact.failed if "inside a cell" in c.observed]
    assert inside and "-> 0.5;" in inside[0].observed and "-> 0.7499999403953552" in inside[0].observed


def test_protocols_are_read_from_the_signature():
    assert protocol_of(user_samplers.loop) == "probs"
    assert protocol_of(user_samplers.tf_loop) == protocol_of(user_samplers.fork) == "transformers"
    assert load_sampler(INSTALLED).protocol == "transformers"
    assert protocol_of(lambda *args: None, "probs") == "probs"
    for function, stated, message in [
        (lambda *args: None, None, "state its protocol"),
        (lambda a, b: None, None, "neither protocol fits"),
        (user_samplers.loop, "transformers", "cannot be called with the transformers protocol"),
        (lambda a, b, c, d, extra: None, None, "requires extra"),
    ]:
        with pytest.raises(UsageError, match=message):
            protocol_of(function, stated)


@pytest.mark.parametrize("argv, message", [
    (["verifier", "--sampler", "fixtures.user_samplers:nope"], "has no attribute 'nope'"),
    (["verifier", "--sampler", "no_such_module:f"], "cannot import module 'no_such_module' for sampler"),
    (["verifier", "--sampler", "fixtures.user_samplers:LOSSLESS"], "not a function"),
    (["verifier", "--sampler", "fixtures.user_samplers:_residual"], "neither protocol fits"),
    (["verifier", "--protocol", "probs"], "--protocol applies only with --sampler"),
    (["verifier", "--samples", "10"], "--samples applies only with --sampler"),
    (["run", "--generator", "AssistedCandidateGenerator", "--sampler", spec("loop"), "--mode", "greedy"],
     "greedy mode never does"),
])
def test_bad_sampler_usage_is_one_line_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_the_controlled_primitives_are_restored():
    names = [(torch, n) for n in ("rand", "rand_like", "multinomial", "bernoulli", "randn")] + [
        (torch.Tensor, n) for n in ("uniform_", "multinomial", "bernoulli", "bernoulli_", "exponential_")]
    before = [getattr(owner, name) for owner, name in names]
    state = torch.random.get_rng_state()
    for name in ("loop", "exponential_race", "residual_abs"):
        check_sampler(spec(name), samples=10)
    assert [getattr(owner, name) for owner, name in names] == before
    assert torch.equal(torch.random.get_rng_state(), state)  # the statistical check forks torch's stream


def test_is_done_drops_the_bonus_for_a_sampler_without_the_parameter():
    """Releases up to 5.17 pass ``is_done_candidate``: after a full accept, no bonus token. A sampler that takes
    it decides; for one that does not (either protocol), the adapter drops the bonus as those releases do."""
    p = torch.full((1, 3, 8), -float("inf"))
    p[..., 6:] = 0.0  # p = q: every draft accepted
    ids = torch.tensor([[7, 7, 6, 7]])
    for name in ("loop", "tf_loop", "fork"):
        sampler = load_sampler(spec(name))
        valid, n = sampler.verify(ids, p[:, :2], 2, p, is_done=True)
        assert valid.tolist() == [[6, 7]] and n == 1
        valid, n = sampler.verify(ids, p[:, :2], 2, p)
        assert valid.shape == (1, 3) and n == 2


def test_the_statistical_check_states_its_power():
    """At 2,000 trials a pair every pair's position 1 detects a TV of 0.25 (measured 0.234: the 64-token pair's;
    the 8-token pairs' are smaller), at family alpha 1e-6, with power 0.99."""
    report = check_sampler(spec("bernoulli"), samples=2_000)
    stats = report.statistical
    assert stats.tv_detectable < 0.25 and f"detects TV >= {stats.tv_detectable:.3f}" in report.reason
    eight = [t.tv_detectable for t in stats.tests if t.position == 1 and "64 tokens" not in t.design]
    assert max(eight) < stats.tv_detectable
    assert {t.design for t in stats.tests if t.position == 1} == {d.name for d in designs(0)} and stats.alpha == 1e-6


def test_the_statistical_designs_are_seeded_and_cover_the_structures():
    first, again = designs(0), designs(0)
    assert all((a.p == b.p).all() and (a.q == b.q).all() for a, b in zip(first, again))
    assert not all((a.p == b.p).all() for a, b in zip(first, designs(1)))
    q_point = next(d for d in first if "argmax" in d.name)
    assert ((q_point.q == 0) | (q_point.q == 1)).all()
    assert {d.k for d in first} >= {1, 2, 3, 4} and max(d.vocab for d in first) == 64
    sparse = next(d for d in first if "sparse" in d.name)
    assert ((sparse.q > 0) & (sparse.p[:-1] == 0)).any()  # drafts of target probability 0


def test_run_puts_the_sampler_in_place_in_step_mode(tmp_path):
    """The step case verifies its rows through the sampler; the run's last row is the sampler's own check."""
    out = tmp_path / "run.json"
    assert main(["run", "--generator", "AssistedCandidateGenerator", "--warpers", "top_k=3", "--scenario", "iid8",
                 "--samples", "300", "--quiet", "--json", str(out), "--sampler", spec("bonus_from_q")]) == 1
    doc = json.loads(out.read_text())
    case, row = doc["cases"]
    assert doc["sampler"] == case["sampler"] == row["sampler"] == spec("bonus_from_q")
    assert case["verdict"] == "not_lossless" and case["mode"] == "step"
    assert (row["generator"], row["mode"], row["verdict"], row["subject"]) == (
        spec("bonus_from_q"), "verifier", "not_lossless", True)
    assert row["reason"].startswith("replaced the installed _speculative_sampling in every case of this run")


def test_lc_run_with_a_lossless_sampler():
    import lossless_check as lc

    run = lc.run("AssistedCandidateGenerator", warpers="top_k=3", scenario="iid8", samples=500,  # a pass with power
                 sampler=spec("loop"))
    case, row = run.cases
    assert (case.mode, case.sampler, case.verdict) == ("step", spec("loop"), "lossless")
    assert (row.generator, row.verdict, row.subject) == (spec("loop"), "lossless", True) and run.exit_code == 0
    assert case.alpha_case == 1e-6 / 2  # the sampler's row has a share of the family's alpha


def test_a_sampler_accepting_an_impossible_draft_fails_the_case_it_ran_in(monkeypatch):
    """With the installed verifier, an accepted draft of target probability 0 is set aside as the verifier's
    doing (tests/test_attribution.py); with a sampler of the user's in its place, the run checks that sampler
    end to end, so the same event is an exact failure of the case, blamed on the sampler."""
    from lossless_check.faces.api import cases_for, run_cases

    forced = force_r_0_at_impossible_drafts(monkeypatch, 3)
    cases = cases_for(["AssistedCandidateGenerator"], "top_k=3", None, "step", "markov8",
                      sampler=spec("fork_accepts_at_ratio"))
    case = run_cases(cases, 300, 1e-6, 0).cases[0]
    assert len(forced) == 3 and case.verdict == "not_lossless" and "support" in case.failed_checks
    assert {e["cause"] for e in case.exact_failures} == {"sampler"}
    assert case.exact_failures[0]["where"] == spec("fork_accepts_at_ratio") and case.verifier_set_aside == 3


@pytest.mark.heavy
def test_run_puts_the_sampler_in_place_in_the_real_generate_loop_and_in_workers(tmp_path):
    """Generate mode: ``_assisted_decoding`` calls the module global, replaced for the case (in the worker
    processes too); restored after."""
    from transformers.generation import utils

    installed = utils._speculative_sampling
    out = tmp_path / "run.json"
    args = ["run", "--generator", "AssistedCandidateGenerator", "--warpers", "top_k=3", "--scenario", "iid8",
            "--samples", "300", "--mode", "generate", "--quiet", "--json", str(out), "--workers", "2"]
    assert main(args + ["--sampler", spec("tf_residual_from_p")]) == 1
    case, row = json.loads(out.read_text())["cases"]
    assert case["mode"] == "generate" and case["verdict"] == "not_lossless" and row["verdict"] == "not_lossless"
    assert main(args + ["--sampler", spec("fork")]) == 0
    assert utils._speculative_sampling is installed


SAMPLER_TESTS = """
def test_lossless_sampler(lossless):
    report = lossless.assert_sampler_lossless("fixtures.user_samplers:loop", samples=100)
    assert report.exact.traced


def test_buggy_sampler(lossless):
    lossless.assert_sampler_lossless("fixtures.user_samplers:bonus_from_q", samples=100)
"""


def test_the_plugin_asserts_a_sampler_lossless(pytester, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    pytester.makepyfile(test_samplers=SAMPLER_TESTS)
    report = pytester.path / "report.json"
    result = pytester.runpytest("-p", "no:benchmark", "--lossless-report", str(report))
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*fixtures.user_samplers:bonus_from_q is not lossless (probs protocol): exact: *",
        ("*reproduce: lossless-check verifier --sampler fixtures.user_samplers:bonus_from_q --protocol probs "
         "--samples 100 --alpha * --seed 0"),
        "not_lossless fixtures.user_samplers:bonus_from_q sampler (probs protocol): exact check fails, *",
        "lossless     fixtures.user_samplers:loop sampler (probs protocol): exact check passes, n=100/pair  *",
    ])
    cases = json.loads(report.read_text())["cases"]
    assert [(c["mode"], c["verdict"]) for c in cases] == [("sampler", "not_lossless"), ("sampler", "lossless")]
