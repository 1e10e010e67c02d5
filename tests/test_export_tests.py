"""``lossless-check export-tests``: the exported pytest modules run without lossless_check and fail exactly where
the installed release is not lossless.

The exported directory is run by ``clean_python`` (conftest.py: a fresh virtual environment that sees torch,
transformers, pytest, numpy and scipy but cannot import ``lossless_check``) with plugin autoloading off, from a
directory outside the repository. Which exported tests fail depends on the installed release, through the
findings' affected ranges (findings/*/README.md); with the ``fix.patch`` of each finding that affects the installed
release applied (5.24.0, 5.25.0), none fails. A
negative control injects the seed's bug class (an assistant returning raw logits as q after drafting from
processed ones) and the exported sampling test must fail on it.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import transformers

from fixtures.patched_install import patched_transformers
from fixtures.readme import DOCS, blocks
from fixtures.releases import (
    DIFFERENT_TOKENIZERS_CACHE_ROLLBACK_UNITS,
    DIFFERENT_TOKENIZERS_TARGET_PROCESSORS,
    VERIFIER_ACCEPTS_AT_R_0,
    within,
)
from lossless_check.core.exit_codes import EXIT_OK, EXIT_USAGE
from lossless_check.faces.cli import main
from lossless_check.outputs.export_tests import HELPER, export_tests

FINDINGS = Path(__file__).resolve().parents[1] / "findings"
GUIDE = DOCS / "guides" / "export-tests.md"
#: What an exported module may import: these packages, the standard library and the shared helper.
ALLOWED = {"torch", "transformers", "pytest", "numpy", "scipy", "_speculative_laws"}

#: exported test (a prefix of its pytest id) -> the finding it fails on, and that finding's affected releases.
FAILS_ON = {
    "test_speculative_verifier.py::test_verifier_rejects_zero_probability_draft[zero_draw]":
        ("verifier_accepts_zero_probability", VERIFIER_ACCEPTS_AT_R_0),
    "test_speculative_two_tokenizers.py::test_universal_sampling_follows_target_law":
        ("universal_permuted_q", ("4.52.1", None)),
    # An id only the target has raises since the class appeared; a shared id passes on 4.46.0 and raises on
    # 5.24.0 (the first release between them where it raises is not determined).
    "test_speculative_two_tokenizers.py::test_different_tokenizers_greedy_equals_plain_greedy[bad_words_target":
        ("different_tokenizers_target_processors", DIFFERENT_TOKENIZERS_TARGET_PROCESSORS),
    "test_speculative_two_tokenizers.py::test_different_tokenizers_greedy_equals_plain_greedy[sequence_bias_target":
        ("different_tokenizers_target_processors", DIFFERENT_TOKENIZERS_TARGET_PROCESSORS),
    "test_speculative_two_tokenizers.py::test_different_tokenizers_greedy_equals_plain_greedy[bad_words_shared":
        ("different_tokenizers_target_processors", ("5.24.0", None)),
    "test_speculative_two_tokenizers.py::test_different_tokenizers_greedy_equals_plain_greedy[sequence_bias_shared":
        ("different_tokenizers_target_processors", ("5.24.0", None)),
    # 5.25.0 raises in the assistant's prefill with no processor at all: its cache is rolled back by a length
    # counted in the target's tokens.
    "test_speculative_two_tokenizers.py::test_different_tokenizers_greedy_equals_plain_greedy[none]":
        ("different_tokenizers_cache_rollback_units", DIFFERENT_TOKENIZERS_CACHE_ROLLBACK_UNITS),
    "test_speculative_single_position.py::test_single_position_sampling_follows_target_law":
        ("single_position_greedy_q", ("5.8.0", None)),
    "test_speculative_dflash.py::test_dflash_drafts_within_max_length":
        ("dflash_drafts_past_max_length", ("5.15.0", None)),
}
#: The findings whose fix.patch makes the exported modules pass on the releases they affect.
FIXED_BY_PATCHES = sorted({finding for finding, _ in FAILS_ON.values() if (FINDINGS / finding).is_dir()})


def documented_command() -> tuple[dict, list[str]]:
    """The command docs/guides/export-tests.md shows for running the exported directory: (environment, argv)."""
    runner = "test_exported_modules_fail_exactly_on_the_findings"
    (block,) = [b for b in blocks(GUIDE) if b.marker and runner in b.marker]
    words = shlex.split(block.code)
    assignments = [w for w in words if re.fullmatch(r"[A-Z_]+=\S*", w)]
    return dict(w.split("=", 1) for w in assignments), words[len(assignments):]


def run_exported(python, directory: Path, *args: str, pythonpath: str | None = None) -> tuple[dict, str, float]:
    """Run the exported ``directory`` as the guide says, in the clean environment: ({test id: outcome}, output,
    seconds). ``python`` replaces the command's ``python`` and ``directory`` its last word."""
    documented_env, argv = documented_command()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(documented_env)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    started = time.monotonic()
    command = [str(python), *argv[1:-1], "-rA", "--tb=line", *args, str(directory)]
    proc = subprocess.run(command, check=False, cwd=directory.parent, env=env, capture_output=True, text=True,
                          timeout=600)
    seconds = time.monotonic() - started
    found = re.findall(r"^(PASSED|FAILED|ERROR|SKIPPED) (\S+)", proc.stdout, re.MULTILINE)
    outcomes = {test.split("/")[-1]: outcome for outcome, test in found}
    return outcomes, proc.stdout + proc.stderr[-3000:], seconds


def expected_failures(test_ids) -> set[str]:
    """The exported tests that must fail on the installed release: those of the findings it has."""
    return {t for t in test_ids for prefix, (_, span) in FAILS_ON.items() if t.startswith(prefix) and within(span)}


def test_export_writes_the_installed_families(tmp_path):
    export = export_tests(tmp_path / "out")
    names = {p.name for p in export.files}
    assert HELPER in names and "test_speculative_verifier.py" in names
    from transformers.generation import candidate_generator

    for name in export.generators:
        assert hasattr(candidate_generator, name)
    helper = (tmp_path / "out" / HELPER).read_text()
    assert f"LAW_TESTS = {export.law_tests}\n" in helper
    for path in export.files:
        source = path.read_text()
        assert source.startswith(f"# Exported by `lossless-check export-tests` for transformers "
                                 f"{transformers.__version__}.")
        imported = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
        assert imported - ALLOWED <= set(sys.stdlib_module_names), (path.name, imported - ALLOWED)


def test_export_leaves_out_families_the_release_lacks(tmp_path, monkeypatch):
    """As on a release before 5.15 (no DFlash) and before 5.8 (no SinglePosition): their modules are not written
    (an earlier export's are removed) and the Bonferroni count drops by their law tests."""
    from transformers.generation import candidate_generator

    full = export_tests(tmp_path / "out")
    for name in ("DFlashTokenCandidateGenerator", "SinglePositionMultiTokenCandidateGenerator"):
        monkeypatch.delattr(candidate_generator, name)
    older = export_tests(tmp_path / "out")
    written = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"test_speculative_dflash.py", "test_speculative_single_position.py"}.isdisjoint(written)
    assert older.law_tests == full.law_tests - 2
    assert f"LAW_TESTS = {older.law_tests}\n" in (tmp_path / "out" / HELPER).read_text()


@pytest.mark.heavy
def test_law_test_count_matches_the_exported_sampling_tests(tmp_path, clean_python):
    """The Bonferroni count written into the helper is the number of law tests pytest collects."""
    export = export_tests(tmp_path / "out")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    proc = subprocess.run([str(clean_python), "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
                           str(tmp_path / "out")], check=False, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert collected, proc.stdout + proc.stderr
    assert sum("_sampling_follows_target_law" in line for line in collected) == export.law_tests, proc.stdout


def test_cli_exports_and_refuses_a_file(tmp_path, capsys):
    assert main(["export-tests", "--out", str(tmp_path / "out")]) == EXIT_OK
    assert "false-failure rate <= 1e-6" in capsys.readouterr().out
    (tmp_path / "file").write_text("")
    assert main(["export-tests", "--out", str(tmp_path / "file")]) == EXIT_USAGE
    assert "exists and is not a directory" in capsys.readouterr().err


@pytest.mark.heavy
def test_exported_modules_fail_exactly_on_the_findings(tmp_path, clean_python):
    export_tests(tmp_path / "out")
    outcomes, output, seconds = run_exported(clean_python, tmp_path / "out")
    failed = {t for t, outcome in outcomes.items() if outcome in ("FAILED", "ERROR")}
    assert outcomes and failed == expected_failures(outcomes), output
    print(f"exported modules on transformers {transformers.__version__}: {len(outcomes)} tests, "
          f"{len(failed)} failed, {seconds:.1f} s")


@pytest.mark.heavy
def test_exported_modules_pass_with_every_fix_patch(tmp_path, clean_python):
    """The fix.patch of every finding an exported test fails on in the installed release, applied together to a copy
    of it (written against 5.24.0 or 5.25.0; they apply to both): no exported test fails."""
    import subprocess

    affecting = sorted({finding for finding, span in FAILS_ON.values() if within(span) and finding in FIXED_BY_PATCHES})
    if not affecting:
        pytest.skip(f"no exported test fails on transformers {transformers.__version__}")
    combined = tmp_path / "fixes.patch"
    combined.write_text("".join((FINDINGS / finding / "fix.patch").read_text() for finding in affecting))
    try:
        site = patched_transformers(combined, tmp_path / "patched")
    except subprocess.CalledProcessError as refused:
        if transformers.__version__ in ("5.24.0", "5.25.0"):
            raise
        pytest.skip(f"the patches do not apply to {transformers.__version__}: {refused.stdout[-300:]}")
    export_tests(tmp_path / "out")
    outcomes, output, _ = run_exported(clean_python, tmp_path / "out", pythonpath=str(site))
    failed = {t for t, outcome in outcomes.items() if outcome in ("FAILED", "ERROR")}
    assert outcomes and not failed, output


#: The seed's bug class, injected into the exported directory by a conftest.py: the assistant drafts from its
#: processed law (top-k) but the generator returns the assistant's raw logits as q.
RAW_LOGITS_MUTANT = '''
import pytest
import torch
from transformers.generation import candidate_generator

real_get_candidates = candidate_generator.AssistedCandidateGenerator.get_candidates


def raw_logits_get_candidates(self, input_ids, *args, **kwargs):
    candidate_ids, candidate_logits = real_get_candidates(self, input_ids, *args, **kwargs)
    if candidate_logits is None:
        return candidate_ids, candidate_logits
    with torch.no_grad():
        raw = self.assistant_model(candidate_ids).logits[:, input_ids.shape[1] - 1 : -1]
    return candidate_ids, raw


candidate_generator.AssistedCandidateGenerator.get_candidates = raw_logits_get_candidates
'''


@pytest.mark.heavy
def test_exported_sampling_test_fails_on_raw_logits_mutant(tmp_path, clean_python):
    out = tmp_path / "out"
    export_tests(out)
    (out / "conftest.py").write_text(RAW_LOGITS_MUTANT)
    outcomes, output, _ = run_exported(clean_python, out, "-k", "assisted_sampling and top_k and not repetition")
    assert list(outcomes.values()) == ["FAILED"], output
    assert "AssistedCandidateGenerator is not lossless under {'top_k': 3}" in output, output
