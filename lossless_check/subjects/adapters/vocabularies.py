"""Two tokenizers with different vocabularies, and a drafter stub that speaks the assistant's one.

For the generators that translate between tokenizers (``UniversalSpeculativeDecodingGenerator``,
``AssistedCandidateGeneratorDifferentTokenizers``). Two families, both built in memory with the
``tokenizers`` library, nothing downloaded:

- word-level (kinds ``stub``, ``fast``, ``id-ordered``): every target token is one word, so text
  round-trips exactly. The assistant's vocabulary holds every target word under a different id,
  plus words the target does not know, so the generator must really map ids and drop the
  assistant-only words;
- byte-level BPE (kinds ``bpe``, ``bpe-id-ordered``): two GPT-2-style tokenizers trained offline,
  deterministically, on two fixed corpora (:data:`BPE_TARGET_CORPUS`, :data:`BPE_ASSISTANT_CORPUS`).
  Different but overlapping vocabularies: both hold the 256 byte tokens, and some merges
  (``Ġthe``, ``Ġon``...) are shared, others are one side's only (``Ġcat``, ``Ġship``). The
  assistant's ``<|endoftext|>`` (a special token the target lacks) takes id 0, so every shared token
  has a different id on each side. Target tokens the assistant lacks are re-tokenized through text
  by the generators, into several assistant tokens.

The drafter table is re-expressed over the assistant's ids (columns, and rows of a Markov table,
moved to where each word lives there); assistant-only words get finite logits, so a generator
that fails to exclude them would draft them.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from transformers import PreTrainedTokenizerFast

from lossless_check.core.errors import NotApplicable, UsageError
from lossless_check.laws.scenarios import TOKENIZER_KINDS  # how a scenario's tokenizers give their vocabulary
from lossless_check.laws.stubs import DENSE_WEIGHTS_MAX_VOCAB, FixedLogitsLM, RowSelectHead, fixed_logits_lm
from lossless_check.laws.tables import FixedLogits

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

    class AlphabeticalVocabTokenizer(PreTrainedTokenizerFast):
        def get_vocab(self) -> dict[str, int]:
            return dict(sorted(super().get_vocab().items()))

    return AlphabeticalVocabTokenizer(tokenizer_object=_word_level_backend(words))


#: The byte-level BPE kinds: the target's vocabulary is the trained target tokenizer's.
BPE_KINDS = ("bpe", "bpe-id-ordered")


def _word_level_backend(words: list[str]):
    from tokenizers import Tokenizer, models, pre_tokenizers

    # A word outside the vocabulary (an assistant-only word, given to the target's tokenizer) reads as
    # word 0: a real tokenizer encodes any text (byte fallback) rather than fail.
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    # With no decoder set, decoding joins the words with single spaces: text round-trips exactly.
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return backend


def fast_word_level_tokenizer(words: list[str]):
    """A plain ``PreTrainedTokenizerFast`` over a ``tokenizers`` WordLevel model, nothing overridden.

    Its ``get_vocab()`` iterates in the order of the library's Rust hash map: measured with
    tokenizers 0.23.3, the order differs between processes and between two calls on the same object
    (the map is rebuilt with fresh random hash keys), so it is not a function of ``--seed``. Code that
    reads it once (the vocabulary translator, which ``generate()`` caches) sees one random order.
    """
    return PreTrainedTokenizerFast(tokenizer_object=_word_level_backend(words))


class IdOrderedVocabTokenizer(PreTrainedTokenizerFast):
    """A fast tokenizer whose ``get_vocab()`` iterates in id order: the control of the hash-ordered ones."""

    def get_vocab(self) -> dict[str, int]:
        return dict(sorted(super().get_vocab().items(), key=lambda item: item[1]))


def id_ordered_tokenizer(words: list[str]):
    """The control of :func:`fast_word_level_tokenizer`: the same tokenizer, ``get_vocab()`` in id order."""
    return IdOrderedVocabTokenizer(tokenizer_object=_word_level_backend(words))


# --- Byte-level BPE ------------------------------------------------------------------------------

#: The target's training corpus (cats and dogs) ...
BPE_TARGET_CORPUS = (
    "the cat sat on the mat and the dog sat on the rug",
    "a red cat ran under the blue table while the old dog slept",
    "the old cat and the young dog ran to the red door",
    "cats and dogs sit on mats and rugs in the house",
)
#: ... and the assistant's (ships and the sea): the merges they share are the common words.
BPE_ASSISTANT_CORPUS = (
    "ships sail on the sea and boats rest in the harbour",
    "the captain steered the ship through the storm at night",
    "sailors sang songs on the deck of the old ship",
    "the sea was calm and the boats drifted to the shore",
)
#: The assistant BPE tokenizer's vocabulary: ``<|endoftext|>``, the 256 bytes and 33 merges.
BPE_ASSISTANT_VOCAB = 290
#: The assistant's special token (id 0): the target has none, so it is assistant-only.
BPE_ASSISTANT_SPECIAL = "<|endoftext|>"
#: Byte tokens of the target BPE tokenizer: ids ``0 .. 255`` (no special token; merges follow).
BPE_BYTE_TOKENS = 256


@functools.cache
def _bpe_backend_json(corpus: tuple[str, ...], vocab_size: int, special: tuple[str, ...]) -> str:
    """A byte-level BPE trained on ``corpus`` up to ``vocab_size`` tokens, serialised.

    Training is deterministic (measured with tokenizers 0.23.3: the same vocabulary and merges in
    separate processes): ties between pair counts are broken by the pair itself, not by hash order.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, special_tokens=list(special),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(corpus, trainer)
    if backend.get_vocab_size() != vocab_size:
        raise UsageError(f"the BPE corpus yields {backend.get_vocab_size()} tokens, not {vocab_size}: "
                         f"a byte-level BPE scenario's vocabulary must be in [{BPE_BYTE_TOKENS + len(special)}, "
                         f"{backend.get_vocab_size()}]")
    return backend.to_str()


def _bpe_backends(vocab_size: int):
    """The (target, assistant) ``tokenizers.Tokenizer`` of a ``vocab_size``-token BPE scenario, fresh objects."""
    from tokenizers import Tokenizer

    target = _bpe_backend_json(BPE_TARGET_CORPUS, vocab_size, ())
    assistant = _bpe_backend_json(BPE_ASSISTANT_CORPUS, BPE_ASSISTANT_VOCAB, (BPE_ASSISTANT_SPECIAL,))
    return Tokenizer.from_str(target), Tokenizer.from_str(assistant)


def bpe_tokenizer_pair(vocab_size: int, id_ordered: bool = False):
    """``(target, assistant)``: plain ``PreTrainedTokenizerFast`` over the trained byte-level BPEs.

    Nothing overridden: ``get_vocab()`` iterates in the library's hash order, random per call and per
    process (see :func:`fast_word_level_tokenizer`). ``id_ordered``: the control, ``get_vocab()`` in
    id order (:class:`IdOrderedVocabTokenizer`).
    """
    cls = IdOrderedVocabTokenizer if id_ordered else PreTrainedTokenizerFast
    target, assistant = _bpe_backends(vocab_size)
    return cls(tokenizer_object=target), cls(tokenizer_object=assistant)


def bpe_words(vocab_size: int) -> tuple[list[str], list[str]]:
    """``(target_tokens, assistant_tokens)`` of the BPE pair: token ``i`` of each is its id-``i`` string."""
    def tokens(backend) -> list[str]:
        inverse = {i: t for t, i in backend.get_vocab(with_added_tokens=True).items()}
        return [inverse[i] for i in range(len(inverse))]

    target, assistant = _bpe_backends(vocab_size)
    return tokens(target), tokens(assistant)


def vocabulary_words(kind: str, vocab_size: int) -> tuple[list[str], list[str]]:
    """``(target_tokens, assistant_tokens)`` by id, of a ``vocab_size``-token scenario whose tokenizers are ``kind``."""
    if kind in BPE_KINDS:
        return bpe_words(vocab_size)
    return target_words(vocab_size), assistant_words(vocab_size)


def tokenizer_pair(kind: str, vocab_size: int):
    """``(target_tokenizer, assistant_tokenizer)`` of a ``vocab_size``-token scenario whose tokenizers are ``kind``.

    ``stub``: :func:`word_level_tokenizer` (alphabetical ``get_vocab()``, deterministic); ``fast``:
    :func:`fast_word_level_tokenizer` (the library's hash order); ``id-ordered``: :func:`id_ordered_tokenizer`;
    ``bpe`` / ``bpe-id-ordered``: :func:`bpe_tokenizer_pair` (the target's vocabulary must be ``vocab_size``).
    """
    if kind in BPE_KINDS:
        return bpe_tokenizer_pair(vocab_size, id_ordered=kind == "bpe-id-ordered")
    build = {"stub": word_level_tokenizer, "fast": fast_word_level_tokenizer, "id-ordered": id_ordered_tokenizer}
    if kind not in build:
        raise ValueError(f"tokenizers must be one of {', '.join(TOKENIZER_KINDS)}, got {kind!r}")
    return build[kind](target_words(vocab_size)), build[kind](assistant_words(vocab_size))


def vocabulary_order(translator) -> list[int] | None:
    """The assistant ids of the shared words in the order the translator's pruned head holds them
    (the order ``get_vocab()`` iterated when it was built); ``None`` when it pruned nothing."""
    ids = getattr(translator, "assistant_overlap_token_ids", None)
    return None if ids is None else ids.tolist()


def assistant_table(drafter: FixedLogits, words: list[str], only_word_logit: float = 0.0,
                    target: list[str] | None = None) -> FixedLogits:
    """``drafter`` (over target ids) re-expressed over the assistant ids of ``words``.

    ``target``: the target's tokens by id (default: the word-level :func:`target_words`). A token
    the target lacks gets the constant ``only_word_logit``.
    """
    vocab = drafter.vocab_size
    target_id = {w: i for i, w in enumerate(target if target is not None else target_words(vocab))}
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
    model would. The head is a :class:`~lossless_check.laws.stubs.RowSelectHead` (``V x R`` weights for
    a table of ``R`` rows) and the hidden state the one-hot of the table row, so the translator's
    real ``prune_linear_layer`` prunes a real ``nn.Linear`` at any vocabulary (a ``V x V`` identity
    head would need 9.7 GB at ``V = 49,152``).
    """

    def __init__(self, config):
        super().__init__(config)
        self.lm_head = RowSelectHead(self.table_rows)

    def table_logits(self, token_positions: torch.Tensor, previous_tokens: torch.Tensor) -> torch.Tensor:
        # The hidden state: which row the head projects to (the logits come out of the head).
        index = self.table_row_index(token_positions, previous_tokens)
        return RowSelectHead.selector(index, self.table_rows.shape[0], self.table_rows.dtype)

    def forward(self, input_ids: torch.LongTensor | None = None, **kwargs):
        tokens = self.get_input_embeddings()(input_ids).max(dim=-1).indices  # not argmax (provenance)
        out = super().forward(tokens, **kwargs)
        out.logits = self.get_output_embeddings()(out.logits)
        return out


def assistant_lm(drafter: FixedLogits, prompt_length: int, vocab_size: int, tokenizers: str = "stub",
                 **generation_defaults) -> EmbeddingRoutedLM:
    """The assistant stub over the assistant vocabulary of a ``vocab_size``-token target whose
    tokenizers are ``tokenizers`` (a :data:`TOKENIZER_KINDS`; the word-level kinds share one vocabulary).

    Its head holds one weight column per table row (:class:`EmbeddingRoutedLM`): a ``markov`` table
    past :data:`~lossless_check.laws.stubs.DENSE_WEIGHTS_MAX_VOCAB` (one row per token) is refused with
    :class:`~lossless_check.core.errors.NotApplicable`.
    """
    target, words = vocabulary_words(tokenizers, vocab_size)
    if drafter.kind == "markov" and len(words) > DENSE_WEIGHTS_MAX_VOCAB:
        raise NotApplicable(f"a markov drafter over {len(words)} words needs a {len(words)} x {len(words)} head; "
                            f"the two-vocabulary stubs take one up to {DENSE_WEIGHTS_MAX_VOCAB}")
    table = assistant_table(drafter, words, target=target)
    plain = fixed_logits_lm(table, prompt_length=prompt_length, **generation_defaults)
    model = EmbeddingRoutedLM(plain.config).eval()
    model.generation_config = plain.generation_config
    return model
