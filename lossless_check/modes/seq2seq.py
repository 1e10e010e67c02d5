"""Encoder-decoder targets in generate and options mode: ``markov8-seq2seq``.

Speculative decoding's canonical example is an encoder-decoder (Whisper with a distilled assistant), and
``_assisted_decoding`` and ``AssistedCandidateGenerator`` have code for it that no decoder-only case runs (the
assistant's own encoder outputs, ``decoder_input_ids`` as the drafting key, the ``EncoderDecoderCache``'s crop, the
encoder-decoder outputs). The scenario's target and assistant are fixed-logits encoder-decoder stubs
(:mod:`lossless_check.laws.seq2seq_stubs`) with markov8's tables; the prompt is the encoder's input and the
decoder's prompt (``decoder_input_ids``), so the decoder's laws, and the exact laws of plain sampling, are
markov8's. ``generate()`` routes the assistant model to ``AssistedCandidateGenerator`` (and a subclass is wired in
where it builds it, :func:`~lossless_check.modes.loop_models.driving`); the other families need decoder-only models
of their own kinds and are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lossless_check.evidence.results import Case
from lossless_check.laws.scenarios import SCENARIOS, Scenario
from lossless_check.modes import loop_models


@dataclass(frozen=True)
class Seq2SeqScenario(Scenario):
    """A scenario whose target and assistant are encoder-decoder stubs."""

    encoder_decoder: bool = True


_BASE = SCENARIOS["markov8"]
SEQ2SEQ = Seq2SeqScenario(name="markov8-seq2seq", target=_BASE.target, drafter=_BASE.drafter, prompt=_BASE.prompt,
                          gamma=_BASE.gamma, tokenizers=_BASE.tokenizers,
                          description="markov8's tables on encoder-decoder stubs (the prompt is the encoder's input "
                                      "and the decoder's prompt)", dtype=_BASE.dtype)
#: The stack of a seq2seq generate case: a truncating one, under which a wrong q or crop moves the output law.
SEQ2SEQ_STACK = {"top_k": 3}


def is_seq2seq(scenario) -> bool:
    return bool(getattr(scenario, "encoder_decoder", False))


def skip_reason(case: Case) -> str | None:
    """Why an encoder-decoder case cannot run (``None``: the assisted family, or a subclass of it)."""
    if case.generator.adapter.name != loop_models.ASSISTED:
        return (f"generate() routes an encoder-decoder assistant model to {loop_models.ASSISTED}; "
                f"{case.generator.adapter.name} needs decoder-only models of its own kind")
    return None


def seq2seq_cases(generators: list, modes: tuple[str, ...], options_stack: dict) -> list[Case]:
    """The gate's encoder-decoder cases of ``generators``: a generate case and an options case (under
    ``options_stack``) each, in the modes given, for the assisted family (the others would be skipped)."""
    cases = []
    for g in generators:
        if g.adapter.name != loop_models.ASSISTED:
            continue
        if "generate" in modes:
            cases.append(Case(g, dict(SEQ2SEQ_STACK), "generate", SEQ2SEQ))
        if "options" in modes:
            cases.append(Case(g, dict(options_stack), "options", SEQ2SEQ))
    return cases


def check_decoder_only_assistant(scenario, greedy_config) -> list[str]:
    """Greedy speculative decoding of an encoder-decoder target with a decoder-only assistant (DistilWhisper's case:
    ``AssistedCandidateGenerator`` gives it the target's encoder outputs) against plain greedy decoding; the target's
    logits depend on the position (the per-position table), so a draft kept at the wrong position shows. The
    problems found."""
    import copy

    from lossless_check.laws.seq2seq_stubs import decoder_only_assistant, fixed_logits_seq2seq
    from lossless_check.subjects.adapters.base import constant_drafts

    by_position = [t for t in (scenario.drafter, scenario.target) if t.kind == "per_position"]
    if not by_position:
        return []
    other = scenario.target if by_position[0] is scenario.drafter else scenario.drafter
    target = fixed_logits_seq2seq(by_position[0], scenario.prompt)
    assistant = decoder_only_assistant(other, len(scenario.prompt), **constant_drafts(scenario.gamma))
    prompt_ids = torch.tensor([scenario.prompt])
    plain = target.generate(prompt_ids, decoder_input_ids=prompt_ids, generation_config=copy.deepcopy(greedy_config))
    drafted = target.generate(prompt_ids, decoder_input_ids=prompt_ids, generation_config=copy.deepcopy(greedy_config),
                              assistant_model=assistant)
    if torch.equal(plain, drafted):
        return []
    return [f"with a decoder-only assistant, greedy speculative decoding gives {drafted[0].tolist()} where plain "
            f"greedy decoding gives {plain[0].tolist()}"]


def seq2seq_setup(case: Case, max_new_tokens: int) -> dict:
    """Generate mode's set-up on the encoder-decoder stubs: the fields of :class:`~lossless_check.modes.generate._Setup`,
    but ``prepared`` (the config ``generate()`` prepared, whose EOS ids the case stops at) for ``eos``."""
    from transformers import GenerationConfig

    from lossless_check.core.compat import loop_eos, release_warpers
    from lossless_check.laws.expected import ExactLaws
    from lossless_check.laws.seq2seq_stubs import fixed_logits_seq2seq
    from lossless_check.laws.stubs import fixed_logits_lm
    from lossless_check.laws.warpers import capture_processors
    from lossless_check.subjects.adapters.base import constant_drafts

    scenario = case.scenario
    prompt_ids = torch.tensor([scenario.prompt], dtype=torch.long)
    config = GenerationConfig(do_sample=True, max_new_tokens=max_new_tokens, **release_warpers(case.warpers))
    loop_eos(config, scenario.vocab_size)
    # The decoder's laws are the decoder-only stub's (module docstring): its processors and exact laws.
    plain = fixed_logits_lm(scenario.target, prompt_length=len(scenario.prompt))
    processors, prepared = capture_processors(plain, prompt_ids, case.warpers, max_new_tokens)
    target = fixed_logits_seq2seq(scenario.target, scenario.prompt)
    assistant = fixed_logits_seq2seq(scenario.drafter, scenario.prompt, **constant_drafts(scenario.gamma))
    base = loop_models.installed_class(loop_models.ASSISTED)
    if case.generator.generator_class is not base:
        target = loop_models.driving(target, case.generator.generator_class, base)
    return {"target": target, "generate_kwargs": {"assistant_model": assistant, "decoder_input_ids": prompt_ids},
            "prompt_ids": prompt_ids, "generation_config": config, "law": ExactLaws(scenario, processors).target,
            "prepared": prepared, "route": "assistant_model= on an encoder-decoder target"}


__all__ = ["SEQ2SEQ", "SEQ2SEQ_STACK", "Seq2SeqScenario", "check_decoder_only_assistant", "is_seq2seq",
           "seq2seq_cases", "seq2seq_setup", "skip_reason"]
