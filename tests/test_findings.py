"""The standalone reproductions in ``findings/`` run without lossless_check and give their verdicts.

Each script is run in a fresh virtual environment where ``import lossless_check`` fails
(``clean_python`` in conftest.py: only the directories holding torch, transformers and their
dependencies are visible), from a directory outside the repository: it must build its models inline and decide with its own
statistics. The expected exit code of each bug run depends on the installed transformers release,
through ``AFFECTED`` (the releases whose source has the bug; see each finding's README.md). The
controls (the same run with the bug's cause removed) must exit 0 on every release.

The effects are large (TV 0.2-0.6), so a few hundred ``generate()`` calls decide at the scripts'
alpha of 1e-6. The Universal bug's size depends on the hash-map order of ``get_vocab()``, which
changes from process to process: over random orders its first-token TV is at least 0.19
(``findings/universal_permuted_q/order_sensitivity.py``), which 800 calls detect. A lossless
control exits 0 with probability at least 1 - 1e-6 at any sample size. Each run takes 5-20 s.
"""

from __future__ import annotations

import ast
import os
import subprocess
from pathlib import Path

import pytest
import transformers
from packaging.version import Version

from fixtures.releases import (CROSS_ATTENTIONS_SPLIT_HEADS, DIFFERENT_TOKENIZERS_CACHE_ROLLBACK_UNITS,
                               DIFFERENT_TOKENIZERS_TARGET_PROCESSORS, FIRST_ROUND_OUTPUTS_FROM_PROMPT_ROWS,
                               LOOP_STOPS_ON_PROMPT_EOS,
                               PROMPT_LOOKUP_CRASHES_WITHOUT_EOS, PROMPT_LOOKUP_OVERSHOOTS, STATIC_CACHE_OVERFLOWS,
                               ENCODER_DECODER_ASSISTANT_REREADS, STATEFUL_ROLLBACK_ONE_STATE_SHORT, STATIC_INDEXER_POSITIONS_KEPT, VERIFIER_ACCEPTS_AT_R_0,
                               within)
from lossless_check.outputs.repro import LEGACY_RELEASE
from lossless_check.laws.stubs import LEGACY_GENERATION

FINDINGS = Path(__file__).resolve().parents[1] / "findings"

#: finding -> (first affected release, first fixed release or None: still present in the newest
#: release checked, 5.24.0). From the releases' sources, and from running the scripts on 4.51.3,
#: 4.52.1, 5.0.0, 5.7.0, 5.8.0 and 5.24.0 (findings/*/README.md).
AFFECTED = {
    "universal_permuted_q": ("4.52.1", None),  # 4.52.1 pruned the assistant's LM head
    "single_position_greedy_q": ("5.8.0", None),  # the generator appeared in 5.8.0
    # 4.44-5.12 crash first (no EOS token: isin(chosen_ids, None)), 4.40-4.43 and 5.13 overshoot; 5.14 crops
    "prompt_lookup_past_max_length": PROMPT_LOOKUP_OVERSHOOTS,
    # `r <= p / q` since _speculative_sampling landed (4.37.0 line 4547, 5.17.0 line 4189, 5.24.0 line
    # 4479); 5.25.0 compares with `<`
    "verifier_accepts_zero_probability": VERIFIER_ACCEPTS_AT_R_0,
    # every DFlash release drafts the whole block (5.15.0 line 1671, 5.18.0 line 1659, 5.24.0 line 1648)
    "dflash_drafts_past_max_length": ("5.15.0", None),
    # the class keeps and passes the target's processors since it appeared (4.46.0 lines 159/225/513, 5.24.0
    # lines 166/320)
    "different_tokenizers_target_processors": DIFFERENT_TOKENIZERS_TARGET_PROCESSORS,
    # _last_ids_length in the target's tokens for a rollback in the assistant's (5.25.0 lines 303/550)
    "different_tokenizers_cache_rollback_units": DIFFERENT_TOKENIZERS_CACHE_ROLLBACK_UNITS,
    # is_done_candidate on a round without drafts (4.40.0 line 4659 ... 5.17.0 line 3857); 5.18.0 dropped it
    "prompt_lookup_nothing_after_eos_prompt": LOOP_STOPS_ON_PROMPT_EOS,
    # the loop records num_drafting_tokens states for a forward of one token more (5.25.0 line 4002); 5.24.0
    # refuses stateful targets (the script says there is nothing to reproduce)
    "stateful_rollback_one_state_short": STATEFUL_ROLLBACK_ONE_STATE_SHORT,
    # static caches are sized max_length - 1 (5.24.0 line 2963); 5.15-5.23 refuse them for speculative decoding
    "static_cache_drafts_past_max_length": STATIC_CACHE_OVERFLOWS,
    # the cross-attentions are narrowed along dimension 1, the heads (5.25.0 lines 4214, 4553/4566); 5.24.0 sliced
    # the queries
    "cross_attentions_split_heads": CROSS_ATTENTIONS_SPLIT_HEADS,
    # rows 0, 1, ... of the first round's forward, which starts at the prompt (5.25.0 lines 4564/4567, 5.24.0 line
    # 4531, the same indices back to 4.37)
    "first_round_outputs_from_prompt_rows": FIRST_ROUND_OUTPUTS_FROM_PROMPT_ROWS,
    # StaticIndexedLayer.crop leaves indexer_position_ids (5.25.0 lines 730-736 vs 382-383); 5.21-5.24 refuse
    # Qwen4-exp, a stateful model class (the script says there is nothing to reproduce)
    "static_indexer_positions_not_cropped": STATIC_INDEXER_POSITIONS_KEPT,
    # no decoder mask for an encoder-decoder assistant: _prefill re-reads its ids (5.25.0 utils.py 4316-4336;
    # candidate_generator.py 151-153); 5.25.0 also raises (its crop by _last_ids_length, line 303)
    "encoder_decoder_assistant_rereads_its_input": ENCODER_DECODER_ASSISTANT_REREADS,
}

#: What a script may import: the standard library modules below, torch, transformers and
#: tokenizers (a dependency of transformers).
ALLOWED_IMPORTS = {"argparse", "inspect", "math", "sys", "time", "torch", "transformers", "tokenizers"}

INSTALLED = Version(transformers.__version__).release[:3]


def affected(finding: str) -> bool:
    first, fixed = AFFECTED[finding]
    return Version(first).release <= INSTALLED and (fixed is None or INSTALLED < Version(fixed).release)


def run_repro(python, finding: str, *args: str, tmp_path: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    """Run ``findings/<finding>/repro.py`` with ``python``; ``pythonpath`` (e.g. a patched transformers) goes first."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([str(python), str(FINDINGS / finding / "repro.py"), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def check_exit(proc: subprocess.CompletedProcess, expected: int) -> None:
    assert proc.returncode == expected, (
        f"exit {proc.returncode}, expected {expected} on transformers {transformers.__version__}\n"
        f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr[-3000:]}"
    )
    assert "verdict" in proc.stdout or "nothing to reproduce" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_universal_permuted_q_reproduces(clean_python, tmp_path):
    proc = run_repro(clean_python, "universal_permuted_q", "--samples", "800", tmp_path=tmp_path)
    check_exit(proc, 1 if affected("universal_permuted_q") else 0)


@pytest.mark.slow
@pytest.mark.parametrize("control", ["--id-ordered-vocab", "--fixed"])
def test_universal_permuted_q_controls_are_lossless(clean_python, tmp_path, control):
    """The assistant's get_vocab() in id order, or the proposed fix applied: lossless."""
    proc = run_repro(clean_python, "universal_permuted_q", "--samples", "500", control, tmp_path=tmp_path)
    check_exit(proc, 0)


@pytest.mark.slow
def test_single_position_greedy_q_reproduces(clean_python, tmp_path):
    proc = run_repro(clean_python, "single_position_greedy_q", "--samples", "600", tmp_path=tmp_path)
    check_exit(proc, 1 if affected("single_position_greedy_q") else 0)


@pytest.mark.slow
def test_single_position_greedy_q_one_hot_q_is_lossless(clean_python, tmp_path):
    proc = run_repro(clean_python, "single_position_greedy_q", "--samples", "500", "--one-hot-q", tmp_path=tmp_path)
    check_exit(proc, 0)


def imported_modules(source: str) -> set[str]:
    """The top-level modules a Python source imports, anywhere in it."""
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    return imported


@pytest.mark.parametrize("finding", sorted(AFFECTED))
def test_repro_imports_only_torch_and_transformers(finding):
    imported = imported_modules((FINDINGS / finding / "repro.py").read_text())
    assert imported <= ALLOWED_IMPORTS, imported - ALLOWED_IMPORTS


def test_findings_index_lists_every_reproduction():
    index = (FINDINGS / "README.md").read_text()
    for finding in AFFECTED:
        assert (FINDINGS / finding / "README.md").is_file()
        assert f"{finding}/" in index


@pytest.mark.slow
@pytest.mark.skipif(LEGACY_GENERATION, reason=LEGACY_RELEASE)  # there the harness's own test covers it
def test_prompt_lookup_past_max_length_reproduces(clean_python, tmp_path):
    """Generated script: an exact stopping check, 3000 calls at most (about 10 s when lossless)."""
    proc = run_repro(clean_python, "prompt_lookup_past_max_length", tmp_path=tmp_path)
    check_exit(proc, 1 if affected("prompt_lookup_past_max_length") else 0)
    # Where the model without EOS crashes first, the script says so, and not that the overshoot reproduces.
    crashes = within(PROMPT_LOOKUP_CRASHES_WITHOUT_EOS)
    assert ("verdict: ERROR: generate() raised TypeError" in proc.stdout) == crashes, proc.stdout


def test_verifier_accepts_zero_probability_reproduces(clean_python, tmp_path):
    """Exact, one verifier call at a placed rand() == 0 (about 4 s)."""
    proc = run_repro(clean_python, "verifier_accepts_zero_probability", tmp_path=tmp_path)
    check_exit(proc, 1 if affected("verifier_accepts_zero_probability") else 0)


def test_dflash_drafts_past_max_length_reproduces(clean_python, tmp_path):
    """Exact, 5 generate() calls with a real DFlash drafter (about 1 s after imports)."""
    proc = run_repro(clean_python, "dflash_drafts_past_max_length", tmp_path=tmp_path)
    check_exit(proc, 1 if affected("dflash_drafts_past_max_length") else 0)


def test_dflash_drafts_past_max_length_control(clean_python, tmp_path):
    """One draft per block never runs past max_length: exit 0 on every release."""
    proc = run_repro(clean_python, "dflash_drafts_past_max_length", "--block-size", "2", tmp_path=tmp_path)
    check_exit(proc, 0)


def test_different_tokenizers_target_processors_reproduces(clean_python, tmp_path):
    """Greedy two-tokenizer assisted decoding raises under bad_words_ids / sequence_bias where the release
    hands the target's processors to the assistant (exact: no statistics)."""
    proc = run_repro(clean_python, "different_tokenizers_target_processors", tmp_path=tmp_path)
    check_exit(proc, 1 if affected("different_tokenizers_target_processors") else 0)


def test_different_tokenizers_target_processors_control(clean_python, tmp_path):
    """Without a processor the two-tokenizer greedy output is plain greedy decoding's: exit 0 on every release."""
    proc = run_repro(clean_python, "different_tokenizers_target_processors", "--no-processors", tmp_path=tmp_path)
    check_exit(proc, 0)


def test_different_tokenizers_cache_rollback_units_reproduces(clean_python, tmp_path):
    """Greedy two-tokenizer assisted decoding raises where the release rolls the assistant's cache back by a
    length counted in the target's tokens (exact; two tiny Llama pairs, about 10 s)."""
    proc = run_repro(clean_python, "different_tokenizers_cache_rollback_units", tmp_path=tmp_path)
    check_exit(proc, 1 if affected("different_tokenizers_cache_rollback_units") else 0)


def test_different_tokenizers_cache_rollback_units_control(clean_python, tmp_path):
    """With the rolled-back length recorded in the assistant's tokens every call equals plain greedy: exit 0."""
    proc = run_repro(clean_python, "different_tokenizers_cache_rollback_units", "--assistant-units",
                     tmp_path=tmp_path)
    check_exit(proc, 0)


def test_prompt_lookup_nothing_after_eos_prompt_reproduces(clean_python, tmp_path):
    """Prompt lookup emits no token after a prompt ending in EOS where the loop checks the stopping criteria
    on a round without drafts (exact)."""
    proc = run_repro(clean_python, "prompt_lookup_nothing_after_eos_prompt", tmp_path=tmp_path)
    check_exit(proc, 1 if affected("prompt_lookup_nothing_after_eos_prompt") else 0)


def test_prompt_lookup_nothing_after_eos_prompt_control(clean_python, tmp_path):
    """The same prompt without its final EOS: tokens are emitted on every release (exit 0)."""
    proc = run_repro(clean_python, "prompt_lookup_nothing_after_eos_prompt", "--no-final-eos", tmp_path=tmp_path)
    check_exit(proc, 0)


@pytest.mark.slow
def test_stateful_rollback_one_state_short_reproduces(clean_python, tmp_path):
    """Exact (greedy against plain greedy decoding), tiny Mamba2 and Qwen3-Next: about 20 s of CPU."""
    proc = run_repro(clean_python, "stateful_rollback_one_state_short", tmp_path=tmp_path)
    check_exit(proc, 1 if affected("stateful_rollback_one_state_short") else 0)


@pytest.mark.slow
def test_stateful_rollback_one_state_short_control_is_lossless(clean_python, tmp_path):
    """The target's cache records one more recurrent state than the loop asks for: identical tokens."""
    proc = run_repro(clean_python, "stateful_rollback_one_state_short", "--keep-one-more", tmp_path=tmp_path)
    check_exit(proc, 0)


def test_static_cache_drafts_past_max_length_reproduces(clean_python, tmp_path):
    """Exact (a call raises, or differs from plain greedy decoding): a tiny Llama, about 5 s."""
    proc = run_repro(clean_python, "static_cache_drafts_past_max_length", tmp_path=tmp_path)
    check_exit(proc, 1 if affected("static_cache_drafts_past_max_length") else 0)


def test_static_cache_drafts_past_max_length_control_is_lossless(clean_python, tmp_path):
    proc = run_repro(clean_python, "static_cache_drafts_past_max_length", "--dynamic-cache", tmp_path=tmp_path)
    check_exit(proc, 0)


def test_cross_attentions_split_heads_reproduces(clean_python, tmp_path):
    """Exact (the shapes of assisted decoding's cross-attentions against plain decoding's): a tiny Bart, about 13 s."""
    proc = run_repro(clean_python, "cross_attentions_split_heads", tmp_path=tmp_path)
    check_exit(proc, 1 if affected("cross_attentions_split_heads") else 0)


def test_cross_attentions_split_heads_control(clean_python, tmp_path):
    """The same calls without output_attentions: the tokens are plain decoding's on every release (exit 0)."""
    proc = run_repro(clean_python, "cross_attentions_split_heads", "--no-attentions", tmp_path=tmp_path)
    check_exit(proc, 0)


def test_first_round_outputs_from_prompt_rows_reproduces(clean_python, tmp_path):
    """Exact to float32 rounding (hidden states and attentions of assisted against plain greedy decoding): a tiny Llama,
    3-11 s."""
    proc = run_repro(clean_python, "first_round_outputs_from_prompt_rows", tmp_path=tmp_path)
    check_exit(proc, 1 if affected("first_round_outputs_from_prompt_rows") else 0)


def test_first_round_outputs_from_prompt_rows_control(clean_python, tmp_path):
    """The same calls, the tokens of the later rounds only: their rows are right on every release (exit 0)."""
    proc = run_repro(clean_python, "first_round_outputs_from_prompt_rows", "--later-rounds", tmp_path=tmp_path)
    check_exit(proc, 0)


def test_static_indexer_positions_not_cropped_reproduces(clean_python, tmp_path):
    """Exact (greedy prompt lookup against plain greedy decoding on a static cache): a tiny Qwen4-exp, about 15 s."""
    proc = run_repro(clean_python, "static_indexer_positions_not_cropped", tmp_path=tmp_path)
    check_exit(proc, 1 if affected("static_indexer_positions_not_cropped") else 0)


@pytest.mark.parametrize("control", ["--dynamic-cache", "--fix"])
def test_static_indexer_positions_not_cropped_controls(clean_python, tmp_path, control):
    """The dynamic cache, whose crop cuts the positions, and the static one with the fix: plain decoding's tokens."""
    proc = run_repro(clean_python, "static_indexer_positions_not_cropped", control, tmp_path=tmp_path)
    check_exit(proc, 0)


def test_encoder_decoder_assistant_rereads_its_input_reproduces(clean_python, tmp_path):
    """Exact (the assistant's cache against the sequence; 5.25.0: generate() raises): a tiny Bart pair, about 10 s."""
    proc = run_repro(clean_python, "encoder_decoder_assistant_rereads_its_input", tmp_path=tmp_path)
    check_exit(proc, 1 if affected("encoder_decoder_assistant_rereads_its_input") else 0)


def test_encoder_decoder_assistant_rereads_its_input_control(clean_python, tmp_path):
    """A decoder attention mask passed to generate(): the assistant's generate() cuts the ids; identical, bounded."""
    proc = run_repro(clean_python, "encoder_decoder_assistant_rereads_its_input", "--decoder-mask", tmp_path=tmp_path)
    check_exit(proc, 0)
