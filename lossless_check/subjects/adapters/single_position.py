"""``SinglePositionMultiTokenCandidateGenerator``: a Gemma-4-style assistant drafting from one position.

The real generator accepts only an assistant whose class name contains ``Gemma4Assistant`` (and
``generate()`` builds it only for a target whose class name starts with ``Gemma4`` or
``Gemma3n``), so the stubs carry such names. Each step the generator feeds the assistant
``[target embedding of the last token, last hidden state]`` at one constant position and keeps
the assistant's ``logits`` as the returned ``candidate_logits``.

The assistant stub's logits are the drafter table's row for the token it drafts. Its position
never moves, so, as a real assistant does, it learns where it is from its input: the previous
token from the target's (one-hot) embedding, and how many tokens it has drafted since the target
last ran from the hidden state, whose first channel counts them (the target stub's hidden state
is zero; each assistant step adds one).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.utils import ModelOutput

from transformers.modeling_outputs import CausalLMOutputWithPast

from lossless_check.laws.stubs import FixedLogitsLM, TableDrafterStub, cache_output, fixed_logits_lm, output_cache
from lossless_check.subjects.adapters.base import (
    DraftContext, FunctionSession, GeneratorAdapter, Prefills, first_round_after_prefill, installed_release,
)


@dataclass
class AssistantOutput(ModelOutput):
    """What the generator reads from a Gemma 4 assistant."""

    logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None


@dataclass
class SharedKVOutput(CausalLMOutputWithPast):
    """Target outputs with the ``shared_kv_states`` a Gemma 4 target returns for its assistant."""

    shared_kv_states: dict | None = None


class FixedLogitsGemma4AssistantStub(TableDrafterStub):
    """Assistant stub: logits from the drafter table; its hidden state counts the drafts made."""

    def forward(self, inputs_embeds, attention_mask=None, position_ids=None, shared_kv_states=None, **kwargs):
        if shared_kv_states is None:
            raise ValueError("a Gemma 4 assistant works from the target's shared_kv_states")
        vocab = self.config.vocab_size
        # Input: [target's one-hot embedding of the last token, hidden state].
        previous = inputs_embeds[..., :vocab].max(dim=-1).indices  # not argmax: provenance reads argmax as a draft rule
        hidden = inputs_embeds[..., vocab:]
        drafted = hidden[..., 0].round().long()
        kind = self.config.table_kind
        if kind == "markov":
            index = previous
        elif kind == "per_position":
            # position_ids is the last token's position; this draft lands `drafted + 1` after it.
            index = (position_ids + 1 + drafted - self.config.prompt_length).clamp(0, self.table_rows.shape[0] - 1)
        else:
            index = torch.zeros_like(previous)
        counted = hidden.clone()
        counted[..., 0] += 1
        return AssistantOutput(logits=self.table_rows[index], last_hidden_state=counted)


class FixedLogitsGemma4TargetStub(FixedLogitsLM):
    """Target stub that also returns ``shared_kv_states`` (its cached keys and values).

    Its hidden states are zero: to the assistant stub, "no token drafted since the target ran".
    """

    def forward(self, input_ids=None, return_shared_kv_states: bool = False, **kwargs):
        out = super().forward(input_ids, **kwargs)
        if out.hidden_states is not None:
            out.hidden_states = tuple(torch.zeros_like(h) for h in out.hidden_states)
        shared = None
        if return_shared_kv_states:
            states = input_ids.to(torch.float32)[:, None, :, None]
            cache = output_cache(out)
            if cache is not None:
                layer = cache.layers[0]
                states = layer.keys
            shared = {"full_attention": (states, states)}
        return SharedKVOutput(logits=out.logits, hidden_states=out.hidden_states, shared_kv_states=shared,
                              **cache_output(CausalLMOutputWithPast, output_cache(out)))


def assistant_for(ctx: DraftContext) -> FixedLogitsGemma4AssistantStub:
    plain = fixed_logits_lm(ctx.scenario.drafter, prompt_length=len(ctx.scenario.prompt))
    model = FixedLogitsGemma4AssistantStub(plain.config).eval()
    model.generation_config = plain.generation_config
    model.generation_config.num_assistant_tokens = ctx.scenario.gamma
    return model


def target_for(ctx: DraftContext) -> FixedLogitsGemma4TargetStub:
    plain = fixed_logits_lm(ctx.scenario.target, prompt_length=len(ctx.scenario.prompt))
    model = FixedLogitsGemma4TargetStub(plain.config).eval()
    model.generation_config = plain.generation_config
    return model


class SinglePositionAdapter(GeneratorAdapter):
    name = "SinglePositionMultiTokenCandidateGenerator"
    #: The drafts are argmaxes: every row of a batch of identical rows drafts the same tokens, as a
    #: batch-1 call does (5.10-5.17 also stop every row at once: all rows draw EOS together).
    batchable = True
    #: 5.10-5.17 stop drafting once every row has drafted an EOS (5.17 ``candidate_generator.py``
    #: ``sequence_stopped``); later releases draft ``num_assistant_tokens`` tokens, always.
    drafts_stop_at_eos = installed_release() <= (5, 17)

    def session(self, ctx: DraftContext) -> FunctionSession:
        assistant = assistant_for(ctx)
        target = target_for(ctx)
        prefills = Prefills(target, return_shared_kv_states=True)

        def draft(input_ids):
            model_kwargs, outputs = prefills(input_ids)
            # A fresh generator per call: each call is the first drafting round after prefill.
            generator = ctx.generator_class(
                assistant_model=assistant,
                target_model_input_embeddings=target.get_input_embeddings(),
                generation_config=ctx.generation_config,
                # Releases 5.10-5.18 build it on AssistedCandidateGenerator, which takes these too;
                # later ones accept and ignore them.
                input_ids=input_ids,
                model_kwargs=dict(model_kwargs),
                inputs_tensor=input_ids,
                logits_processor=ctx.processors,
            )
            return first_round_after_prefill(generator, input_ids, model_kwargs, outputs)

        return FunctionSession(draft)
