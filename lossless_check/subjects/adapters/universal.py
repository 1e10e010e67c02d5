"""``UniversalSpeculativeDecodingGenerator``: a drafter with its own tokenizer and vocabulary.

Built as ``generate()`` builds it for ``do_sample=True`` with two tokenizers: the real
``AssistantVocabTranslatorCache.get_translator`` (which prunes the assistant's LM head to the
shared words and re-indexes its input embedding), then the generator around the translator. The
assistant stub routes its tokens through its embedding and its logits through its head, so the
pruning and re-indexing act on it for real (see :mod:`.vocabularies`).
"""

from __future__ import annotations

from lossless_check.core.compat import vocab_translator
from lossless_check.subjects.adapters.base import constant_drafts
from lossless_check.subjects.adapters.base import DraftContext, FunctionSession, GeneratorAdapter
from lossless_check.subjects.adapters.rounds import first_assisted_round
from lossless_check.subjects.adapters.vocabularies import assistant_lm, tokenizer_pair, vocabulary_order


class UniversalAdapter(GeneratorAdapter):
    name = "UniversalSpeculativeDecodingGenerator"
    padded_drafter = True
    #: Not batchable: the real code reads one sequence only (5.24 ``candidate_generator.py``:
    #: ``_prepare_assistant_input_ids`` decodes ``input_ids`` as one text, the pruned assistant's
    #: ``_MapInputEmbedding`` maps ``input_ids[0, -1]``, ``get_target_ids`` maps
    #: ``assistant_candidate_ids[0, ...]`` and appends it as one row).
    batchable = False
    drafts_stop_at_eos = True
    #: The assistant ids of the shared words in the order the last translator built in this process
    #: holds them (:func:`.vocabularies.vocabulary_order`).
    last_vocabulary_order: list[int] | None = None

    def session(self, ctx: DraftContext) -> FunctionSession:
        vocab = ctx.scenario.vocab_size
        target_tokenizer, assistant_tokenizer = tokenizer_pair(ctx.scenario.tokenizers, vocab)
        assistant = assistant_lm(
            ctx.scenario.drafter,
            prompt_length=len(ctx.scenario.prompt),
            vocab_size=vocab,
            tokenizers=ctx.scenario.tokenizers,
            **constant_drafts(ctx.scenario.gamma),
        )
        translator = vocab_translator(target_tokenizer, assistant_tokenizer, ctx.target.config.vocab_size, assistant)
        # With fast tokenizers the order the translator saw is the library's (random per process):
        # reported with the case (the session's facts), so a run says which order its numbers come from.
        order = vocabulary_order(translator)
        UniversalAdapter.last_vocabulary_order = order

        def draft(input_ids):
            # A fresh generator per trial: each trial is the first drafting round after the prompt.
            # The translator (and the pruned assistant) are shared, as generate() caches them.
            return first_assisted_round(ctx.generator_class, input_ids, ctx.generation_config, ctx.processors,
                                        assistant_model=assistant, target_tokenizer=target_tokenizer,
                                        assistant_tokenizer=assistant_tokenizer, atm_translator=translator)

        return FunctionSession(draft, {"vocabulary_order": order})
