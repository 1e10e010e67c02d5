"""``AssistedCandidateGenerator``: the assistant is a fixed-logits ``FixedLogitsLM``."""

from __future__ import annotations

from ..stubs import fixed_logits_lm
from .base import DraftContext, FunctionSession, GeneratorAdapter
from .rounds import rounds_of


def constant_drafts(gamma: int) -> dict:
    """Assistant generation defaults for exactly ``gamma`` drafts per round.

    No confidence-based early stop and no adaptive schedule: a fixed draft length keeps the
    acceptance law exact and the rounds independent.
    """
    return {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0}


def assistant_for(ctx: DraftContext):
    """A fixed-logits assistant drafting exactly ``gamma`` tokens per round."""
    return fixed_logits_lm(ctx.scenario.drafter, prompt_length=len(ctx.scenario.prompt),
                           **constant_drafts(ctx.scenario.gamma))


class AssistedAdapter(GeneratorAdapter):
    name = "AssistedCandidateGenerator"

    def session(self, ctx: DraftContext) -> FunctionSession:
        generator = ctx.generator_class(
            input_ids=ctx.prompt_ids,
            assistant_model=assistant_for(ctx),
            generation_config=ctx.generation_config,
            model_kwargs={"use_cache": True},
            inputs_tensor=ctx.prompt_ids,
            logits_processor=ctx.processors,
        )
        # One generator serves every trial: each call crops the assistant's cache back to the
        # prompt, as a new round after a rejection does.
        return FunctionSession(rounds_of(generator))
