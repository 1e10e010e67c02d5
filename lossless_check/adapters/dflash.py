"""``DFlashTokenCandidateGenerator``: a block drafter whose hidden states are the fixed logits.

The drafter's last hidden state, projected through the target's output embedding (an identity
``lm_head`` in :class:`~lossless_check.stubs.FixedLogitsLM`), gives exactly the drafter table's
logits. The drafter drafts a whole block in one forward pass, so it cannot condition on its own
drafts: only ``iid`` and ``per_position`` drafter tables apply.
"""

from __future__ import annotations

import torch

from transformers.modeling_outputs import BaseModelOutputWithPast

from ..stubs import FixedLogitsConfig, TableDrafterStub
from .base import DraftContext, FunctionSession, GeneratorAdapter, first_round_after_prefill, prefill_state


class FixedLogitsDFlashDrafter(TableDrafterStub):
    """DFlash drafter stub: ``last_hidden_state[:, i]`` are the logits for noise position ``i``."""

    def forward(self, noise_embeds, context_hidden_states, position_ids, attention_mask=None, past_key_values=None,
                cache=None, **kwargs):
        past_key_values = past_key_values if past_key_values is not None else cache  # ``cache`` from 5.24
        block = noise_embeds.shape[1]
        noise_positions = position_ids[:, -block:]
        if past_key_values is not None:
            # Real drafters store the context and the noise block; the generator crops the block later.
            length = context_hidden_states.shape[1] + block
            states = torch.zeros(1, 1, length, 1, device=noise_embeds.device)
            past_key_values.update(states, states, 0)
        # Hidden state at noise position a + i predicts the token at a + i (i >= 1 are the drafts).
        generated_index = noise_positions - self.config.prompt_length
        rows = self.table_rows[generated_index.clamp(0, self.table_rows.shape[0] - 1)]
        return BaseModelOutputWithPast(last_hidden_state=rows, past_key_values=past_key_values)


def dflash_drafter_for(ctx: DraftContext) -> FixedLogitsDFlashDrafter:
    table = ctx.scenario.drafter
    config = FixedLogitsConfig(
        vocab_size=table.vocab_size,
        table_kind=table.kind,
        table_rows=table.rows.tolist(),
        prompt_length=len(ctx.scenario.prompt),
    )
    config.target_layer_ids = [0]
    config.block_size = ctx.scenario.gamma + 1
    config.mask_token_id = 0
    return FixedLogitsDFlashDrafter(config).eval()


class DFlashAdapter(GeneratorAdapter):
    name = "DFlashTokenCandidateGenerator"
    drafter_kinds = ("iid", "per_position")

    def session(self, ctx: DraftContext) -> FunctionSession:
        drafter = dflash_drafter_for(ctx)
        model_kwargs, outputs = prefill_state(ctx.target, ctx.prompt_ids)

        def draft(input_ids):
            # A fresh generator per trial: each trial is the first drafting round after prefill.
            generator = ctx.generator_class(
                assistant_model=drafter,
                main_model_input_embeddings=ctx.target.get_input_embeddings(),
                main_model_output_embeddings=ctx.target.get_output_embeddings(),
                generation_config=ctx.generation_config,
                logits_processor=ctx.processors,
            )
            return first_round_after_prefill(generator, input_ids, model_kwargs, outputs)

        return FunctionSession(draft)
