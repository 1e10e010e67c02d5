"""Standalone reproductions: one script per failing case, importing only torch and transformers.

:func:`write_repro` fills ``repro_template.py.tmpl`` (a runnable template kept as a data file) with a case: its
scenario's tables, prompt and draft length, its warpers and its generator family. The script builds
fixed-logits models inline, runs the real ``generate()`` with the real generator and verifier, takes
its reference from plain ``generate()`` calls, and exits 1 when the bug reproduces (see the
template's docstring for its checks and error rate).
"""

from __future__ import annotations

import re
from pathlib import Path

from lossless_check.core.errors import UsageError
from lossless_check.evidence.results import Case, CaseResult

#: Families whose models the script builds inline (fixed-logits target and drafter, tokenizers).
TWO_TOKENIZER_FAMILIES = ("UniversalSpeculativeDecodingGenerator", "AssistedCandidateGeneratorDifferentTokenizers")
SUPPORTED = ("AssistedCandidateGenerator", "PromptLookupCandidateGenerator", *TWO_TOKENIZER_FAMILIES,
             "DFlashTokenCandidateGenerator")
#: Why the script cannot build each other family: what ``generate()`` needs to pick it, which the
#: script's fixed-logits models (one table, no layers, no hidden states) do not have.
UNSUPPORTED_FAMILIES = {
    "EarlyExitCandidateGenerator": "it drafts with the target's own first layers (assistant_early_exit), and the "
                                   "script's table model has no layers to exit early from",
    "SinglePositionMultiTokenCandidateGenerator": "generate() builds it only for a Gemma4 assistant on a target "
                                                  "returning shared_kv_states (hand-written with tiny Gemma 4 models: "
                                                  "findings/single_position_greedy_q/repro.py)",
    "MTPCandidateGenerator": "it drafts with MTP layers that generate() loads from the target's checkpoint "
                             "(use_mtp=True, MtpModel.from_pretrained), and the script's table model has none",
}
#: Why no script runs before 4.45 (the script checks it too, where it is run).
LEGACY_RELEASE = ("standalone scripts need transformers >= 4.45: their table model relies on the generic "
                  "GenerationMixin.prepare_inputs_for_generation, and before 4.45 each model wrote its own")
#: The tokenizer kinds the script builds (its ``--tokenizers`` choices).
WORD_LEVEL_TOKENIZERS = ("stub", "fast", "id-ordered")
#: The script template (never imported: its placeholders are filled in as text).
TEMPLATE = Path(__file__).with_name("repro_template.py.tmpl")
#: generate() calls a script makes at most (it stops at its first rejection).
MIN_SAMPLES, MAX_SAMPLES = 1_000, 20_000


def repro_unsupported(case: Case) -> str | None:
    """Why no script can be written for ``case`` (``None`` if one can)."""
    from lossless_check.laws.stubs import LEGACY_GENERATION

    generator = case.generator
    if case.mode == "greedy":
        return ("a greedy row's first difference (stack, prompt, max_new_tokens, tokens) is in its report; "
                "the scripts reproduce sampling cases")
    if LEGACY_GENERATION:
        return LEGACY_RELEASE
    if ":" in generator.spec:
        return f"{generator.display_name} is a user generator: a standalone script reproduces built-in generators"
    if generator.adapter.name not in SUPPORTED:
        why = UNSUPPORTED_FAMILIES.get(generator.adapter.name, "the script has no builder for it")
        return f"no standalone builder for {generator.adapter.name}: {why}; reproduce with lossless-check"
    if not hasattr(case.scenario, "drafter"):
        return f"the {case.scenario.name} scenario is not a fixed-logits one"
    if case.scenario.target_kind is not None:
        return (f"the script's table model keeps its history in one attention layer, not in a "
                f"{case.scenario.target_kind} target's states (tiny Mamba2 and Qwen3-Next models: "
                f"findings/stateful_rollback_one_state_short/repro.py)")
    if generator.adapter.name == "DFlashTokenCandidateGenerator" and case.scenario.drafter.kind == "markov":
        return "DFlash drafts a whole block in one pass: the script's block drafter reads iid or per_position tables"
    two_tokenizers = generator.adapter.name in TWO_TOKENIZER_FAMILIES
    if two_tokenizers and case.scenario.tokenizers not in WORD_LEVEL_TOKENIZERS:
        return f"the script builds word-level tokenizers; the {case.scenario.name} scenario's are {case.scenario.tokenizers}"
    return None


def _table(table) -> dict:
    return {"kind": table.kind, "dtype": getattr(table, "dtype", "float32"),
            "rows": [[float(x) for x in row] for row in table.rows]}


def _eos(warpers: dict) -> list[int]:
    eos = warpers.get("eos_token_id")
    return [] if eos is None else sorted([eos] if isinstance(eos, int) else eos)


def case_literal(case: Case, samples: int) -> dict:
    """The ``CASE`` dict of a script: everything it needs, in plain Python values."""
    scenario = case.scenario
    max_new_tokens = case.max_new_tokens if case.mode == "generate" else scenario.gamma + 1
    return {"family": case.generator.adapter.name, "warpers": dict(case.warpers), "prompt": list(scenario.prompt),
            "gamma": scenario.gamma, "max_new_tokens": max_new_tokens, "eos": _eos(case.warpers),
            "tokenizers": scenario.tokenizers if scenario.tokenizers in WORD_LEVEL_TOKENIZERS else "stub",
            "samples": samples, "scenario": scenario.name,
            "target": _table(scenario.target), "drafter": _table(scenario.drafter)}


def script_for(case: Case, result: CaseResult | None = None, samples: int | None = None) -> str:
    """The text of the reproduction script of ``case`` (``result``: the harness's finding, quoted)."""
    import transformers

    reason = repro_unsupported(case)
    if reason is not None:
        raise UsageError(f"cannot write a reproduction: {reason}")
    if samples is None:  # twice what the harness needed, within [MIN_SAMPLES, MAX_SAMPLES]
        found_at = result.samples if result is not None else 0
        samples = min(MAX_SAMPLES, max(MIN_SAMPLES, 2 * found_at))
    literal = case_literal(case, samples)
    warpers = "with no warpers" if case.warper_spec == "none" else f"under {case.warper_spec}"
    where = f"{case.generator.adapter.name} {warpers}, scenario {case.scenario.name}"
    if result is not None and result.verdict in ("not_lossless", "error"):
        title = f"{where}: not lossless on transformers {transformers.__version__} (found by lossless-check)."
        details = f"What lossless-check found ({result.mode} mode, {result.samples} trials):\n{_wrap(result.reason)}"
    else:
        title = f"{where}: a losslessness check through the real generate()."
        details = "Written by `lossless-check repro`."
    text = TEMPLATE.read_text(encoding="utf-8")
    replacements = {"__TITLE__": title, "__DETAILS__": details, "__SAMPLES__": f"(at most {samples:,})",
                    "__CASE__": _format(literal)}
    return re.sub("|".join(replacements), lambda m: replacements[m.group(0)], text, count=len(replacements))


def _wrap(text: str, width: int = 100) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text.replace('"""', "'''").replace("\\", "/"), width, initial_indent="    ",
                                   subsequent_indent="    "))


def _format(literal: dict) -> str:
    """The dict as Python source: one key per line, tables last (they can be long)."""
    lines = ["{"]
    for key, value in literal.items():
        lines.append(f"    {key!r}: {value!r},")
    lines.append("}")
    return "\n".join(lines)


def write_repro(case: Case, path: str | Path, result: CaseResult | None = None, samples: int | None = None) -> Path:
    """Write the reproduction script of ``case`` to ``path``; return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script_for(case, result, samples), encoding="utf-8")
    path.chmod(0o755)
    return path


def script_name(result: CaseResult) -> str:
    """A file name for a case's script: generator, warpers, mode and scenario, filesystem-safe."""
    slug = re.sub(r"[^A-Za-z0-9]+", "_", f"{result.generator}_{result.warpers}_{result.mode}_{result.scenario}")
    return f"repro_{slug.strip('_')}.py"


def write_repros(cases: list[Case], results: list[CaseResult], out_dir: str | Path) -> list[str]:
    """A script in ``out_dir`` for every failing (``not_lossless`` or ``error``) case of a run, where one
    can be written; returns a line per failing case saying where its script is, or why there is none."""
    lines = []
    for case, result in zip(cases, results):
        if result.verdict not in ("not_lossless", "error"):
            continue
        name = f"{result.generator} [{result.warpers}] {result.mode} {result.scenario}"
        reason = repro_unsupported(case)
        if reason is None:
            lines.append(f"repro: {name}: {write_repro(case, Path(out_dir) / script_name(result), result)}")
        else:
            lines.append(f"repro: {name}: none ({reason})")
    return lines


__all__ = ["SUPPORTED", "repro_unsupported", "script_for", "script_name", "write_repro", "write_repros"]
