"""``AssistedCandidateGenerator``: the assistant is a fixed-logits ``FixedLogitsLM``."""

from __future__ import annotations

from ..stubs import fixed_logits_lm
from .base import DraftContext, FunctionSession, GeneratorAdapter
from .rounds import first_assisted_round


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
    padded_drafter = True
    batchable = True
    drafts_stop_at_eos = True

    def session(self, ctx: DraftContext) -> FunctionSession:
        assistant = assistant_for(ctx)

        def draft(input_ids):
            # A fresh generator per call, as _assisted_decoding builds one per generate(): each call
            # is its first drafting round (the assistant prefills the prompt, no cache yet). Only the
            # assistant model is shared: it holds no state between calls (its cache lives in the
            # generator). Reusing one generator with the same prompt again and again is a sequence
            # of calls _assisted_decoding never makes.
            return first_assisted_round(ctx.generator_class, input_ids, ctx.generation_config, ctx.processors,
                                        assistant_model=assistant)

        return FunctionSession(draft)
