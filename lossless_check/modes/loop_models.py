"""The models of generate mode, one set per generator family, built so that ``generate()`` picks the family.

Generate mode calls the unmodified ``target.generate(prompt, generation_config=..., **kwargs)``;
``GenerationMixin._get_candidate_generator`` of the installed release then builds the candidate
generator from what it is given, exactly as for a real model. Per family (5.24 ``generation/utils.py``
``_get_candidate_generator``, same branches on every 5.x release that has the class):

- ``AssistedCandidateGenerator``: ``assistant_model=`` a fixed-logits assistant (same vocabulary);
- ``PromptLookupCandidateGenerator``: ``prompt_lookup_num_tokens=gamma`` in the config, no assistant;
- ``EarlyExitCandidateGenerator``: ``assistant_early_exit`` in the config; the target is the
  early-exit stub (drafter table below full depth);
- ``SinglePositionMultiTokenCandidateGenerator``: an assistant whose class name starts with
  ``Gemma4Assistant`` on a target whose name starts with ``Gemma4``, which returns
  ``shared_kv_states`` and hidden states when asked;
- ``MTPCandidateGenerator``: ``use_mtp=True``; the target has ``num_mtp_layers`` and MTP weights in
  its (temporary) checkpoint, which ``MtpModel.from_pretrained`` loads at every ``generate()`` call;
- ``DFlashTokenCandidateGenerator``: ``speculation_type="dflash"`` and the DFlash drafter stub as
  ``assistant_model``;
- ``UniversalSpeculativeDecodingGenerator``: ``do_sample=True``, an assistant over another
  vocabulary, and ``tokenizer=`` / ``assistant_tokenizer=`` (the scenario's tokenizers);
- ``AssistedCandidateGeneratorDifferentTokenizers``: the same with ``do_sample=False``, the only
  config for which ``generate()`` builds it: the reference is then plain greedy decoding.

The stub models are the adapters' (:mod:`lossless_check.subjects.adapters`), so step and generate mode
check the same drafters; the targets read their history from a real, croppable cache
(:class:`~lossless_check.laws.stubs.FixedLogitsLM`). Where a family reads the target's hidden states
(MTP, DFlash, SinglePosition), the target returns them for every input position, whatever
``logits_to_keep`` asks of the logits, as a real decoder does.

A user subclass of a built-in generator is wired in by :func:`driving`: the target's
``_get_candidate_generator`` builds the subclass with the arguments the installed release's
``generate()`` gives its family (nothing of ``transformers`` is patched; the override lives on a
subclass of the stub target). Any other ``CandidateGenerator``, the one a user's factory returns, is
wired in the same place by :func:`drafting_with_factory`, on the assisted route
(``assistant_model=`` a stub of the target's table, which only makes ``generate()`` run
``_assisted_decoding``): the factory is called with a :class:`DraftContext` of that very call.
"""

from __future__ import annotations

import inspect
import shutil
import tempfile
import weakref
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import torch
from transformers import GenerationMixin
from transformers.modeling_outputs import CausalLMOutputWithPast

from lossless_check.laws.stateful import StatefulFixedLogitsLM, refusal, stateful_variant
from lossless_check.laws.stubs import FixedLogitsLM, fixed_logits_lm
from lossless_check.modes.wiring import drafting_with_factory, driving
from lossless_check.subjects.adapters import DraftContext
from lossless_check.subjects.adapters.base import constant_drafts
from lossless_check.subjects.adapters.dflash import dflash_drafter_for
from lossless_check.subjects.adapters.early_exit import (
    EXIT_LAYER, FULL_DEPTH, EarlyExitFixedLogitsLM, early_exit_model_for,
)
from lossless_check.subjects.adapters.factory import FactoryAdapter
from lossless_check.subjects.adapters.mtp import FixedLogitsMtpLM, _quiet_loading, mtp_target_for
from lossless_check.subjects.adapters.single_position import FixedLogitsGemma4AssistantStub
from lossless_check.subjects.adapters.vocabularies import assistant_lm, tokenizer_pair

ASSISTED = "AssistedCandidateGenerator"
PROMPT_LOOKUP = "PromptLookupCandidateGenerator"
EARLY_EXIT = "EarlyExitCandidateGenerator"
SINGLE_POSITION = "SinglePositionMultiTokenCandidateGenerator"
MTP = "MTPCandidateGenerator"
DFLASH = "DFlashTokenCandidateGenerator"
UNIVERSAL = "UniversalSpeculativeDecodingGenerator"
DIFFERENT_TOKENIZERS = "AssistedCandidateGeneratorDifferentTokenizers"

#: How generate() is made to pick each family (reports show it).
ROUTES = {
    ASSISTED: "assistant_model=",
    PROMPT_LOOKUP: "prompt_lookup_num_tokens",
    EARLY_EXIT: "assistant_early_exit",
    SINGLE_POSITION: "Gemma4Assistant assistant_model= on a Gemma4 target",
    MTP: "use_mtp on a target with MTP layers",
    DFLASH: "speculation_type='dflash'",
    UNIVERSAL: "assistant_model= + tokenizer/assistant_tokenizer, do_sample=True",
    DIFFERENT_TOKENIZERS: "assistant_model= + tokenizer/assistant_tokenizer, do_sample=False (greedy)",
}
FAMILIES = tuple(ROUTES)
#: The adapter name of a user's factory (``module:function``), and how generate() is made to run it.
FACTORY = FactoryAdapter.name
FACTORY_ROUTE = "assistant_model= (assisted decoding), the factory's generator built where generate() builds one"
#: Families generate() builds only for greedy decoding: the reference law is a point mass.
GREEDY_FAMILIES = (DIFFERENT_TOKENIZERS,)


@dataclass
class LoopModels:
    """What one generate-mode case calls: ``target.generate(prompt, generation_config=config, **generate_kwargs)``.

    ``config_fields`` are the ``GenerationConfig`` fields that route the family; ``counts_round()``
    tells, inside a forward of ``target``, whether it is a verification pass (the early-exit target
    also drafts for itself); ``keep`` holds what must live as long as the models (the MTP
    checkpoint folder).
    """

    target: Any
    generate_kwargs: dict = field(default_factory=dict)
    config_fields: dict = field(default_factory=dict)
    counts_round: Callable[[], bool] = lambda: True
    keep: Any = None


# --------------------------------------------------------------------------------------------------
# Target stubs


class FullHiddenStates:
    """Mixin for a :class:`FixedLogitsLM`: hidden states at every input position, whatever ``logits_to_keep``.

    ``generate()`` asks for the logits of the last position only (``logits_to_keep``), but a
    generator that reads the target's hidden states (MTP, DFlash, SinglePosition) needs them for
    every token the target just processed, as a real decoder returns them.
    """

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, cache=None,
                use_cache=None, output_hidden_states=None, logits_to_keep: int = 0, **kwargs):
        out = super().forward(input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              past_key_values=past_key_values, cache=cache, use_cache=use_cache,
                              output_hidden_states=output_hidden_states, logits_to_keep=0, **kwargs)
        if logits_to_keep:
            out.logits = out.logits[:, -logits_to_keep:]
        return out


class FullHiddenStatesLM(FullHiddenStates, FixedLogitsLM):
    """The fixed-logits target with hidden states at every position (DFlash's target)."""


class FullHiddenStatesMtpLM(FullHiddenStates, FixedLogitsMtpLM):
    """The adapter's MTP target stub with hidden states at every position."""


@dataclass
class SharedKVCausalLMOutput(CausalLMOutputWithPast):
    """A causal-LM output with the ``shared_kv_states`` a Gemma 4 target returns for its assistant."""

    shared_kv_states: dict | None = None


class Gemma4FixedLogitsTarget(FullHiddenStates, FixedLogitsLM):
    """Target stub named as ``generate()`` requires for a Gemma 4 assistant (``Gemma4...``).

    Returns ``shared_kv_states`` (its cached keys and values) when asked, and zero hidden states: to
    the assistant stub (:class:`~lossless_check.subjects.adapters.single_position.FixedLogitsGemma4AssistantStub`)
    a zero hidden state means "no token drafted since the target ran".
    """

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, cache=None,
                use_cache=None, output_hidden_states=None, logits_to_keep: int = 0,
                return_shared_kv_states: bool = False, **kwargs):
        out = super().forward(input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              past_key_values=past_key_values, cache=cache, use_cache=use_cache,
                              output_hidden_states=output_hidden_states, logits_to_keep=logits_to_keep, **kwargs)
        values = {f.name: getattr(out, f.name) for f in fields(out)}
        if values.get("hidden_states") is not None:
            values["hidden_states"] = tuple(torch.zeros_like(h) for h in values["hidden_states"])
        if return_shared_kv_states:
            kv = past_key_values if past_key_values is not None else cache
            states = kv.layers[0].keys if kv is not None else input_ids.to(torch.float32)[:, None, :, None]
            values["shared_kv_states"] = {"full_attention": (states, states)}
        return SharedKVCausalLMOutput(**values)


class Gemma4AssistantFixedLogits(FixedLogitsGemma4AssistantStub, GenerationMixin):
    """The adapter's Gemma 4 assistant stub under a name ``generate()`` routes (``Gemma4Assistant...``).

    A generation model, as the real ``Gemma4AssistantForCausalLM`` is: releases 5.10-5.18 build the
    generator on ``AssistedCandidateGenerator``, whose constructor asks the assistant
    ``_supports_logits_to_keep()`` when ``generate()``'s model kwargs hold ``logits_to_keep``.
    """


class EarlyExitLoopLM(EarlyExitFixedLogitsLM):
    """The adapter's early-exit stub, writing every layer it runs into the cache, as a real decoder does.

    ``DynamicCache(config=...)`` holds one layer per ``config.num_hidden_layers``: at full depth the
    target writes them all; while drafting (depth lowered to the exit layer) only the layers below
    the exit are written, as in a LayerSkip model running ``layers[:num_hidden_layers]``.
    """

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, cache=None,
                use_cache=None, output_hidden_states=None, logits_to_keep: int = 0, **kwargs):
        out = super().forward(input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              past_key_values=past_key_values, cache=cache, use_cache=use_cache,
                              output_hidden_states=output_hidden_states, logits_to_keep=logits_to_keep, **kwargs)
        kv = past_key_values if past_key_values is not None else cache
        if kv is not None:
            states = input_ids.to(torch.float32)[:, None, :, None]
            for layer in range(1, self.model.config.num_hidden_layers):  # layer 0: FixedLogitsLM.forward
                kv.update(states, states, layer)
        return out


def _rebuilt(model, cls):
    """``model`` (a fixed-logits stub) as an instance of ``cls``: same config, weights and generation config.
    A stateful ``model`` (:mod:`~lossless_check.laws.stateful`) stays stateful: ``cls`` reads its history as it does."""
    if isinstance(model, StatefulFixedLogitsLM):
        cls = stateful_variant(cls)
    rebuilt = cls(model.config).eval()
    rebuilt.load_state_dict(model.state_dict())
    rebuilt.generation_config = model.generation_config
    return rebuilt


# --------------------------------------------------------------------------------------------------
# Families


def _assisted(ctx: DraftContext) -> LoopModels:
    return LoopModels(ctx.target, {"assistant_model": ctx.assistant()})


def _prompt_lookup(ctx: DraftContext) -> LoopModels:
    return LoopModels(ctx.target, config_fields={"prompt_lookup_num_tokens": ctx.scenario.gamma})


def _early_exit(ctx: DraftContext) -> LoopModels:
    target = early_exit_model_for(ctx)
    target.__class__ = EarlyExitLoopLM  # adds behaviour only: same modules and weights
    # The target drafts for itself at lowered depth: only its full-depth forwards verify.
    return LoopModels(target, config_fields={"assistant_early_exit": EXIT_LAYER},
                      counts_round=lambda: target.model.config.num_hidden_layers >= FULL_DEPTH)


def _single_position(ctx: DraftContext) -> LoopModels:
    scenario = ctx.scenario
    plain_target = fixed_logits_lm(scenario.target, prompt_length=len(scenario.prompt))
    plain_assistant = fixed_logits_lm(scenario.drafter, prompt_length=len(scenario.prompt),
                                      **constant_drafts(scenario.gamma))
    assistant = Gemma4AssistantFixedLogits(plain_assistant.config).eval()
    assistant.generation_config = plain_assistant.generation_config
    return LoopModels(_rebuilt(plain_target, Gemma4FixedLogitsTarget), {"assistant_model": assistant})


def _mtp(ctx: DraftContext) -> LoopModels:
    # MtpModel.from_pretrained reads the MTP weights from the target's checkpoint folder at every
    # generate() call (the generator is built per call): the folder lives as long as the target.
    folder = tempfile.mkdtemp(prefix="lossless-check-mtp-")
    try:
        saved = mtp_target_for(ctx, folder)
    except BaseException:
        shutil.rmtree(folder, True)
        raise
    target = _rebuilt(saved, FullHiddenStatesMtpLM)
    target._weight_conversions = saved._weight_conversions
    weakref.finalize(target, shutil.rmtree, folder, True)
    return LoopModels(target, config_fields={"use_mtp": True}, keep=folder)


def _dflash(ctx: DraftContext) -> LoopModels:
    target = _rebuilt(ctx.target, FullHiddenStatesLM)
    return LoopModels(target, {"assistant_model": dflash_drafter_for(ctx)}, {"speculation_type": "dflash"})


def _two_tokenizers(ctx: DraftContext, greedy: bool) -> LoopModels:
    scenario = ctx.scenario
    vocab = scenario.vocab_size
    assistant = assistant_lm(scenario.drafter, prompt_length=len(scenario.prompt), vocab_size=vocab,
                             tokenizers=scenario.tokenizers, **constant_drafts(scenario.gamma))
    target_tokenizer, assistant_tokenizer = tokenizer_pair(scenario.tokenizers, vocab)
    kwargs = {"assistant_model": assistant, "tokenizer": target_tokenizer, "assistant_tokenizer": assistant_tokenizer}
    return LoopModels(ctx.target, kwargs, {"do_sample": False} if greedy else {})


BUILDERS: dict[str, Callable[[DraftContext], LoopModels]] = {
    ASSISTED: _assisted,
    PROMPT_LOOKUP: _prompt_lookup,
    EARLY_EXIT: _early_exit,
    SINGLE_POSITION: _single_position,
    MTP: _mtp,
    DFLASH: _dflash,
    UNIVERSAL: lambda ctx: _two_tokenizers(ctx, greedy=False),
    DIFFERENT_TOKENIZERS: lambda ctx: _two_tokenizers(ctx, greedy=True),
}


def _factory(ctx: DraftContext) -> LoopModels:
    # Any assistant of the target's vocabulary routes generate() to _assisted_decoding (one over a
    # padded drafter vocabulary would need tokenizers); the factory's generator replaces generate()'s.
    route = fixed_logits_lm(ctx.scenario.target, prompt_length=len(ctx.scenario.prompt))
    return LoopModels(drafting_with_factory(ctx.target, ctx), {"assistant_model": route})


def route(family: str) -> str:
    """How ``generate()`` is made to build ``family`` (a built-in name, or :data:`FACTORY`), as reports say it."""
    return FACTORY_ROUTE if family == FACTORY else ROUTES[family]


#: Families whose generate-mode target cannot be one of the stateful targets (:mod:`~lossless_check.laws.stateful`), and why.
NOT_ON_STATEFUL_TARGETS = {
    EARLY_EXIT: "the target drafts with its own lower layers, and the early-exit stub (as the LayerSkip checkpoints "
                "the family is for) is an attention model with a layer of keys per depth",
    SINGLE_POSITION: "generate() builds it for a Gemma4 or Gemma3n target only, whose assistant reads the target's "
                     "attention keys (shared_kv_states): the Gemma4 stub keeps its history in one full-attention layer",
}


def target_kind_reason(family: str, kind: str) -> str | None:
    """Why ``family`` cannot run on a target of ``kind`` (``linear``, ``hybrid``, ``sliding``, ``static``) on
    this install, or ``None``: the family cannot pair with it (:data:`NOT_ON_STATEFUL_TARGETS`), or the
    installed release refuses the kind (:func:`~lossless_check.laws.stateful.refusal`): not applicable."""
    if family in NOT_ON_STATEFUL_TARGETS:
        return f"not applicable to a {kind} target: {NOT_ON_STATEFUL_TARGETS[family]}"
    refused = refusal(kind)
    return None if refused is None else f"not applicable: {refused}"


def loop_models(family: str, ctx: DraftContext) -> LoopModels:
    """The models and ``generate()`` arguments that make ``generate()`` build ``family`` (a built-in name,
    or :data:`FACTORY`).

    ``ctx.generator_class`` is the class under test: the built-in itself is left to ``generate()``
    to pick; a subclass is wired in by :func:`driving`, a factory by :func:`drafting_with_factory`.
    """
    if family == FACTORY:
        return _factory(ctx)
    with _quiet_loading():
        models = BUILDERS[family](ctx)
    base = installed_class(family)
    if ctx.generator_class is not base:
        models.target = driving(models.target, ctx.generator_class, base)
    return models


def installed_class(name: str):
    """The built-in generator class ``name`` of the installed release (``None`` if absent)."""
    from transformers.generation import candidate_generator

    return getattr(candidate_generator, name, None)


def routes_in_generate(family: str) -> bool | None:
    """Whether the installed ``generate()`` can build ``family`` (``None``: its source cannot be read)."""
    try:
        source = inspect.getsource(GenerationMixin._get_candidate_generator)
    except (OSError, TypeError):
        return None
    return f"{family}(" in source


__all__ = ["FACTORY", "FAMILIES", "GREEDY_FAMILIES", "LoopModels", "NOT_ON_STATEFUL_TARGETS", "ROUTES", "driving",
           "drafting_with_factory", "installed_class", "loop_models", "route", "routes_in_generate",
           "target_kind_reason"]
