"""``lossless-check models``: a user's own target/assistant pair checked in the real ``generate()``.

:func:`check_models` loads both checkpoints offline, then runs, for every generator family that applies
(or each named one) and every warper stack, the exact, statistical and greedy checks of
:mod:`lossless_check.modes.models.pair`. The statistical tests share the family-wise ``alpha`` (Bonferroni
over generators and stacks); the exact and greedy checks spend none.

**What "a lossless pair is reported not_lossless with probability at most alpha" assumes.** Losslessness is
taken as: every emitted token follows, given everything before it, the law the verifier computed at that
position (the rows ``generate()`` returns as its scores; :mod:`lossless_check.stats.betting` states the
hypothesis and the filtration). That holds for Algorithm 1 of Leviathan et al. when (1) each returned q row is
the law its draft was drawn from, and (2) the verifier's row at a position does not depend on the drafts after
it (exact by the causal mask; in floating point, a row's last bits may vary with the number of positions in its
forward pass). Beyond that, the bound assumes (3) torch's random generator and numpy's (the harness's PIT
uniforms) behave as independent ideal uniform sources. Nothing else: not independence between tokens or calls,
not that the harness's own forward passes match ``generate()``'s (they only aim the bets), not a fixed stopping
rule (the test is anytime-valid: it stops at its first rejection). The exact check fails a row only on a
returned q more than :data:`~lossless_check.modes.interception.TOLERANCE` in TV from its drafts' law, and the
greedy check only on different tokens: neither fails a lossless pair. A row whose exact check could not see
its drafts and whose statistical check lacked power is ``inconclusive``, never ``lossless``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lossless_check.core.errors import UsageError
from lossless_check.core.options import DEFAULT_ALPHA
from lossless_check.modes.loop_models import ASSISTED
from lossless_check.modes.models.pair import FAMILIES, TWO_TOKENIZERS, PairRow

#: Most sampling generate() calls per row (each stops at its first rejection).
DEFAULT_SAMPLES = 64
DEFAULT_MAX_NEW_TOKENS = 32
#: Without ``warpers``: a truncating stack, the one under which a raw-logits q differs from the drafts' law.
DEFAULT_WARPERS = ("top_k=50",)


@dataclass
class ModelsResult:
    """Every row of a :func:`check_models` run; ``exit_code`` as ``lossless-check run``'s."""

    rows: list[PairRow]
    alpha: float
    seed: int
    settings: dict = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        """As ``lossless-check run``'s: 1 a row failed; 5 no answer (a generator none of whose rows was checked,
        or an ``inconclusive`` row); else 0."""
        from lossless_check.core.exit_codes import exit_code_for

        verdicts: dict[str, list[str]] = {}
        for r in self.rows:
            verdicts.setdefault(r.generator, []).append(r.verdict)
        return exit_code_for(verdicts)

    def to_dict(self) -> dict:
        """The JSON report: the run report's keys (``cases``, ``alpha_family``...) plus the pair's settings."""
        import torch
        import transformers

        return {"command": "models", "transformers_version": transformers.__version__,
                "torch_version": torch.__version__, "alpha_family": self.alpha, "seed": self.seed, **self.settings,
                "cases": [r.to_dict() for r in self.rows], "exit_code": self.exit_code}

    def table(self) -> str:
        lines = []
        for r in self.rows:
            lines.append(f"{r.verdict:<13} {r.generator} [{r.warpers}]  ({r.seconds:.1f} s)")
            lines.append(f"    {r.reason}")
            stats = r.statistical
            if stats:
                tv, bug = stats["tv_target_drafter"], stats["tv_raw_logits_bug_first_position"]
                if tv["positions"]:
                    lines.append(f"    TV(target, drafter) per position: median {tv['median']:.3g}, "
                                 f"p95 {tv['p95']:.3g}; "
                                 f"a raw-logits q would emit at TV median {bug['median']:.3g}, p95 {bug['p95']:.3g} "
                                 f"({tv['positions']} positions)")
                lines.append("    " + _power_line(stats["power"]))
        return "\n".join(lines)


def _power_line(power: dict) -> str:
    """The simulated power at each per-position TV, the weakest direction's."""
    by_size: dict = {}
    for row in power["rows"]:
        if row["direction"] in power["directions"]:
            by_size[row["tv"]] = min(by_size.get(row["tv"], 1.0), row["power"])
    sizes = ", ".join(f"TV {size:g}: {value:.2f}" for size, value in by_size.items())
    return f"power (weakest of {len(power['directions'])} directions, {power['tokens']} tokens): {sizes}"


def resolve_families(generators, two_tokenizers: bool = False) -> list:
    """The named generators (built-in names or ``module:attr`` subclasses of a family a pair drives), or
    every family the pair drives (the two-tokenizer one when ``two_tokenizers``: the folders hold
    different tokenizers); a one-line :class:`UsageError` for the others."""
    from lossless_check.subjects.adapters import resolve_generator

    drives = FAMILIES + (TWO_TOKENIZERS if two_tokenizers else ())
    # With two vocabularies generate() routes an assistant model to the two-tokenizer family, not to Assisted.
    default = tuple(f for f in drives if not (two_tokenizers and f == ASSISTED))
    resolved = [resolve_generator(g) for g in (generators or default)]
    for r in resolved:
        if r.adapter.name == "factory":
            raise UsageError(f"generator {r.spec!r} is a factory: factories build generators over the harness's "
                             f"stub models; with a model pair name a class (a subclass of {' or '.join(drives)})")
        if r.adapter.name in TWO_TOKENIZERS and not two_tokenizers:
            raise UsageError(f"generator {r.spec!r} needs different tokenizers saved in the --target and "
                             f"--assistant folders")
        if r.adapter.name not in drives:
            raise UsageError(f"generator {r.spec!r}: a model pair drives {' and '.join(drives)} (and their "
                             f"subclasses); {r.adapter.name} needs models of its own kind")
    return resolved


def check_models(target: str, assistant: str, generators=None, warpers=None, prompts: str | None = None,
                 max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS, samples: int = DEFAULT_SAMPLES,
                 alpha: float = DEFAULT_ALPHA, seed: int = 0, device: str = "cpu", workers: int = 1) -> ModelsResult:
    """Check speculative decoding with the user's own pair: ``target`` and ``assistant`` are local
    ``save_pretrained`` folders (loaded with ``local_files_only=True``), both decoder-only or both encoder-decoder
    (``is_encoder_decoder`` in their configs: then a prompt is the encoder's input, and the tokens checked are the
    decoder's after its start tokens).

    ``generators``: built-in names or ``module:attr`` classes (default: AssistedCandidateGenerator and
    PromptLookupCandidateGenerator; when the two folders hold different tokenizers, prompt lookup and
    AssistedCandidateGeneratorDifferentTokenizers, greedy only); ``warpers``: spec strings or dicts (default :data:`DEFAULT_WARPERS`);
    ``prompts``: a file, one prompt per line (text through the target's tokenizer when its folder has
    one, else space-separated token ids), default seeded random ids; ``samples``: most sampling
    ``generate()`` calls per row; ``workers``: processes the calls are spread over (each loads the
    pair; the report is the same for any number). A lossless pair is reported ``not_lossless`` with
    probability at most ``alpha``, under the assumptions the module docstring states; the exact and greedy
    checks never fail a lossless pair. A row whose drafts the exact check could not trace and whose
    statistical check could not have seen a departure of per-position TV
    :data:`~lossless_check.modes.models.pair.MAX_DETECTABLE_TV` is ``inconclusive``.
    """
    from lossless_check.faces.case_lists import _stacks
    from lossless_check.modes.models.loading import (
        check_checkpoint_dir,
        check_prompts_file,
        load_pair,
        load_tokenizer,
        read_prompts,
        tokenizers_differ,
    )
    from lossless_check.modes.models.pair import check_row
    from lossless_check.modes.models.sampling import RowSettings
    from lossless_check.running.engine import make_engine

    check_checkpoint_dir(target, "--target")
    check_checkpoint_dir(assistant, "--assistant")
    check_prompts_file(prompts)
    _positive("workers", workers)
    resolved = resolve_families(generators, tokenizers_differ(target, assistant))
    stacks = _stacks(warpers if warpers else list(DEFAULT_WARPERS))
    target_model, _ = load_pair(target, assistant, device)
    vocab = target_model.get_output_embeddings().weight.shape[0]
    prompt_ids = tuple(tuple(p) for p in read_prompts(prompts, load_tokenizer(target), vocab, seed))
    alpha_row = alpha / (len(resolved) * len(stacks))
    with make_engine(workers) as engine:
        rows = [check_row(engine, RowSettings(target, assistant, device, g.spec, tuple(stack.items()), prompt_ids,
                                              max_new_tokens, seed), g, samples, alpha_row)
                for g in resolved for stack in stacks]
    return ModelsResult(rows, alpha, seed, {"target": target, "assistant": assistant, "device": device,
                                            "generators": [g.spec for g in resolved] if generators else None,
                                            "max_new_tokens": max_new_tokens, "samples": samples,
                                            "prompts": prompts or "built-in"})


def _positive(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UsageError(f"{name} must be a positive integer, got {value!r}")


__all__ = ["DEFAULT_ALPHA", "ModelsResult", "check_models"]
