"""``PromptLookupCandidateGenerator``: drafts copied from earlier n-grams of the sequence itself.

Built with the arguments ``generate()`` passes for ``prompt_lookup_num_tokens``. The generator
has no model and returns no ``candidate_logits`` (a copied draft has no ``q``), so step mode
reports the case as an error; the generator is for generate mode to check, where the target
samples every position itself and keeps the drafts that match.
"""

from __future__ import annotations

from .base import DraftContext, FunctionSession, GeneratorAdapter
from .rounds import rounds_of

#: ``generate()``'s default when ``max_matching_ngram_size`` is unset.
MAX_MATCHING_NGRAM_SIZE = 2


class PromptLookupAdapter(GeneratorAdapter):
    name = "PromptLookupCandidateGenerator"

    def session(self, ctx: DraftContext) -> FunctionSession:
        config = ctx.generation_config
        generator = ctx.generator_class(
            eos_token_id=getattr(config, "_eos_token_tensor", None),
            num_output_tokens=ctx.scenario.gamma,
            max_matching_ngram_size=MAX_MATCHING_NGRAM_SIZE,
            max_length=config.max_length,
            logits_processor=ctx.processors,
            vocab_size=ctx.target.config.vocab_size,
        )
        return FunctionSession(rounds_of(generator))
