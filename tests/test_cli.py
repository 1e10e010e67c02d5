"""The CLI contract: exit codes, one-line errors, the JSON schema."""

import json

import pytest

from lossless_check.faces.cli import main
from lossless_check.modes.informativeness import pair_coverage
from lossless_check.laws.matrix import available_catalog, matrix
from lossless_check.laws.scenarios import DEFAULT
from fixtures.releases import DECAY_PENALTY_NAN_AFTER_MASKED_EOS, DFLASH, needs, within

MUTANT = "lossless_check.mutants.dflash_raw_logits:DFlashReturnsRawLogits"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--warpers", "top_k=banana"], "not a number"),
        (["run", "--generator", "NoSuchGenerator"], "unknown generator"),
        (["run", "--generator", "no_such_module:Thing"], "cannot import module"),
        (["run", "--generator", "lossless_check.mutants.assisted_greedy_draft:Nope"], "has no attribute"),
        (["run", "--alpha", "2"], "strictly between 0 and 1"),
        (["run", "--samples", "0"], "at least 1"),
        (["run", "--scenario", "nope"], "unknown scenario"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@needs(DFLASH)
def test_mutant_exits_1_and_lossless_exits_0_with_schema(tmp_path, capsys):
    out = tmp_path / "out.json"
    code = main(["run", "--generator", "DFlashTokenCandidateGenerator", "--generator", MUTANT, "--warpers", "top_k=3",
                 "--scenario", "iid8", "--samples", "5000", "--json", str(out), "--quiet", "--no-verifier"])
    assert code == 1
    doc = json.loads(out.read_text())
    for key in ("transformers_version", "torch_version", "alpha_family", "seed", "cases"):
        assert key in doc
    verdicts = {c["generator"]: c["verdict"] for c in doc["cases"]}
    assert verdicts == {"DFlashTokenCandidateGenerator": "lossless", "DFlashReturnsRawLogits": "not_lossless"}
    for case in doc["cases"]:
        for key in ("generator", "warpers", "mode", "verdict", "samples", "tv", "tv_detectable", "p_value",
                    "acceptance_rate", "expected_acceptance_rate", "reason", "tv_ci", "alpha_case", "failed_checks"):
            assert key in case
    table = capsys.readouterr().out
    assert "not_lossless" in table and "DFlashReturnsRawLogits" in table


@needs(DFLASH)
def test_named_generators_decide_the_exit_code_and_the_verifier_is_reported_beside(tmp_path, capsys):
    """The issue's command: the subjects are the two named generators, so the exit code is theirs (0 on
    5.24.0, where both are lossless and the verifier is not); the verifier's state is one printed line
    with its upstream status, and its JSON row says it is not a subject."""
    from fixtures.releases import VERIFIER_ACCEPTS_AT_R_0

    out = tmp_path / "out.json"
    code = main(["run", "--generator", "AssistedCandidateGenerator", "--generator", "DFlashTokenCandidateGenerator",
                 "--warpers", "top_k=3", "--json", str(out), "--quiet"])
    cases = json.loads(out.read_text())["cases"]
    subjects = [c for c in cases if c["subject"]]
    [verifier] = [c for c in cases if not c["subject"]]
    assert [c["generator"] for c in subjects] == ["AssistedCandidateGenerator", "DFlashTokenCandidateGenerator"]
    assert code == (0 if all(c["verdict"] == "lossless" for c in subjects) else 1)
    printed = capsys.readouterr().out
    assert f"installed verifier _speculative_sampling: {verifier['verdict']} " in printed
    if within(VERIFIER_ACCEPTS_AT_R_0):
        assert verifier["verdict"] == "not_lossless" and "fixed upstream in 5.25.0" in printed
    if code == 0:
        assert printed.splitlines()[-1] == f"{len(subjects)} lossless"  # the subjects' counts


@needs(DFLASH)
def test_every_written_path_gets_its_missing_parent_directories(tmp_path):
    """As pytest's --junitxml does: --json and the journal beside it, repro --out, and verifier --json."""
    report = tmp_path / "a" / "b" / "run.json"
    code = main(["run", "--generator", MUTANT, "--warpers", "top_k=3", "--scenario", "iid8",
                 "--json", str(report), "--quiet", "--no-verifier"])
    assert code == 1 and report.exists() and (report.parent / "run.json.journal.jsonl").exists()
    script = tmp_path / "c" / "d" / "repro.py"
    assert main(["repro", "--generator", DFLASH, "--warpers", "top_k=3", "--out", str(script)]) == 0
    assert script.exists()
    verifier = tmp_path / "e" / "f" / "verifier.json"
    main(["verifier", "--json", str(verifier)])
    assert json.loads(verifier.read_text())["checks"]


def test_list_shows_installed_generators(capsys):
    """Every generator class of the installed release, and the pair coverage of its catalog: all
    pairs, or the rest with the pairs plain sampling itself cannot run named."""
    from transformers.generation import candidate_generator

    assert main(["list"]) == 0
    raw = capsys.readouterr().out
    rows = {line.split()[1]: line for line in raw.splitlines() if line.startswith("│ ")}
    assert "step, provenance, generate" in rows["AssistedCandidateGenerator"]
    # A family the release lacks is listed as such (its cases are skipped, not passed).
    assert ("not installed: every case is skipped" in rows[DFLASH]) != hasattr(candidate_generator, DFLASH)
    out = " ".join(raw.split())
    options = [e.option for e in available_catalog()]
    coverage = pair_coverage(matrix("default"), options, DEFAULT)  # its counts: tests/test_matrix.py
    assert (coverage.covered < coverage.total) == within(DECAY_PENALTY_NAN_AFTER_MASKED_EOS)
    assert f"{coverage.covered}/{coverage.total} pairs of catalog options covered by an informative stack" in out
    untestable = ", ".join(f"{a} + {b}" for a, b in coverage.unsampleable)
    assert (f"(plain sampling fails under every stack holding them): {untestable}" in out) == bool(untestable)


@needs(DFLASH)
def test_detect_tv_sizes_the_run(tmp_path):
    out = tmp_path / "out.json"
    code = main(["run", "--generator", "DFlashTokenCandidateGenerator", "--warpers", "top_k=3", "--scenario", "iid8",
                 "--detect-tv", "0.4", "--json", str(out), "--quiet", "--no-verifier"])
    assert code == 0
    case = json.loads(out.read_text())["cases"][0]
    assert case["tv_detectable"] <= 0.4 and case["samples"] < 1000


def test_a_generator_error_exits_1_and_a_harness_bug_exits_3(tmp_path, monkeypatch, capsys):
    """A generator that raises is a finding about the generator (exit 1, verdict error, the run goes on);
    exit 3 is for the harness's own bugs, with the traceback."""
    (tmp_path / "raising_factory.py").write_text(
        "def make(ctx):\n    raise ValueError('the user factory is broken')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "out.json"
    code = main(["run", "--generator", "raising_factory:make", "--warpers", "none", "--samples", "200",
                 "--json", str(out), "--quiet", "--no-verifier"])
    assert code == 1
    case = json.loads(out.read_text())["cases"][0]
    assert case["verdict"] == "error" and "the user factory is broken" in case["reason"]

    import lossless_check.faces.api as api

    def harness_bug(*args, **kwargs):
        raise RuntimeError("a bug in lossless-check itself")

    monkeypatch.setattr(api, "run_cases", harness_bug)
    assert main(["run", "--generator", "DFlashTokenCandidateGenerator", "--warpers", "none", "--quiet"]) == 3
    assert "internal error: RuntimeError: a bug in lossless-check itself" in capsys.readouterr().err


def test_bad_usage_is_reported_before_torch_is_imported():
    """Unknown generators, malformed warpers and scenarios fail before the heavy imports (under a second)."""
    import subprocess
    import sys

    for argv in (["--generator", "NoSuchGenerator"], ["--warpers", "top_k=banana"], ["--warpers", "top_p=2"],
                 ["--scenario", "nope"]):
        code = ("import sys; from lossless_check.faces.cli import main; rc = main(['run', *sys.argv[1:]]); "
                "assert 'torch' not in sys.modules and 'transformers' not in sys.modules; sys.exit(rc)")
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


@needs(DFLASH)
def test_gate_prints_the_verdict_table_and_where_the_reports_are(tmp_path, capsys):
    out = tmp_path / "gate"
    code = main(["gate", "--generator", "DFlashTokenCandidateGenerator", "--matrix", "smoke", "--samples", "600",
                 "--scenario", "iid8", "--out", str(out) + "/", "--quiet", "--no-verifier"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "verdict" in printed and "DFlashTokenCandidateGenerator" in printed and "8 lossless" in printed  # step, generate, greedy, options
    assert f"{out}/report.json" in printed and "//" not in printed.replace("://", "")
    assert (out / "report.md").exists()


def test_progress_lines_when_stderr_is_not_a_terminal(monkeypatch, capsys):
    import lossless_check.running.progress as progress

    monkeypatch.setattr(progress, "LINE_INTERVAL", 0.0)
    with progress.progress_reporter(3) as advance:
        for _ in range(3):
            advance(1000)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("lossless-check: 3/3 cases done, 3000 trials") and len(lines) == 3
    assert "ETA" in lines[0]
