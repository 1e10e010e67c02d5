"""Each finding's ``fix.patch``, judged on a patched copy of the installed transformers.

For every ``findings/<name>/fix.patch``: the installed ``transformers`` package is copied into a
temporary directory (one copy per patch, about 1-2 s: a module-scoped fixture) and the patch is
applied there with ``patch -p1``, the way ``patch -p1 -d SITE_PACKAGES`` applies it to an install.
With that copy first on ``PYTHONPATH``:

- (a) the finding's ``repro.py`` exits 0, in the fresh virtual environment of ``clean_python``
  (``tests/test_findings.py`` checks that it exits 1 on the unpatched install);
- (b) the harness's own check, with this worktree on the path, exits 0: ``lossless-check run ...``
  of the affected generator (every case ``lossless``; the same run on the unpatched install is not,
  so the run's sample count is one at which the bug is caught), or ``lossless-check verifier`` for
  the verifier's fix (it exits 1 unpatched: ``tests/test_verifier.py``).

The patches are written against 5.24.0, except a finding's that only a later release has (its
``Fix.release``: 5.25.0 for the stateful rollback, the cross-attentions' split and the static indexer's
positions, and for the first round's output rows, whose 5.24.0 lines differ). On another installed release a patch that does not
apply is skipped with its reason; on the release it is written against it must apply. A lossless run exits 1 with probability at most
its alpha (1e-6, the scripts' and the CLI's default), so these tests fail falsely at most that often.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import transformers

from fixtures.releases import STATEFUL_TARGETS_REFUSED, STATIC_CACHE_REFUSED, needs, within
from test_findings import FINDINGS, affected, check_exit, run_repro

ROOT = Path(__file__).resolve().parents[1]
#: The directory ``patch -p1 -d`` applies the patches in: the one holding the ``transformers`` package.
SITE = Path(transformers.__file__).resolve().parents[1]
#: The release the patches are written against: there they must apply.
PATCHED_RELEASE = "5.24.0"


@dataclass(frozen=True)
class Fix:
    """How a fix is judged: arguments of the finding's repro.py, the harness's run of its generator
    (keywords of ``lossless_check.check``, which ``lossless-check run`` takes as options; None: no run), and
    that run's verdict on the unpatched release."""

    repro_args: tuple[str, ...]
    harness: dict | None
    unpatched_verdict: str = "not_lossless"
    #: Words the unpatched run's reason has (a robustness finding is no verdict: what it leaves in the reason).
    unpatched_words: str = ""
    #: The harness's own check where it is not a ``run`` of a generator (the verifier's).
    check: tuple[str, ...] = ()
    #: The release the patch is written against (there it must apply): the first with the finding's code.
    release: str = PATCHED_RELEASE
    #: The unpatched run's verdict where the finding is not (the release refuses the run's scenario: ``skipped``).
    unaffected_verdict: str = "lossless"
    #: Why no harness check can judge the fix, where none reaches the bug (then (b) is skipped with this reason).
    harness_blind: str = ""

    def command(self) -> list[str]:
        """The CLI's check of the fix: a run of the generator (without the verifier's row, which judges
        another part of the install), or :attr:`check`."""
        if self.harness is None:
            return list(self.check)
        options = [arg for key, value in self.harness.items() for arg in (f"--{key}", str(value))]
        return ["run", *options, "--no-verifier", "--quiet"]


#: finding -> how its fix.patch is judged. The harness runs stop at their first rejection: on
#: 5.24.0 unpatched, Universal after 156 trials, SinglePosition after 66 (a patched run takes them all).
#: The sample sizes make a pass a claim: each detects TV 0.3 at position 1 with power 0.99 (measured:
#: 0.40 at 150 generate calls and 400 Universal trials, 0.32 at 400 SinglePosition trials, all short).
#: DFlash's drafts past max_length make the real loop raise on iid8 (every token banned there): the
#: harness gives those rows zero logits (lossless_check.modes.past_budget) and its reason counts them.
FIXES = {
    "dflash_drafts_past_max_length": Fix((), dict(
        generator="DFlashTokenCandidateGenerator", warpers="no_repeat_ngram_size=1", mode="generate",
        scenario="iid8", samples=350), unpatched_verdict="lossless", unpatched_words="drafted past max_new_tokens"),
    "universal_permuted_q": Fix(("--samples", "300"), dict(
        generator="UniversalSpeculativeDecodingGenerator", warpers="none", mode="step",
        scenario="iid32-fast-tokenizers", samples=900)),
    "single_position_greedy_q": Fix(("--samples", "300"), dict(
        generator="SinglePositionMultiTokenCandidateGenerator", warpers="none", mode="step",
        scenario="iid8", samples=600)),
    # Greedy, exact: unpatched, generate() raises in every comparison with a processor (verdict error).
    "different_tokenizers_target_processors": Fix((), dict(
        generator="AssistedCandidateGeneratorDifferentTokenizers", warpers="bad_words_ids=[[3]]", mode="greedy",
        scenario="markov8"),  # (markov8-static's rows meet static_cache_drafts_past_max_length, another finding)
        unpatched_verdict="error"),
    # The harness's check of the verifier is `lossless-check verifier` (exit 0 on the strict fix).
    "verifier_accepts_zero_probability": Fix((), None, check=("verifier",)),
    # Unpatched 5.25.0 stops after 7 trials; releases before 5.25.0 refuse the linear target (not applicable).
    "stateful_rollback_one_state_short": Fix((), dict(
        generator="PromptLookupCandidateGenerator", warpers="none", mode="generate", scenario="markov8-linear",
        samples=400), release="5.25.0",
        unaffected_verdict="skipped" if within(STATEFUL_TARGETS_REFUSED) else "lossless"),
    # Exact in the repro only: the harness's two-tokenizer rows desynchronise the assistant's cache on 5.25.0
    # (bpe-fast-tokenizers greedy: 92 of 150 rounds) but their fixed-logits drafters neither raise nor draft
    # differently from a stale cache.
    "different_tokenizers_cache_rollback_units": Fix((), None, release="5.25.0", harness_blind=(
        "no harness case reaches the raise: its fixed-logits drafters ignore a stale assistant cache")),
    # Unpatched, generate() raises in the first samples (verdict error); 5.15-5.23 refuse a static cache.
    "static_cache_drafts_past_max_length": Fix((), dict(
        generator="PromptLookupCandidateGenerator", warpers="none", mode="generate", scenario="markov8-static",
        samples=400), unpatched_verdict="error",
        unaffected_verdict="skipped" if within(STATIC_CACHE_REFUSED) else "lossless"),
    # Unpatched, the stub's position history outgrows its keys at the first rejection; 5.15-5.23 refuse a static
    # cache. Assisted: its drafts stop short of the static cache's end (the other generators meet the overflow).
    "static_indexer_positions_not_cropped": Fix((), dict(
        generator="AssistedCandidateGenerator", warpers="none", mode="generate", scenario="markov8-static-indexed",
        samples=400), release="5.25.0", unaffected_verdict="skipped" if within(STATIC_CACHE_REFUSED) else "lossless"),
    # The gate's fixed-logits encoder-decoder stubs have no position table and draft the same from any cache.
    "encoder_decoder_assistant_rereads_its_input": Fix((), None, release="5.25.0", harness_blind=(
        "the fixed-logits encoder-decoder stubs neither read positions nor draft differently from a re-read cache; "
        "`lossless-check models` on a Bart pair meets the 5.25.0 failure (tests/test_models_seq2seq.py)")),
    # Exact (shapes of what generate() returns): unpatched 5.25.0's options row is not lossless at its first call.
    "cross_attentions_split_heads": Fix((), dict(
        generator="AssistedCandidateGenerator", warpers="none", mode="options", scenario="markov8-seq2seq"),
        release="5.25.0"),
    # Exact in the repro only: options mode compares hidden states and attentions by count and shape.
    "first_round_outputs_from_prompt_rows": Fix((), None, release="5.25.0", harness_blind=(
        "options mode compares hidden states and attentions with plain decoding's by count and shape, not value")),
}


def patch_command(patch: Path, root: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(["patch", "-p1", "--forward", "--batch", *options, "-d", str(root), "-i", str(patch)],
                          capture_output=True, text=True)


def skip_unless_applies(finding: str) -> Path:
    """The finding's fix.patch; skips where it does not apply to the installed release (never on the release it
    is written against: 5.24.0, or :attr:`Fix.release`)."""
    patch = FINDINGS / finding / "fix.patch"
    if shutil.which("patch") is None:
        pytest.skip("the `patch` program is not installed")
    dry = patch_command(patch, SITE, "--dry-run")
    if dry.returncode != 0:
        release = FIXES[finding].release
        assert transformers.__version__ != release, f"{patch} does not apply to {SITE}:\n{dry.stdout}"
        pytest.skip(f"{finding}/fix.patch is written against {release}; it does not apply to the installed "
                    f"{transformers.__version__}: {dry.stdout.strip().splitlines()[-1]}")
    return patch


def test_every_fix_patch_is_judged():
    """A new fix.patch cannot go untested: every one in findings/ is in FIXES."""
    assert {p.parent.name for p in FINDINGS.glob("*/fix.patch")} == set(FIXES)


@pytest.fixture(scope="module", params=sorted(FIXES))
def patched(request, tmp_path_factory):
    """(finding, directory holding the patched copy of the installed transformers package)."""
    finding = request.param
    patch = skip_unless_applies(finding)
    root = tmp_path_factory.mktemp(f"patched-{finding}")
    shutil.copytree(SITE / "transformers", root / "transformers", symlinks=True)
    applied = patch_command(patch, root)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    return finding, root


def imported_from(python, pythonpath: str) -> Path:
    """Where ``python`` imports transformers from with ``pythonpath`` (found, not imported: fast)."""
    env = dict(os.environ, PYTHONPATH=pythonpath)
    probe = "import importlib.util as u; print(u.find_spec('transformers').origin)"
    out = subprocess.run([str(python), "-c", probe], env=env, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip()).resolve()


@pytest.mark.slow
def test_patched_repro_is_lossless(patched, clean_python, tmp_path):
    """(a): the reproduction, run on the patched copy, exits 0."""
    finding, root = patched
    assert imported_from(clean_python, str(root)).is_relative_to(root)
    proc = run_repro(clean_python, finding, *FIXES[finding].repro_args, tmp_path=tmp_path, pythonpath=str(root))
    check_exit(proc, 0)


@pytest.mark.slow
def test_harness_judges_patched_generator_lossless(patched, tmp_path):
    """(b): the harness's own check of the affected part (``lossless-check run`` of the generator, or
    ``lossless-check verifier``) on the patched copy exits 0."""
    finding, root = patched
    fix = FIXES[finding]
    if fix.harness_blind:
        pytest.skip(fix.harness_blind)
    pythonpath = os.pathsep.join((str(root), str(ROOT)))  # the patched transformers, then this worktree
    assert imported_from(sys.executable, pythonpath).is_relative_to(root)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=pythonpath)
    report = tmp_path / "report.json"
    json_option = ["--json", str(report)] if fix.unpatched_words else []
    proc = subprocess.run([sys.executable, "-m", "lossless_check.faces.cli", *fix.command(), *json_option],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    if fix.unpatched_words:  # lossless either way: the fix is that what the unpatched run notes is gone
        assert all(fix.unpatched_words not in c["reason"] for c in json.loads(report.read_text())["cases"])


@pytest.mark.slow
@pytest.mark.parametrize("finding", [pytest.param(f, marks=needs(fix.harness["generator"]))
                                     for f, fix in sorted(FIXES.items()) if fix.harness is not None])
def test_harness_flags_unpatched_generator(finding):
    """The negative control of (b): the same run on the installed (unpatched) release is not lossless (or errs,
    or, for a robustness finding, says what it saw: ``unpatched_words``) where the bug is (in-process,
    through the Python API the CLI calls: no second import of torch and transformers)."""
    import lossless_check as lc

    fix = FIXES[finding]
    result = lc.check(**fix.harness)
    assert result.verdict == (fix.unpatched_verdict if affected(finding) else fix.unaffected_verdict), result.explain()
    assert not affected(finding) or fix.unpatched_words in result.explain()
