"""The gate's reports: JSON, Markdown for a PR comment, self-contained HTML with figures."""

import base64
import json
import re

import pytest

from lossless_check.faces.gate import gate, to_html, to_markdown, write_reports
from lossless_check.laws.scenarios import TARGET_KIND_NAMES
from lossless_check.outputs.report import to_json
from lossless_check.evidence.results import CaseResult, RunResult
from fixtures.releases import DFLASH, STATIC_CACHE_OVERFLOWS, STATIC_INDEXER_POSITIONS_KEPT, needs, within

pytest.importorskip("matplotlib")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _result() -> RunResult:
    good = CaseResult("Gen", "none", "all", "markov8", verdict="lossless", samples=100, tv=0.01, tv_detectable=0.1,
                      p_value_adjusted=1.0, acceptance_rate=0.5, expected_acceptance_rate=0.5,
                      reason="TV 0.0100")
    bad = CaseResult("Gen", "top_k=3", "all", "markov8", verdict="not_lossless", samples=100, tv=0.2,
                     tv_detectable=0.1, p_value_adjusted=1e-9, acceptance_rate=0.7, expected_acceptance_rate=0.5,
                     acceptance_law=[0.1, 0.2, 0.3, 0.4], expected_acceptance_law=[0.25, 0.25, 0.25, 0.25],
                     empirical_law=[0.5, 0.5, 0, 0], expected_law=[0.25, 0.25, 0.25, 0.25],
                     failed_checks=["output_law@1"], reason="output law at position 1: TV 0.2 > threshold 0.1",
                     provenance={"verdict": "inconsistent", "reason": "returned raw logits",
                                 "positions": [{"position": 1, "rule": "sampled", "max_abs_diff": 0.3, "tv": 0.2,
                                                "foreign_mass": 0.1, "inflation": 1.25, "consistent": False}]})
    error = CaseResult("Gen", "top_p=0.7|x", "all", "markov8", verdict="error", reason="get_candidates raised")
    return RunResult([good, bad, error], 1e-6, 0, 100)


def test_reports_show_grid_figures_and_provenance(tmp_path):
    paths = write_reports(_result(), tmp_path, title="mymod:Gen")
    assert [p.name for p in paths] == ["report.json", "report.md", "report.html"]
    assert [c["verdict"] for c in json.loads(paths[0].read_text())["cases"]] == ["lossless", "not_lossless", "error"]

    page = paths[2].read_text()
    grid = page[page.index('<table class="grid">'):page.index("</table>")]
    assert grid.count('class="v-lossless"') == 1 and grid.count('class="v-not_lossless"') == 1
    assert '<a href="#case-0">not_lossless</a>' in grid and '<a href="#case-1">error</a>' in grid
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 2  # position-1 law and acceptance law of the failing case; none for the error
    assert all(base64.b64decode(i).startswith(PNG_SIGNATURE) for i in images)
    assert "Output law at position 1" in page and "Accepted drafts per round" in page
    assert "provenance: <b>inconsistent</b>" in page and "<td>1.25</td>" in page
    assert "http" not in page.replace("http-equiv", "")  # self-contained

    markdown = paths[1].read_text()
    assert markdown.startswith("### ❌ lossless-check gate: `mymod:Gen` — not lossless: 2 of 3 cases fail")
    assert "- ❌ **Gen** `top_k=3` (all): output law at position 1" in markdown
    assert "| Gen | top_p=0.7\\|x | all | ⚠️ error |" in markdown


def test_all_lossless_headline():
    result = _result()
    result.cases = result.cases[:1]
    doc = {"transformers_version": "5", "torch_version": "2"}
    assert "✅ lossless-check gate: `g` — lossless: all 1 checked cases pass" in to_markdown(result, doc, "g")
    assert "Failing cases" not in to_html(result, doc, "g")


# heavy (.ci/run's first step): 48 s alone (a smoke gate with the eight stateful kinds' generate and greedy rows).
@needs(DFLASH)
@pytest.mark.heavy
def test_gate_runs_a_matrix_and_writes_reports(tmp_path):
    # 600 trials: each step case detects TV 0.3 with power 0.99, so DFlash (lossless) passes with evidence.
    code = gate("DFlashTokenCandidateGenerator", tmp_path, matrix_name="smoke", samples=600)
    doc = json.loads((tmp_path / "report.json").read_text())
    # mode "all": step statistics with the provenance sub-verdict beside them; then the real generate() loop;
    # then greedy mode's exact row for the generator (DFlash: none on the tiny Llamas); the options row (exact:
    # what generate() returns beside the tokens); the verifier's row last.
    step = [c for c in doc["cases"] if c["mode"] == "step"]
    assert len(step) == 3 and all(c["provenance"] for c in step)
    # The stateful targets (markov8-linear ...) run in generate and greedy mode after each mode's own rows.
    stateful = {f"markov8-{kind}" for kind in TARGET_KIND_NAMES}
    modes = [c["mode"] for c in doc["cases"]]
    assert [m for m, c in zip(modes, doc["cases"]) if c["scenario"] not in stateful] == (
        ["step"] * 3 + ["generate"] * 3 + ["greedy", "options", "verifier"])
    assert {c["scenario"] for c in doc["cases"] if c["mode"] in ("generate", "greedy")} >= stateful
    # The exit code is the generator's: the verifier's row is reported beside its cases, not as one of them.
    assert [c["subject"] for c in doc["cases"]] == [m != "verifier" for m in modes]
    assert [c["verdict"] for c in doc["cases"] if c["subject"] and c["scenario"] not in stateful] == ["lossless"] * 8
    # A stateful row is checked, or not applicable where the release refuses the kind: never a pass by default.
    # On a static cache DFlash drafts past its end where the release lets it run there (a finding: the call raises).
    # On the static indexed cache the rejected drafts' positions stay too (findings/static_indexer_positions_not_cropped):
    # a row meets whichever comes first.
    overflows = within(STATIC_CACHE_OVERFLOWS)
    positions_kept = within(STATIC_INDEXER_POSITIONS_KEPT)
    for c in doc["cases"]:
        if c["scenario"] == "markov8-static-indexed" and positions_kept:
            assert c["verdict"] == "not_lossless" or (c["verdict"] == "error" and "index_copy_" in c["reason"]), c
        elif c["scenario"] in ("markov8-static", "markov8-static-indexed") and overflows:
            assert c["verdict"] == "error" and "index_copy_" in c["reason"], c["reason"]
        elif c["scenario"] in stateful:
            assert c["verdict"] == "lossless" or (c["verdict"] == "skipped" and c["reason"].startswith(
                "not applicable")), c["reason"]
    assert code == (1 if overflows else 0)
    assert (tmp_path / "report.html").read_text().startswith("<!doctype html>")


def test_the_verifier_beside_a_gate_is_reported_and_does_not_fail_it():
    from lossless_check.outputs.verifier_report import VERIFIER_MODE, VERIFIER_NAME

    result = _result()
    verifier = CaseResult(VERIFIER_NAME, "-", VERIFIER_MODE, "markov8", verdict="not_lossless", subject=False,
                          reason="utils.py:4479 `is_accepted = r_i <= probability_ratio`: ...; fixed upstream in 5.25.0")
    result.cases = [result.cases[0], verifier]
    doc = {"transformers_version": "5", "torch_version": "2"}
    assert result.exit_code == 0 and result.counts()["not_lossless"] == 0
    markdown = to_markdown(result, doc, "g")
    assert "✅ lossless-check gate: `g` — lossless: all 1 checked cases pass" in markdown
    assert "- installed verifier _speculative_sampling: not_lossless (not a subject here" in markdown
    assert "fixed upstream in 5.25.0" in markdown and "| _speculative_sampling |" not in markdown
    page = to_html(result, doc, "g")
    assert "installed verifier _speculative_sampling: not_lossless" in page and "Failing cases" not in page
    verifier.subject = True  # --verifier-gates
    assert result.exit_code == 1 and "not lossless: 1 of 2 cases fail" in to_markdown(result, doc, "g")


def test_markdown_names_the_failing_position_and_provenance_and_the_html_plots_that_position():
    failing = CaseResult("Gen", "top_k=3", "all", "iid8", verdict="not_lossless", samples=1000, tv=0.01,
                         failed_checks=["output_law@2"], reason="output law at position 2: TV 0.2 > threshold 0.1",
                         empirical_law=[0.5, 0.5], expected_law=[0.7, 0.3], law_position=2,
                         positions=[{"position": 1, "tv": 0.01, "samples": 1000},
                                    {"position": 2, "tv": 0.2, "samples": 600}],
                         provenance={"verdict": "inconsistent", "reason": "q differs", "positions": []})
    result = RunResult([failing], 1e-6, 0, 1000)
    doc = to_json(result)
    markdown = to_markdown(result, doc, "mymod:Gen")
    assert "(failing position 2; provenance: inconsistent)" in markdown
    page = to_html(result, doc, "mymod:Gen")
    assert "Output law at position 2" in page and "Output law at position 1" not in page


def test_real_world_cases_get_their_own_row_in_the_reports(tmp_path):
    """A case on another scenario with the same generator, stack and mode must not hide the main one."""
    result = _result()
    result.cases.append(CaseResult("Gen", "none", "all", "iid32-fast-tokenizers", verdict="not_lossless",
                                   samples=50, reason="output law at position 1"))
    markdown = to_markdown(result, {"transformers_version": "x", "torch_version": "y"}, "Gen")
    assert "(all, iid32-fast-tokenizers)" in markdown
    page = to_html(result, {"transformers_version": "x", "torch_version": "y"}, "Gen")
    grid = page[page.index('<table class="grid">'):page.index("</table>")]
    assert "Gen (all, iid32-fast-tokenizers)" in grid and grid.count('class="v-lossless"') == 1


def test_vacuous_cases_are_coloured_counted_and_never_passes():
    result = _result()
    vacuous = CaseResult("Gen", "top_k=1", "all", "markov8", verdict="vacuous", samples=100,
                         reason="the processed target is a point mass at every reachable prefix of positions 1-4")
    result.cases = [result.cases[0], vacuous]
    doc = {"transformers_version": "5", "torch_version": "2"}
    markdown = to_markdown(result, doc, "g")
    assert "lossless: all 1 checked cases pass (1 vacuous: not passes)" in markdown
    assert "| Gen | top_k=1 | all | ⭕ vacuous |" in markdown
    page = to_html(result, doc, "g")
    assert page.count('class="v-vacuous"') == 2 and ".v-vacuous {" in page and result.exit_code == 0


@needs(DFLASH)
def test_without_matplotlib_the_gate_writes_its_reports_and_says_plots_need_it(tmp_path):
    """matplotlib is a dependency; where it cannot be imported all the same, a failing gate still exits 1
    with its three reports, and one line says the plots were left out (never exit 3, never no report)."""
    import html
    import os
    import subprocess
    import sys
    from pathlib import Path

    from lossless_check.faces.gate import NO_PLOTS

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "gate"
    script = ("import sys; sys.modules['matplotlib'] = None  # import matplotlib raises ImportError\n"
              "from lossless_check.faces.cli import main\n"
              "sys.exit(main(['gate', '--generator', "
              "'lossless_check.mutants.dflash_raw_logits:DFlashReturnsRawLogits', "
              f"'--matrix', 'smoke', '--scenario', 'iid8', '--samples', '2000', '--generate-samples', '100', "
              f"'--out', {str(out)!r}, '--quiet']))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    assert done.stderr.count(NO_PLOTS) == 1 and "Traceback" not in done.stderr
    assert all((out / name).exists() for name in ("report.json", "report.md", "report.html"))
    page = (out / "report.html").read_text()
    assert "data:image/png" not in page and html.escape(NO_PLOTS) in page and "Failing cases" in page
