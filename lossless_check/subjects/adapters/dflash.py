"""``DFlashTokenCandidateGenerator``: a block drafter whose hidden states are the fixed logits.

The drafter's last hidden state, projected through the target's output embedding (an identity
``lm_head`` in :class:`~lossless_check.laws.stubs.FixedLogitsLM`), gives exactly the drafter table's
logits. The drafter drafts a whole block in one forward pass, so it cannot condition on its own
drafts: only ``iid`` and ``per_position`` drafter tables apply.
"""

from __future__ import annotations

import torch

from transformers.modeling_outputs import BaseModelOutputWithPast

from lossless_check.laws.stubs import FixedLogitsConfig, TableDrafterStub, cache_output
from lossless_check.subjects.adapters.base import (
    DraftContext, FunctionSession, GeneratorAdapter, Prefills, first_round_after_prefill, installed_release,
)

#: Releases 5.16-5.17 crop the drafted block after its first EOS, reading the EOS position from row 0
#: only and cutting every row there (5.17 ``candidate_generator.py`` lines 1755-1761:
#: ``drafted_tokens = candidate_ids[0, ...]``, ``candidate_ids[:, : ... + num_drafted]``): a batch
#: row's draft depends on another row's. Later releases draft the full block.
CROPS_BLOCK_AT_ROW_0_EOS = (5, 16) <= installed_release() <= (5, 17)


class FixedLogitsDFlashDrafter(TableDrafterStub):
    """DFlash drafter stub: ``last_hidden_state[:, i]`` are the logits for noise position ``i``."""

    def forward(self, noise_embeds, context_hidden_states, position_ids, attention_mask=None, past_key_values=None,
                cache=None, **kwargs):
        past_key_values = past_key_values if past_key_values is not None else cache  # ``cache`` from 5.24
        batch, block = noise_embeds.shape[:2]
        noise_positions = position_ids[:, -block:]
        if past_key_values is not None:
            # Real drafters store the context and the noise block; the generator crops the block later.
            length = context_hidden_states.shape[1] + block
            states = torch.zeros(batch, 1, length, 1, device=noise_embeds.device)
            past_key_values.update(states, states, 0)
        # Hidden state at noise position a + i predicts the token at a + i (i >= 1 are the drafts).
        generated_index = noise_positions - self.config.prompt_length
        rows = self.table_rows[generated_index.clamp(0, self.table_rows.shape[0] - 1)]
        # One row per sequence, also where positions come as one row shared by the batch.
        if rows.shape[0] != batch:
            rows = rows.expand(batch, -1, -1).clone()  # the generator writes into the logits it projects
        return BaseModelOutputWithPast(last_hidden_state=rows, **cache_output(BaseModelOutputWithPast, past_key_values))


def dflash_drafter_for(ctx: DraftContext) -> FixedLogitsDFlashDrafter:
    table = ctx.scenario.drafter
    config = FixedLogitsConfig.for_table(table, prompt_length=len(ctx.scenario.prompt))  # rows, kind, dtype
    config.target_layer_ids = [0]
    config.block_size = ctx.scenario.gamma + 1
    config.mask_token_id = 0
    return FixedLogitsDFlashDrafter(config).eval()


def _batch_1_attention_mask(model_kwargs: dict) -> dict:
    """``model_kwargs`` with the attention mask as one row, shared (broadcast) by the batch.

    Every DFlash release concatenates ``model_kwargs["attention_mask"][:, :-1]`` with a mask it
    builds for the noise block as ``torch.ones(1, block_size)`` (5.24 ``candidate_generator.py``
    line 137), which only concatenates with a one-row mask. The prompt's mask is all ones, the same
    for every row, so one row carries exactly what B rows would.
    """
    mask = model_kwargs.get("attention_mask")
    if mask is not None and mask.shape[0] > 1:
        model_kwargs = dict(model_kwargs, attention_mask=mask[:1])
    return model_kwargs


def _noise_block_per_row(generator, batch: int) -> None:
    """Give the fresh generator's mask-token block one row per sequence.

    The generator builds the mask tokens of its noise block once, in ``__init__``, as a one-row
    tensor, ``torch.tensor([mask_token_id] * (block_size - 1))[None, ...]``, and concatenates it
    with ``input_ids[:, -1:]`` (5.24 ``candidate_generator.py`` lines 47 and 131), which only works
    for one row. Every row of the block holds the same mask tokens: the rows are that one row,
    repeated (a view; nothing else of the generator is touched).
    """
    mask = getattr(generator, "noise_ids_mask", None)
    if batch > 1 and isinstance(mask, torch.Tensor) and mask.dim() == 2 and mask.shape[0] == 1:
        generator.noise_ids_mask = mask.expand(batch, -1)


class DFlashAdapter(GeneratorAdapter):
    name = "DFlashTokenCandidateGenerator"
    drafter_kinds = ("iid", "per_position")
    batchable = not CROPS_BLOCK_AT_ROW_0_EOS
    #: 5.16-5.17 end a draft at its first EOS (see :data:`CROPS_BLOCK_AT_ROW_0_EOS`).
    drafts_stop_at_eos = CROPS_BLOCK_AT_ROW_0_EOS

    def session(self, ctx: DraftContext) -> FunctionSession:
        drafter = dflash_drafter_for(ctx)
        prefills = Prefills(ctx.target)

        def draft(input_ids):
            model_kwargs, outputs = prefills(input_ids)
            # A fresh generator per call: each call is the first drafting round after prefill.
            generator = ctx.generator_class(
                assistant_model=drafter,
                main_model_input_embeddings=ctx.target.get_input_embeddings(),
                main_model_output_embeddings=ctx.target.get_output_embeddings(),
                generation_config=ctx.generation_config,
                logits_processor=ctx.processors,
            )
            _noise_block_per_row(generator, input_ids.shape[0])
            return first_round_after_prefill(generator, input_ids, _batch_1_attention_mask(model_kwargs), outputs)

        return FunctionSession(draft)
