"""``lossless-check verifier``: exact checks of the installed ``_speculative_sampling``.

From 4.37.0 to 5.24.0 the verifier accepts a draft when ``r <= p/q`` (5.24.0 ``utils.py`` 4479), so a
draft with target probability 0 is accepted when ``torch.rand`` returns exactly 0 (probability 2^-24):
the command exits 1 and names that line. With ``findings/verifier_accepts_zero_probability/fix.patch``
(``<`` for ``<=``) applied to a copy of the installed package it exits 0: the checks can pass. 5.25.0
compares with ``<``: there the command exits 0 unpatched (``fixtures/releases.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fixtures.patched_install import patched_transformers
from fixtures.releases import ASSISTED_DRAFTS_GREEDILY, VERIFIER_ACCEPTS_AT_R_0, verifier_rule_line, within
from lossless_check.faces.cli import main
from lossless_check.subjects.verifier import RATE, call_verifier, P, Q, BONUS, verify

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "findings" / "verifier_accepts_zero_probability" / "fix.patch"
ACCEPTS_AT_R_0 = within(VERIFIER_ACCEPTS_AT_R_0)


def test_installed_verifier_accepts_a_zero_probability_draft_at_r_0_on_the_releases_that_do(tmp_path, capsys):
    out = tmp_path / "verifier.json"
    assert main(["verifier", "--json", str(out)]) == (1 if ACCEPTS_AT_R_0 else 0)
    doc = json.loads(out.read_text())
    passed = {c["name"]: c["passed"] for c in doc["checks"]}
    # What every release does right: below the ratio it accepts, above it rejects, residual and bonus laws exact.
    assert passed["r above p/q rejects"] and passed["r just below p/q accepts; bonus from p_{gamma+1}"]
    assert all(p["passed"] for p in doc["premises"])
    printed = capsys.readouterr().out
    if not ACCEPTS_AT_R_0:
        assert doc["defects"] == [] and doc["verdict"] == "lossless" and all(passed.values())
        return
    [defect] = doc["defects"]
    assert defect["source"] == "is_accepted = r_i <= probability_ratio"
    assert defect["file"].endswith("transformers/generation/utils.py") and defect["line"] == verifier_rule_line()
    assert "p = 0 draft, r = 0 rejects (position 1)" in defect["checks"]
    assert any("5.96e-08" in rate for rate in defect["rates"])
    assert "FAIL" in printed and "r_i <= probability_ratio" in printed


def test_real_randomness_reaches_the_defect():
    """The seed the verifier's premise names makes the real verifier emit a token of target probability 0
    where it accepts at r = 0, and a token of the target's support where it does not."""
    torch.manual_seed(3)
    torch.rand(1_532_311)  # the next float32 draw is exactly 0
    p_rows, q_rows = [P, P, BONUS], [Q, Q]
    with torch.no_grad():
        from lossless_check.core.compat import speculative_sampling
        from lossless_check.subjects.verifier import _logits

        tokens, n = speculative_sampling()(torch.tensor([[7, 7, 4, 0]]), _logits(q_rows, torch.float32), 2,
                                           _logits(p_rows, torch.float32))
    assert P[4] == 0 and RATE == 2.0**-24
    assert (tokens[0, 0].item() == 4) == ACCEPTS_AT_R_0 and P[tokens[0, -1].item()] > 0


def test_controlled_randomness_is_restored():
    original = torch.rand_like, torch.rand, torch.multinomial
    call_verifier([P, P, BONUS], [Q, Q], [0, 0], [0.0, 0.0])
    assert (torch.rand_like, torch.rand, torch.multinomial) == original


def test_a_check_fails_on_a_verifier_that_ignores_q(monkeypatch):
    """Negative control: a verifier handed a uniform q in place of the real one accepts what it must reject."""
    import transformers.generation.utils as utils

    real = utils._speculative_sampling

    def from_p(candidate_ids, candidate_logits, length, new_logits, **kwargs):
        return real(candidate_ids, torch.zeros_like(candidate_logits), length, new_logits, **kwargs)

    from lossless_check.core import compat

    def forget_the_installed_one():  # both caches: the function compat calls, and the call wrapped around it
        compat.installed_verifier.cache_clear()
        compat.speculative_sampling.cache_clear()

    forget_the_installed_one()
    monkeypatch.setattr(utils, "_speculative_sampling", from_p)
    try:
        failing = {c.name for c in verify().checks if not c.passed}
    finally:
        monkeypatch.undo()
        forget_the_installed_one()
    assert "r above p/q rejects" in failing


@pytest.mark.slow
@pytest.mark.skipif(not ACCEPTS_AT_R_0, reason="the installed verifier is strict already: nothing to patch")
def test_strict_patched_release_passes_every_check(tmp_path):
    site = patched_transformers(FIX, tmp_path)
    assert "r_i < probability_ratio" in (site / "transformers/generation/utils.py").read_text()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    out = tmp_path / "verifier.json"
    done = subprocess.run([sys.executable, "-m", "lossless_check.faces.cli", "verifier", "--json", str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc["source"].startswith(str(site)) and doc["defects"] == [] and doc["verdict"] == "lossless"
    # The same checks the unpatched release gets (their number depends on the release's verifier), all passed.
    assert [c["name"] for c in doc["checks"]] == [c.name for c in verify().checks]
    assert all(c["passed"] for c in doc["checks"])


def test_a_run_adds_the_verifier_as_an_exact_row_beside_named_generators(tmp_path, capsys):
    """Once per run, outside Holm (no p-value, no share of alpha). With named generators it is reported
    beside them (``"subject": false``, one line with its upstream status) and the exit code is theirs;
    ``--verifier-gates`` makes it a subject, and then where the verifier accepts at r = 0 it makes the
    run exit 1. The generator is the built-in Assisted through a factory of this project, present on
    every release (not lossless where it drafts greedily)."""
    out = tmp_path / "run.json"
    args = ["run", "--generator", "fixtures.factories:assisted", "--warpers", "top_k=3", "--scenario", "iid8",
            "--samples", "600", "--json", str(out), "--quiet"]  # 600: a pass with power 0.99 at TV 0.3
    code = main(args)
    greedy = within(ASSISTED_DRAFTS_GREEDILY)
    assert code == (1 if greedy else 0)
    case, verifier = json.loads(out.read_text())["cases"]
    assert (verifier["generator"], verifier["mode"], verifier["verdict"], verifier["subject"]) == (
        "_speculative_sampling", "verifier", "not_lossless" if ACCEPTS_AT_R_0 else "lossless", False)
    assert verifier["p_value"] is None and verifier["alpha_case"] is None
    if ACCEPTS_AT_R_0:
        assert f"utils.py:{verifier_rule_line()} `is_accepted = r_i <= probability_ratio`" in verifier["reason"]
        assert "5.96e-08" in verifier["reason"] and "fixed upstream in 5.25.0" in verifier["reason"]
    assert case["verdict"] == ("not_lossless" if greedy else "lossless") and case["alpha_case"] == 1e-6
    assert case["subject"] is True
    printed = capsys.readouterr().out
    [line] = [row for row in printed.splitlines() if "_speculative_sampling" in row]  # one line, not a table row
    assert line.startswith("installed verifier _speculative_sampling: ") and "not deciding the exit code" in line
    assert main(args + ["--verifier-gates"]) == (1 if ACCEPTS_AT_R_0 or greedy else 0)
    assert json.loads(out.read_text())["cases"][1]["subject"] is True


def test_a_run_over_the_whole_install_has_the_verifier_as_a_subject(tmp_path, monkeypatch):
    """No --generator: the run is about the install, so the verifier's defect fails it. The built-ins
    are narrowed to Assisted here (the decision rests on --generator being absent, not on the list)."""
    import lossless_check.subjects.adapters

    monkeypatch.setattr(lossless_check.subjects.adapters, "DEFAULT_GENERATORS", ("AssistedCandidateGenerator",))
    out = tmp_path / "run.json"
    code = main(["run", "--warpers", "top_k=3", "--scenario", "iid8", "--samples", "300", "--json", str(out),
                 "--quiet"])
    # The whole-install run also has greedy mode's exact row per generator (iid8 named: no tiny-Llama one).
    rows = json.loads(out.read_text())["cases"]
    assert sorted(c["mode"] for c in rows) == ["greedy", "step", "verifier"]
    by_mode = {c["mode"]: c for c in rows}
    case, verifier = by_mode["step"], by_mode["verifier"]
    assert case["generator"] == by_mode["greedy"]["generator"] == "AssistedCandidateGenerator"
    assert verifier["subject"] is True
    greedy = within(ASSISTED_DRAFTS_GREEDILY)
    # Without either defect 300 trials are too few for a pass: inconclusive, exit 5 (no answer).
    assert code == (1 if ACCEPTS_AT_R_0 or greedy else 5)


def test_verifier_gates_and_no_verifier_contradict(capsys):
    assert main(["run", "--generator", "AssistedCandidateGenerator", "--verifier-gates", "--no-verifier"]) == 2
    assert "contradict" in capsys.readouterr().err


def test_lc_run_has_the_row_and_can_leave_it_out_and_check_never_runs_it():
    import lossless_check as lc

    kwargs = dict(warpers="top_k=3", scenario="iid8", samples=100)
    run = lc.run("fixtures.factories:assisted", **kwargs)
    assert [c.mode for c in run.cases] == ["step", "verifier"] and [c.subject for c in run.cases] == [True, False]
    # The exit code is the generator's, not the verifier's: 100 trials are too few for a pass (inconclusive, exit 5).
    assert run.exit_code == (1 if within(ASSISTED_DRAFTS_GREEDILY) else 5)
    gated = lc.run("fixtures.factories:assisted", verifier_gates=True, **kwargs)
    assert gated.cases[1].subject and gated.exit_code == (1 if ACCEPTS_AT_R_0 else run.exit_code)
    assert [c.mode for c in lc.run("fixtures.factories:assisted", verifier=False, **kwargs).cases] == ["step"]
    assert lc.check("fixtures.factories:assisted", **kwargs).mode == "step"
