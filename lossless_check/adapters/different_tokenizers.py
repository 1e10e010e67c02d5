"""``AssistedCandidateGeneratorDifferentTokenizers``: greedy drafting across two tokenizers.

``generate()`` builds this generator for an assistant with its own tokenizer when
``do_sample=False`` (with ``do_sample=True`` it builds ``UniversalSpeculativeDecodingGenerator``).
Its ``get_candidates`` re-tokenizes the assistant's text into target tokens and returns no
``candidate_logits``: there is no ``q`` for ``_speculative_sampling``, so step mode reports the
case as an error and the generator is for generate mode to check (the target then samples every
position itself and keeps the drafts that match).
"""

from __future__ import annotations

import copy

from .assisted import constant_drafts
from .base import DraftContext, FunctionSession, GeneratorAdapter
from .rounds import rounds_of
from .vocabularies import assistant_lm, assistant_words, target_words, word_level_tokenizer


class DifferentTokenizersAdapter(GeneratorAdapter):
    name = "AssistedCandidateGeneratorDifferentTokenizers"

    def session(self, ctx: DraftContext) -> FunctionSession:
        vocab = ctx.scenario.vocab_size
        generation_config = copy.deepcopy(ctx.generation_config)
        generation_config.do_sample = False  # the only setting for which generate() builds this class
        generator = ctx.generator_class(
            input_ids=ctx.prompt_ids,
            assistant_model=assistant_lm(
                ctx.scenario.drafter,
                prompt_length=len(ctx.scenario.prompt),
                vocab_size=vocab,
                **constant_drafts(ctx.scenario.gamma),
            ),
            target_tokenizer=word_level_tokenizer(target_words(vocab)),
            assistant_tokenizer=word_level_tokenizer(assistant_words(vocab)),
            generation_config=generation_config,
            model_kwargs={"use_cache": True},
            inputs_tensor=ctx.prompt_ids,
            logits_processor=ctx.processors,
        )
        return FunctionSession(rounds_of(generator))
