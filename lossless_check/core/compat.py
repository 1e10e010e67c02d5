"""The few places where transformers releases differ in what the harness calls."""

from __future__ import annotations

import inspect
from functools import lru_cache

#: How a case of a generator the installed release does not have says so (``f"{name} {ABSENT}"``): not
#: applicable there, which is neither a pass nor a failure.
ABSENT = "is not in the installed transformers"


@lru_cache(maxsize=None)
def speculative_sampling():
    """The installed ``_speculative_sampling`` as ``f(candidate_ids, candidate_logits, gamma, new_logits, is_done)``.

    Releases up to 5.17 take whether the candidate already hit a stopping criterion
    (``is_done_candidate``; ``last_assistant_token_is_eos`` up to 4.38); later ones crop after the
    call instead. Releases up to 4.38 also take ``max_matches``, the drafts the length limit lets the
    round accept: all of them here (a step round never meets ``max_length``). ``extra`` keywords go
    through unchanged (e.g. ``assistant_ensemble_weight`` where :func:`verifier_parameters` has it).
    """
    _speculative_sampling = installed_verifier()
    parameters = inspect.signature(_speculative_sampling).parameters
    done_name = next((n for n in ("is_done_candidate", "last_assistant_token_is_eos") if n in parameters), None)

    def call(candidate_ids, candidate_logits, gamma, new_logits, is_done=False, **extra):
        kwargs = {done_name: is_done} if done_name else {}
        if "max_matches" in parameters:
            kwargs["max_matches"] = gamma
        return _speculative_sampling(candidate_ids, candidate_logits, gamma, new_logits, **kwargs, **extra)

    return call


@lru_cache(maxsize=None)
def installed_verifier():
    """The installed ``transformers.generation.utils._speculative_sampling`` (as first imported: the
    function :func:`speculative_sampling` calls)."""
    from transformers.generation.utils import _speculative_sampling

    return _speculative_sampling


def vocab_translator(target_tokenizer, assistant_tokenizer, vocab_size: int, assistant_model):
    """``AssistantVocabTranslatorCache.get_translator`` called as the installed ``generate()`` calls it.

    From 4.52 it takes the assistant and prunes its LM head to the shared words (and ``generate()``
    then drops the assistant's repetition penalty, whose logits are no longer indexed by token id);
    4.50-4.51 take the assistant's device only and prune nothing.
    """
    from transformers.generation.candidate_generator import AssistantVocabTranslatorCache

    if "assistant_model" not in inspect.signature(AssistantVocabTranslatorCache.get_translator).parameters:
        return AssistantVocabTranslatorCache.get_translator(target_tokenizer, assistant_tokenizer, vocab_size,
                                                            assistant_model.device)
    translator = AssistantVocabTranslatorCache.get_translator(
        target_tokenizer, assistant_tokenizer, vocab_size, assistant_model=assistant_model, assistant_prune_lm_head=True)
    assistant_model.generation_config.repetition_penalty = None
    return translator


def verifier_parameters() -> frozenset[str]:
    """The parameter names of the installed ``_speculative_sampling``."""
    from transformers.generation.utils import _speculative_sampling

    return frozenset(inspect.signature(_speculative_sampling).parameters)


def versions() -> dict[str, str]:
    import torch
    import transformers

    return {"transformers_version": transformers.__version__, "torch_version": torch.__version__}


def generator_processors(processors):
    """The ``logits_processor`` ``generate()`` hands the candidate generator, given the list the
    sampling loop applies.

    From the release that builds the generator inside ``_assisted_decoding`` that is the prepared
    list itself. Before, ``generate()`` built it with its own ``logits_processor`` argument (the user's
    custom processors: none here), and the assistant's ``generate()`` rebuilt the processors and
    warpers from its copy of the generation config.
    """
    return processors if _builds_generator_in_assisted_decoding() else type(processors)()


@lru_cache(maxsize=None)
def _builds_generator_in_assisted_decoding() -> bool:
    from transformers.generation.utils import GenerationMixin

    loop = getattr(GenerationMixin, "_assisted_decoding", None) or GenerationMixin.assisted_decoding
    return "_get_candidate_generator" in inspect.getsource(loop)


def release_warpers(warpers: dict) -> dict:
    """``warpers`` in the form the installed ``GenerationConfig`` takes.

    ``sequence_bias`` is written as ``[[tokens, bias], ...]`` (JSON's form); releases before 4.45
    take only ``{tuple(tokens): bias}``.
    """
    bias = warpers.get("sequence_bias")
    if bias is None or isinstance(bias, dict) or _takes_listed_sequence_bias():
        return warpers
    return {**warpers, "sequence_bias": {tuple(tokens): value for tokens, value in bias}}


@lru_cache(maxsize=None)
def _takes_listed_sequence_bias() -> bool:
    from transformers.generation.logits_process import SequenceBiasLogitsProcessor

    return hasattr(SequenceBiasLogitsProcessor, "_convert_list_arguments_into_dict")


def loop_eos(generation_config, vocab_size: int) -> None:
    """Give ``generation_config`` an EOS token that is never drawn (id ``vocab_size``, past the
    vocabulary) when it has none and the installed loop cannot run without one.

    4.x releases read the EOS unconditionally: 4.37-4.38's ``assisted_decoding`` tiles
    ``eos_token_id_tensor`` (``AttributeError`` on ``None``), and ``PromptLookupCandidateGenerator``
    calls ``torch.isin(chosen_ids, self.eos_token_id)`` through 4.57 (``TypeError``). A token outside the
    vocabulary has probability 0 under every law, so the output law is that of no EOS at all.
    """
    import transformers

    if generation_config.eos_token_id is None and int(transformers.__version__.split(".")[0]) < 5:
        generation_config.eos_token_id = vocab_size
