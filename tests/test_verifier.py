"""``lossless-check verifier``: exact checks of the installed ``_speculative_sampling``.

On transformers 5.24.0 the verifier accepts a draft when ``r <= p/q`` (``utils.py`` 4479), so a draft
with target probability 0 is accepted when ``torch.rand`` returns exactly 0 (probability 2^-24):
the command exits 1 and names that line. With ``findings/verifier_accepts_zero_probability/fix.patch``
(``<`` for ``<=``) applied to a copy of the installed package it exits 0: the checks can pass.
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
from lossless_check.cli import main
from lossless_check.verifier import RATE, call_verifier, P, Q, BONUS, verify

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "findings" / "verifier_accepts_zero_probability" / "fix.patch"


def test_installed_verifier_accepts_a_zero_probability_draft_at_r_0(tmp_path, capsys):
    out = tmp_path / "verifier.json"
    assert main(["verifier", "--json", str(out)]) == 1
    doc = json.loads(out.read_text())
    [defect] = doc["defects"]
    assert defect["source"] == "is_accepted = r_i <= probability_ratio"
    assert defect["file"].endswith("transformers/generation/utils.py") and defect["line"] == 4479
    assert "p = 0 draft, r = 0 rejects (position 1)" in defect["checks"]
    assert any("5.96e-08" in rate for rate in defect["rates"])
    passed = {c["name"]: c["passed"] for c in doc["checks"]}
    # What 5.24 does right: below the ratio it accepts, above it rejects, residual and bonus laws exact.
    assert passed["r above p/q rejects"] and passed["r just below p/q accepts; bonus from p_{gamma+1}"]
    assert all(p["passed"] for p in doc["premises"])
    printed = capsys.readouterr().out
    assert "FAIL" in printed and "r_i <= probability_ratio" in printed


def test_real_randomness_reaches_the_defect():
    """The seed the verifier's premise names makes the real verifier emit a token of target probability 0."""
    torch.manual_seed(3)
    torch.rand(1_532_311)  # the next float32 draw is exactly 0
    p_rows, q_rows = [P, P, BONUS], [Q, Q]
    with torch.no_grad():
        from lossless_check.compat import speculative_sampling
        from lossless_check.verifier import _logits

        tokens, n = speculative_sampling()(torch.tensor([[7, 7, 4, 0]]), _logits(q_rows, torch.float32), 2,
                                           _logits(p_rows, torch.float32))
    assert tokens[0, 0].item() == 4 and P[4] == 0 and RATE == 2.0**-24


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

    from lossless_check import compat

    compat.speculative_sampling.cache_clear()
    monkeypatch.setattr(utils, "_speculative_sampling", from_p)
    try:
        failing = {c.name for c in verify().checks if not c.passed}
    finally:
        compat.speculative_sampling.cache_clear()
    assert "r above p/q rejects" in failing


@pytest.mark.slow
def test_strict_patched_release_passes_every_check(tmp_path):
    site = patched_transformers(FIX, tmp_path)
    assert "r_i < probability_ratio" in (site / "transformers/generation/utils.py").read_text()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    out = tmp_path / "verifier.json"
    done = subprocess.run([sys.executable, "-m", "lossless_check.cli", "verifier", "--json", str(out)],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc["source"].startswith(str(site)) and doc["defects"] == [] and doc["verdict"] == "lossless"
    assert len(doc["checks"]) >= 16 and all(c["passed"] for c in doc["checks"])


def test_a_run_adds_the_verifier_as_an_exact_row(tmp_path, capsys):
    """Once per run, outside Holm (no p-value, no share of alpha); on 5.24 it is what makes the run exit 1."""
    out = tmp_path / "run.json"
    code = main(["run", "--generator", "DFlashTokenCandidateGenerator", "--warpers", "top_k=3", "--scenario", "iid8",
                 "--samples", "300", "--json", str(out), "--quiet"])
    assert code == 1
    case, verifier = json.loads(out.read_text())["cases"]
    assert (verifier["generator"], verifier["mode"], verifier["verdict"]) == ("_speculative_sampling", "verifier",
                                                                                "not_lossless")
    assert verifier["p_value"] is None and verifier["alpha_case"] is None
    assert "utils.py:4479 `is_accepted = r_i <= probability_ratio`" in verifier["reason"]
    assert "5.96e-08" in verifier["reason"]
    assert case["verdict"] == "lossless" and case["alpha_case"] == 1e-6
    printed = capsys.readouterr().out
    assert "_speculative_sampling" in printed and "verifier" in printed


def test_lc_run_has_the_row_and_can_leave_it_out_and_check_never_runs_it():
    import lossless_check as lc

    kwargs = dict(warpers="top_k=3", scenario="iid8", samples=100)
    assert [c.mode for c in lc.run("DFlashTokenCandidateGenerator", **kwargs).cases] == ["step", "verifier"]
    assert [c.mode for c in lc.run("DFlashTokenCandidateGenerator", verifier=False, **kwargs).cases] == ["step"]
    assert lc.check("DFlashTokenCandidateGenerator", **kwargs).mode == "step"
