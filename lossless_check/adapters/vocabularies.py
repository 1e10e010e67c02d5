"""Two tokenizers with different vocabularies, and a drafter stub that speaks the assistant's one.

For the generators that translate between tokenizers (``UniversalSpeculativeDecodingGenerator``,
``AssistedCandidateGeneratorDifferentTokenizers``). Both tokenizers are word-level, built in memory
with the ``tokenizers`` library: every target token is one word, so text round-trips exactly. The
assistant's vocabulary holds every target word under a different id, plus words the target does
not know, so the generator must really map ids and drop the assistant-only words.

The drafter table is re-expressed over the assistant's ids (columns, and rows of a Markov table,
moved to where each word lives there); assistant-only words get finite logits, so a generator
that fails to exclude them would draft them.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import NotApplicable
from ..stubs import DENSE_WEIGHTS_MAX_VOCAB, FixedLogitsLM, fixed_logits_lm
from ..tables import FixedLogits

#: Words the assistant knows and the target does not.
ASSISTANT_ONLY_WORDS = ("zz0", "zz1")


def target_words(vocab_size: int) -> list[str]:
    """Word ``i`` is target token ``i``."""
    return [f"w{i}" for i in range(vocab_size)]


def assistant_words(vocab_size: int) -> list[str]:
    """Word ``i`` is assistant token ``i``: the target's words reversed, assistant-only words interleaved."""
    words = target_words(vocab_size)[::-1]
    words.insert(1, ASSISTANT_ONLY_WORDS[0])
    words.insert(len(words) // 2, ASSISTANT_ONLY_WORDS[1])
    return words


def word_level_tokenizer(words: list[str]):
    """A ``PreTrainedTokenizerFast`` whose token ``i`` is ``words[i]`` (whitespace-separated words).

    ``get_vocab()`` of a fast tokenizer iterates in the order of a Rust hash map, which changes from
    call to call; code that depends on that order (the vocabulary translator does) would make runs
    irreproducible. This tokenizer returns its vocabulary in alphabetical order of the words: one
    fixed order, as a tokenizer backed by a sorted ``vocab.json`` would give, and not the id order.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    class AlphabeticalVocabTokenizer(PreTrainedTokenizerFast):
        def get_vocab(self) -> dict[str, int]:
            return dict(sorted(super().get_vocab().items()))

    # A word outside the vocabulary (an assistant-only word, given to the target's tokenizer) reads as
    # word 0: a real tokenizer encodes any text (byte fallback) rather than fail.
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    # With no decoder set, decoding joins the words with single spaces: text round-trips exactly.
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return AlphabeticalVocabTokenizer(tokenizer_object=backend)


#: How a scenario's tokenizers give their vocabulary (``Scenario.tokenizers``).
TOKENIZER_KINDS = ("stub", "fast", "id-ordered")


def _word_level_backend(words: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers

    # A word outside the vocabulary reads as word 0 (see word_level_tokenizer).
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return backend


def fast_word_level_tokenizer(words: list[str]):
    """A plain ``PreTrainedTokenizerFast`` over a ``tokenizers`` WordLevel model, nothing overridden.

    Its ``get_vocab()`` iterates in the order of the library's Rust hash map: measured with
    tokenizers 0.23.3, the order differs between processes and between two calls on the same object
    (the map is rebuilt with fresh random hash keys), so it is not a function of ``--seed``. Code that
    reads it once (the vocabulary translator, which ``generate()`` caches) sees one random order.
    """
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=_word_level_backend(words))


def id_ordered_tokenizer(words: list[str]):
    """The control of :func:`fast_word_level_tokenizer`: the same tokenizer, ``get_vocab()`` in id order."""
    from transformers import PreTrainedTokenizerFast

    class IdOrderedVocabTokenizer(PreTrainedTokenizerFast):
        def get_vocab(self) -> dict[str, int]:
            return dict(sorted(super().get_vocab().items(), key=lambda item: item[1]))

    return IdOrderedVocabTokenizer(tokenizer_object=_word_level_backend(words))


def tokenizer_pair(kind: str, vocab_size: int):
    """``(target_tokenizer, assistant_tokenizer)`` of a ``vocab_size``-token scenario whose tokenizers are ``kind``.

    ``stub``: :func:`word_level_tokenizer` (alphabetical ``get_vocab()``, deterministic); ``fast``:
    :func:`fast_word_level_tokenizer` (the library's hash order); ``id-ordered``: :func:`id_ordered_tokenizer`.
    """
    build = {"stub": word_level_tokenizer, "fast": fast_word_level_tokenizer, "id-ordered": id_ordered_tokenizer}
    if kind not in build:
        raise ValueError(f"tokenizers must be one of {', '.join(TOKENIZER_KINDS)}, got {kind!r}")
    return build[kind](target_words(vocab_size)), build[kind](assistant_words(vocab_size))


def vocabulary_order(translator) -> list[int] | None:
    """The assistant ids of the shared words in the order the translator's pruned head holds them
    (the order ``get_vocab()`` iterated when it was built); ``None`` when it pruned nothing."""
    ids = getattr(translator, "assistant_overlap_token_ids", None)
    return None if ids is None else ids.tolist()


def assistant_table(drafter: FixedLogits, words: list[str], only_word_logit: float = 0.0) -> FixedLogits:
    """``drafter`` (over target ids) re-expressed over the assistant ids of ``words``."""
    vocab = drafter.vocab_size
    target_id = {w: i for i, w in enumerate(target_words(vocab))}
    # Column j of the assistant table is the drafter column of the same word (assistant-only: a constant).
    columns = np.full((drafter.rows.shape[0], len(words)), only_word_logit)
    for assistant_id, word in enumerate(words):
        if word in target_id:
            columns[:, assistant_id] = drafter.rows[:, target_id[word]]
    if drafter.kind != "markov":
        return FixedLogits(drafter.kind, columns)
    # A Markov row is chosen by the previous token: index rows by the previous word's assistant id.
    rows = np.stack([columns[target_id.get(word, 0)] for word in words])
    return FixedLogits("markov", rows)


class EmbeddingRoutedLM(FixedLogitsLM):
    """A :class:`FixedLogitsLM` that reads its input through its input embedding and writes through its head.

    Tokens are recovered from the (one-hot) input embedding and logits go through the output
    embedding, as in a real model: when a translator swaps in a re-indexing embedding or a pruned
    head (``set_input_embeddings``/``set_output_embeddings``), the stub sees exactly what a real
    model would.
    """

    def forward(self, input_ids: torch.LongTensor | None = None, **kwargs):
        tokens = self.get_input_embeddings()(input_ids).max(dim=-1).indices  # not argmax (provenance)
        out = super().forward(tokens, **kwargs)
        out.logits = self.get_output_embeddings()(out.logits)
        return out


def assistant_lm(drafter: FixedLogits, prompt_length: int, vocab_size: int, **generation_defaults) -> EmbeddingRoutedLM:
    """The assistant stub over the assistant vocabulary of a ``vocab_size``-token target.

    Raises :class:`~lossless_check.errors.NotApplicable` above
    :data:`~lossless_check.stubs.DENSE_WEIGHTS_MAX_VOCAB`: the translator prunes the head's weight and
    swaps in a re-indexing embedding, which needs the dense ``V x V`` weights large stubs do without.
    """
    words = assistant_words(vocab_size)
    if len(words) > DENSE_WEIGHTS_MAX_VOCAB:
        raise NotApplicable(
            f"the two-vocabulary stubs hold dense V x V weights (the vocabulary translator prunes and re-indexes "
            f"them); vocabulary {len(words)} is above {DENSE_WEIGHTS_MAX_VOCAB}: use the iid32-fast-tokenizers scenario")
    table = assistant_table(drafter, words)
    plain = fixed_logits_lm(table, prompt_length=prompt_length, **generation_defaults)
    model = EmbeddingRoutedLM(plain.config).eval()
    model.generation_config = plain.generation_config
    return model
