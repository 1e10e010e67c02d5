"""``PromptLookupCandidateGenerator``: drafts copied from earlier n-grams of the sequence itself.

Built with the arguments ``generate()`` passes for ``prompt_lookup_num_tokens``. The generator
has no model and returns no ``candidate_logits`` (a copied draft has no ``q``), so step mode
reports the case as an error; the generator is for generate mode to check, where the target
samples every position itself and keeps the drafts that match.
"""

from __future__ import annotations

from lossless_check.subjects.adapters.base import DraftContext, FunctionSession, GeneratorAdapter
from lossless_check.subjects.adapters.rounds import construct, first_round

#: ``generate()``'s default when ``max_matching_ngram_size`` is unset.
MAX_MATCHING_NGRAM_SIZE = 2


class PromptLookupAdapter(GeneratorAdapter):
    name = "PromptLookupCandidateGenerator"
    padded_drafter = True
    #: Not batchable: the n-gram lookup reads row 0 only and appends its continuation as one row
    #: (5.24 ``candidate_generator.py``: ``ngram_tensor = input_ids[0, -ngram_size:]``,
    #: ``torch.cat((input_ids, chosen_ids.unsqueeze(0)), dim=1)``).
    batchable = False

    def session(self, ctx: DraftContext) -> FunctionSession:
        config = ctx.generation_config

        def draft(input_ids):
            # A fresh generator per call, as generate() builds one (it holds no model).
            generator = construct(
                ctx.generator_class,
                eos_token_id=getattr(config, "_eos_token_tensor", None),
                num_output_tokens=ctx.scenario.gamma,
                max_matching_ngram_size=MAX_MATCHING_NGRAM_SIZE,
                max_length=config.max_length,
                logits_processor=ctx.processors,
                vocab_size=ctx.target.config.vocab_size,
            )
            return first_round(generator, input_ids)

        return FunctionSession(draft)
