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

from lossless_check.subjects.adapters.base import constant_drafts
from lossless_check.subjects.adapters.base import DraftContext, FunctionSession, GeneratorAdapter
from lossless_check.subjects.adapters.rounds import first_assisted_round
from lossless_check.subjects.adapters.vocabularies import assistant_lm, tokenizer_pair


class DifferentTokenizersAdapter(GeneratorAdapter):
    name = "AssistedCandidateGeneratorDifferentTokenizers"
    padded_drafter = True
    #: Not batchable: ``get_candidates`` re-tokenizes through text, one sequence at a time (5.24
    #: ``candidate_generator.py``: ``convert_source_tokens_to_target_tokens`` decodes ``input_ids`` as
    #: one text, and ``_get_tokens_diag`` compares ``prompt == prompt_plus_new_tokens.T``): a batch
    #: of rows fails or is read as one sequence.
    batchable = False
    drafts_stop_at_eos = True

    def session(self, ctx: DraftContext) -> FunctionSession:
        vocab = ctx.scenario.vocab_size
        generation_config = copy.deepcopy(ctx.generation_config)
        generation_config.do_sample = False  # the only setting for which generate() builds this class
        assistant = assistant_lm(
            ctx.scenario.drafter,
            prompt_length=len(ctx.scenario.prompt),
            vocab_size=vocab,
            tokenizers=ctx.scenario.tokenizers,
            **constant_drafts(ctx.scenario.gamma),
        )
        target_tokenizer, assistant_tokenizer = tokenizer_pair(ctx.scenario.tokenizers, vocab)

        def draft(input_ids):
            # A fresh generator per call (its first drafting round) around the session's models
            # and tokenizers.
            return first_assisted_round(ctx.generator_class, input_ids, generation_config, ctx.processors,
                                        assistant_model=assistant, target_tokenizer=target_tokenizer,
                                        assistant_tokenizer=assistant_tokenizer)

        return FunctionSession(draft)
