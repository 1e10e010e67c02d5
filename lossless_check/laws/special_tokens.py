"""The special tokens of the fixed-logits stubs: what makes their configs look like a checkpoint's.

Every checkpoint has an EOS token, and code that runs a model's own ``generate()`` relies on it
(prompt lookup, EOS stopping criteria). The stubs' EOS (and BOS) is :func:`never_emitted_eos`, one
token past their tables, so it has probability 0 under every law they emit: the exact laws of plain
sampling are those without an EOS. They have no pad token, as GPT-2's and Llama's checkpoints:
``generate()`` pads with the EOS. What ``transformers`` logs about those choices (an id past the
vocabulary, no pad token, no attention mask) is true by design and dropped, for the stubs only.
"""

from __future__ import annotations

from contextlib import contextmanager


def never_emitted_eos(vocab_size: int) -> int:
    """The EOS (and BOS) token id of a stub over ``vocab_size`` tokens: ``vocab_size`` itself.

    Past the vocabulary, so it has probability 0 under every law a stub emits (its logits have
    ``vocab_size`` columns) and never ends a generation: the exact laws of plain sampling need no
    EOS term. A case that wants an EOS names one (``eos_token_id`` among its warpers), which
    overrides it in ``generate()`` as a user's does. BOS = EOS as in GPT-2's checkpoints: only a
    ``generate()`` call without a prompt would read it.
    """
    return vocab_size


@contextmanager
def _dropped(logger_name: str, dropped):
    """While active, records of transformers' logger ``logger_name`` whose message ``dropped(message)``
    holds are not logged (a filter on that logger only)."""
    from transformers.utils import logging as hf_logging

    def keep(record) -> bool:
        return not dropped(record.getMessage())

    logger = hf_logging.get_logger(logger_name)
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def own_token_ids_unwarned(vocab_size: int):
    """Drop 5.x's warning that a config's BOS/EOS id lies past its vocabulary, for the stubs' own
    :func:`never_emitted_eos` only (past the vocabulary by design; any other id still warns).

    The warning is logged once per message (``warning_once``): dropped here, the same message is not
    logged later either (when ``save_pretrained`` validates the config again)."""
    own = f"(between 0 and {vocab_size - 1}), got {never_emitted_eos(vocab_size)}."
    return _dropped("transformers.configuration_utils", lambda message: message.startswith(
        ("Model config: bos_token_id", "Model config: eos_token_id")) and own in message)


#: What ``generate()`` says of a model with an EOS and no pad token when no attention mask is passed
#: (at every call up to 5.1x; for batched input from 5.20): true of the stubs by design, and moot
#: (they read their history from the cache, never from an attention mask).
_PAD_NOTICES = ("Setting `pad_token_id` to `eos_token_id`", "The attention mask and the pad token id were not set",
                "The attention mask is not set")


def pad_notices_unlogged():
    """While active, ``generate()``'s notices of :data:`_PAD_NOTICES` are not logged."""
    return _dropped("transformers.generation.utils", lambda message: message.startswith(_PAD_NOTICES))


#: ``max_position_embeddings`` of the stubs: far past any case's length (``generate()`` only warns past it).
MAX_POSITION_EMBEDDINGS = 4096


__all__ = ["MAX_POSITION_EMBEDDINGS", "never_emitted_eos", "own_token_ids_unwarned", "pad_notices_unlogged"]
