"""``AssistedCandidateGenerator``: the assistant is a fixed-logits ``FixedLogitsLM``."""

from __future__ import annotations

from lossless_check.subjects.adapters.base import DraftContext, FunctionSession, GeneratorAdapter
from lossless_check.subjects.adapters.rounds import first_assisted_round


class AssistedAdapter(GeneratorAdapter):
    name = "AssistedCandidateGenerator"
    padded_drafter = True
    batchable = True
    drafts_stop_at_eos = True

    def session(self, ctx: DraftContext) -> FunctionSession:
        assistant = ctx.assistant()

        def draft(input_ids):
            # A fresh generator per call, as _assisted_decoding builds one per generate(): each call
            # is its first drafting round (the assistant prefills the prompt, no cache yet). Only the
            # assistant model is shared: it holds no state between calls (its cache lives in the
            # generator). Reusing one generator with the same prompt again and again is a sequence
            # of calls _assisted_decoding never makes.
            return first_assisted_round(ctx.generator_class, input_ids, ctx.generation_config, ctx.processors,
                                        assistant_model=assistant)

        return FunctionSession(draft)
