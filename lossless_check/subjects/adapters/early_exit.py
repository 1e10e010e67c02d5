"""``EarlyExitCandidateGenerator``: the target drafts for itself by exiting after fewer layers.

The real generator takes the target model as its assistant and, while drafting, sets
``getattr(model, model.base_model_prefix).config.num_hidden_layers`` to ``assistant_early_exit``.
:class:`EarlyExitFixedLogitsLM` is one model with both tables: run at full depth it emits the
target table, run with fewer layers it emits the drafter table. It reads its depth from its base
model's config, as a real decoder does when it runs ``layers[: config.num_hidden_layers]``, so
the drafter table is used exactly while the generator has the depth lowered.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from lossless_check.laws.stubs import FixedLogitsLM, fixed_logits_lm
from lossless_check.subjects.adapters.base import DraftContext, FunctionSession, GeneratorAdapter, installed_release
from lossless_check.subjects.adapters.rounds import first_assisted_round

#: Depth of the stub "at full depth" and the layer the generator exits after.
FULL_DEPTH = 2
EXIT_LAYER = 1


class _Trunk(nn.Module):
    """The base model the generator looks up through ``base_model_prefix``; shares the model's config."""

    def __init__(self, config):
        super().__init__()
        self.config = config


class EarlyExitFixedLogitsLM(FixedLogitsLM):
    """A :class:`FixedLogitsLM` for the target table that switches to ``exit_head``'s table below full depth."""

    def __init__(self, config, exit_head: FixedLogitsLM):
        super().__init__(config)
        config.num_hidden_layers = FULL_DEPTH
        self.model = _Trunk(config)
        # The early-exit head is a second fixed-logits model: its table is the drafter table.
        self.exit_head = exit_head

    def table_logits(self, token_positions: torch.Tensor, previous_tokens: torch.Tensor) -> torch.Tensor:
        if self.model.config.num_hidden_layers < FULL_DEPTH:
            return self.exit_head.table_logits(token_positions, previous_tokens)
        return super().table_logits(token_positions, previous_tokens)


def early_exit_model_for(ctx: DraftContext) -> EarlyExitFixedLogitsLM:
    """The target as an early-exit model, drafting exactly ``gamma`` tokens per round."""
    prompt_length = len(ctx.scenario.prompt)
    exit_head = fixed_logits_lm(ctx.scenario.drafter, prompt_length=prompt_length)
    target = fixed_logits_lm(ctx.scenario.target, prompt_length=prompt_length)
    model = EarlyExitFixedLogitsLM(target.config, exit_head).eval()
    model.generation_config = target.generation_config
    # The generator reads the draft length from the model's own generation config; a fixed length
    # without confidence-based early stop keeps the acceptance law exact.
    model.generation_config.num_assistant_tokens = ctx.scenario.gamma
    model.generation_config.num_assistant_tokens_schedule = "constant"
    model.generation_config.assistant_confidence_threshold = 0.0
    return model


class EarlyExitAdapter(GeneratorAdapter):
    name = "EarlyExitCandidateGenerator"
    #: 5.0-5.2: the generator cannot run at all (its ``get_candidates`` calls its base's without the
    #: ``is_first_iteration`` the base requires there), so nothing about batching is verified.
    batchable = installed_release() >= (5, 3)
    drafts_stop_at_eos = True

    def session(self, ctx: DraftContext) -> FunctionSession:
        model = early_exit_model_for(ctx)
        # generate() builds this generator when the config sets assistant_early_exit.
        generation_config = copy.deepcopy(ctx.generation_config)
        generation_config.assistant_early_exit = EXIT_LAYER

        def draft(input_ids):
            # As for AssistedCandidateGenerator: a fresh generator per call (its first drafting
            # round), around the one model built for the session. The generator lowers the model's
            # depth only while it drafts and restores it before returning (not when it raises: a
            # failed call must not leave the next one drafting from a lowered depth).
            model.model.config.num_hidden_layers = FULL_DEPTH
            return first_assisted_round(ctx.generator_class, input_ids, generation_config, ctx.processors,
                                        assistant_model=model)

        return FunctionSession(draft)
