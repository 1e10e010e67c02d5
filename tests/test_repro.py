"""``lossless-check repro``: generated scripts run in a clean environment and give the harness's verdict.

Each script runs in a fresh virtual environment where ``lossless_check`` cannot be imported
(``clean_python``), from a directory outside the repository. A script exits 1 with probability at
most its alpha (1e-6) for a lossless generator, at any sample size (an e-value); the bug runs
below stop at their first rejection (Universal: about 200 calls at first-token TV 0.25).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import transformers
from packaging.version import Version

from fixtures.releases import (ASSISTED_DRAFTS_GREEDILY, ASSISTED_REFUSES_MIN_LENGTH, PROMPT_LOOKUP_CRASHES_WITHOUT_EOS,
                               PROMPT_LOOKUP_OVERSHOOTS, needs, within)
from lossless_check.faces.api import cases_for
from lossless_check.faces.cli import main
from lossless_check.subjects.adapters import ADAPTERS
from lossless_check.outputs.repro import LEGACY_RELEASE, SUPPORTED, UNSUPPORTED_FAMILIES, script_for, write_repro
from lossless_check.laws.stubs import LEGACY_GENERATION
from test_findings import ALLOWED_IMPORTS, FINDINGS, imported_modules

UNIVERSAL = "UniversalSpeculativeDecodingGenerator"
DFLASH = "DFlashTokenCandidateGenerator"
RELEASE = Version(transformers.__version__)
#: Every test here writes or runs a script; before 4.45 the command refuses (tests/test_cli.py checks how).
pytestmark = pytest.mark.skipif(LEGACY_GENERATION, reason=LEGACY_RELEASE)


def run_script(python, script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([str(python), str(script), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def check_exit(proc: subprocess.CompletedProcess, expected: int) -> None:
    assert proc.returncode == expected, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    assert "verdict:" in proc.stdout


def repro(tmp_path, generator, warpers="none", scenario="markov8", max_new_tokens=4, samples=None) -> Path:
    [case] = cases_for(generator, warpers, None, "generate", scenario, max_new_tokens)
    return write_repro(case, tmp_path / "repro.py", samples=samples)


@needs(UNIVERSAL)
@pytest.mark.parametrize("args, expected", [((), 1), (("--tokenizers", "id-ordered"), 0), (("--plain",), 0)])
def test_universal_with_fast_tokenizers_reproduces_and_its_controls_do_not(clean_python, tmp_path, args, expected):
    """The bug run (5.24.0: stops near 200 calls) and two controls at 600 calls: the same tokenizers
    with get_vocab() in id order, and plain sampling without a drafter."""
    script = repro(tmp_path, UNIVERSAL, scenario="iid32-fast-tokenizers", samples=3000 if expected else 600)
    check_exit(run_script(clean_python, script, *args, cwd=tmp_path), expected)


#: Where a release's own defect or refusal decides a control's outcome: generator -> [(span, verdict line)],
#: the first span holding the installed release wins (exit 1 in each); elsewhere the control exits 0.
RELEASE_OUTCOMES = {
    "AssistedCandidateGenerator": [
        (ASSISTED_REFUSES_MIN_LENGTH, "verdict: ERROR: generate() raised ValueError: Passing `MinLengthLogitsProcessor`"),
        (ASSISTED_DRAFTS_GREEDILY, "verdict: NOT LOSSLESS")],
    "PromptLookupCandidateGenerator": [
        (PROMPT_LOOKUP_CRASHES_WITHOUT_EOS, "verdict: ERROR: generate() raised TypeError: isin()"),
        (PROMPT_LOOKUP_OVERSHOOTS, "verdict: NOT LOSSLESS")],
}


@pytest.mark.parametrize("generator, warpers", [
    ("AssistedCandidateGenerator", "top_k=3,min_new_tokens=2,eos_token_id=5"),
    ("PromptLookupCandidateGenerator", "repetition_penalty=2.0"),
    pytest.param("AssistedCandidateGeneratorDifferentTokenizers", "none",
                 marks=needs("AssistedCandidateGeneratorDifferentTokenizers")),
    pytest.param(DFLASH, "top_k=3", marks=pytest.mark.skipif(
        RELEASE < Version("5.15.1"), reason="DFlash is absent before 5.15.0, and 5.15.0's is not lossless under top_k")),
])
def test_lossless_generators_exit_0(clean_python, tmp_path, generator, warpers):
    """Negative controls of the script's own checks: history-dependent and EOS warpers (the reference
    forced along each prefix must keep min_new_tokens and the penalty), prompt lookup, greedy, a block
    drafter (DFlash). On a release whose generate() refuses the configuration or crashes, the script
    says ERROR (no verdict on the law), never that a bug of the law reproduces."""
    proc = run_script(clean_python, repro(tmp_path, generator, warpers, samples=300), cwd=tmp_path)
    outcome = next((line for span, line in RELEASE_OUTCOMES.get(generator, []) if within(span)), None)
    check_exit(proc, 0 if outcome is None else 1)
    assert outcome is None or outcome in proc.stdout, proc.stdout


@needs(UNIVERSAL)
def test_script_imports_only_torch_and_transformers(tmp_path):
    imported = imported_modules(repro(tmp_path, UNIVERSAL).read_text())
    assert imported <= ALLOWED_IMPORTS, imported - ALLOWED_IMPORTS


@needs(UNIVERSAL)
def test_repro_command_writes_a_script_and_refuses_what_it_cannot_build(tmp_path, capsys):
    out = tmp_path / "u.py"
    assert main(["repro", "--generator", UNIVERSAL, "--scenario", "iid32-fast-tokenizers", "--out", str(out)]) == 0
    assert out.read_text() == script_for(cases_for(UNIVERSAL, "none", None, "generate", "iid32-fast-tokenizers")[0])
    assert main(["repro", "--generator", "MTPCandidateGenerator", "--out", str(tmp_path / "m.py")]) == 2
    err = capsys.readouterr().err
    assert "no standalone builder for MTPCandidateGenerator" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "m.py").exists()
    assert main(["repro", "--generator", UNIVERSAL, "--scenario", "bpe-fast-tokenizers", "--out", str(out)]) == 2
    assert "builds word-level tokenizers" in capsys.readouterr().err


@pytest.mark.parametrize("family", sorted(UNSUPPORTED_FAMILIES))
def test_repro_names_why_it_cannot_build_a_family(tmp_path, capsys, family):
    """Each built-in family the script cannot build gets its own reason, on one line, exit 2."""
    if family not in ADAPTERS or ADAPTERS[family].installed_class() is None:
        pytest.skip(f"{family} is not in the installed transformers")
    assert main(["repro", "--generator", family, "--out", str(tmp_path / "x.py")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and UNSUPPORTED_FAMILIES[family] in err, err


def test_every_builtin_family_is_built_or_has_a_reason():
    assert set(ADAPTERS) == set(SUPPORTED) | set(UNSUPPORTED_FAMILIES)


@needs(UNIVERSAL)
def test_run_writes_a_script_for_each_failing_case(tmp_path, capsys):
    code = main(["run", "--generator", UNIVERSAL, "--generator", "AssistedCandidateGenerator", "--warpers", "none",
                 "--samples", "300", "--quiet", "--repro", str(tmp_path)])
    assert code == 1
    scripts = sorted(p.name for p in tmp_path.glob("*.py"))
    assert scripts == ["repro_UniversalSpeculativeDecodingGenerator_none_step_markov8.py"]
    assert "not lossless on transformers" in (tmp_path / scripts[0]).read_text()


#: Generated findings: path under findings/ -> the `lossless-check repro` arguments that write it.
GENERATED_FINDINGS = {
    "universal_permuted_q/generated_repro.py": ["--generator", UNIVERSAL, "--scenario", "iid32-fast-tokenizers"],
    "prompt_lookup_past_max_length/repro.py": ["--generator", "PromptLookupCandidateGenerator", "--warpers", "none",
                                               "--samples", "3000"],
    "dflash_drafts_past_max_length/generated_repro.py": ["--generator", DFLASH, "--warpers", "no_repeat_ngram_size=1",
                                                         "--scenario", "iid8"],
}


@pytest.mark.skipif(RELEASE < Version("5.18.0"), reason="the real loop's DFlash raise past max_length is on 5.18+ "
                                                        "(5.17.0 measured: no error; 5.15.0 fails for its own q bug)")
def test_dflash_script_raises_past_max_length(clean_python, tmp_path):
    """The harness's DFlash case as a script, which runs the real loop as it is (no row past max_length
    filled, unlike generate mode: lossless_check.modes.past_budget): 5.24.0, generate() raises within
    about 20 calls."""
    script = FINDINGS / "dflash_drafts_past_max_length/generated_repro.py"
    proc = run_script(clean_python, script, "--samples", "300", cwd=tmp_path)
    check_exit(proc, 1)
    assert "generate() raised RuntimeError" in proc.stdout


@pytest.mark.parametrize("path", [pytest.param(path, marks=needs(args[1])) for path, args in GENERATED_FINDINGS.items()])
def test_generated_finding_is_current(tmp_path, path):
    """A generated finding is what `lossless-check repro` writes today."""
    out = tmp_path / "script.py"
    assert main(["repro", *GENERATED_FINDINGS[path], "--out", str(out)]) == 0
    assert (FINDINGS / path).read_text() == out.read_text(), (
        f"regenerate: lossless-check repro {' '.join(GENERATED_FINDINGS[path])} --out findings/{path}")


def test_supported_families_are_built_in_generators():
    from lossless_check.subjects.builtin import BUILTIN_GENERATORS

    assert set(SUPPORTED) <= set(BUILTIN_GENERATORS)
