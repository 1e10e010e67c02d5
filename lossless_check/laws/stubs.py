"""Fixed-logits stand-ins for the target and drafter models.

``FixedLogitsLM`` is a real ``PreTrainedModel`` + ``GenerationMixin``: ``generate()``, the assisted
decoding loop and every candidate generator that calls the assistant's ``generate()`` run unmodified
on it. Its next-token logits come from a :class:`~lossless_check.laws.tables.FixedLogits` table, so the
exact distribution at every position is known. It keeps a real ``DynamicCache`` (one layer holding
the input token ids as "keys"), so cache cropping after a rejection happens for real: a model that
reads its history from the cache gives wrong logits when a crop is wrong.

The stubs look like checkpoints: their config and generation config carry what a saved model's do
and ``generate()`` reads (special token ids, ``max_position_embeddings``), so code that runs a stub's
own ``generate()`` (prompt lookup, EOS stopping criteria, ``output_scores``) runs as on a real model.
Their EOS token (:func:`~.special_tokens.never_emitted_eos`) is one no table ever emits: it stops nothing, and the law
of plain sampling is the same as with no EOS at all.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from lossless_check.laws.special_tokens import (
    MAX_POSITION_EMBEDDINGS,
    never_emitted_eos,
    own_token_ids_unwarned,
    pad_notices_unlogged,
)
from lossless_check.laws.tables import FixedLogits


def _cache_name(output_class) -> str:
    """The field an output class holds its cache in: ``cache`` from 5.24 on, ``past_key_values``
    before (the old name still works on 5.24 but logs a deprecation warning)."""
    import dataclasses

    return "cache" if "cache" in {f.name for f in dataclasses.fields(output_class)} else "past_key_values"


def cache_output(output_class, cache) -> dict:
    """``{field: cache}`` under the name ``output_class`` gives its cache."""
    return {_cache_name(output_class): cache}


def output_cache(output):
    """The cache an output holds, under its class's name for it."""
    return getattr(output, _cache_name(type(output)))


class FixedLogitsConfig(PretrainedConfig):
    """The config of a fixed-logits model: its table, plus what a checkpoint's config says.

    Special tokens as a decoder checkpoint without a pad token (GPT-2, Llama): ``bos_token_id =
    eos_token_id =`` :func:`~.special_tokens.never_emitted_eos`, ``pad_token_id = None`` (``generate()`` then pads
    with the EOS, and a case's own EOS pads a finished row with a token the stubs can read).
    """

    model_type = "lossless_check_fixed_logits"

    def __init__(
        self,
        vocab_size: int = 8,
        table_kind: str = "iid",
        table_rows: list | None = None,
        prompt_length: int = 1,
        table_dtype: str = "float32",
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.table_kind = table_kind
        self.table_rows = table_rows if table_rows is not None else [[0.0] * vocab_size]
        self.prompt_length = prompt_length
        # The dtype the model emits its logits in (``PretrainedConfig`` owns ``dtype``: another name).
        self.table_dtype = table_dtype
        # Shape facts that generate() and the cache classes read.
        self.hidden_size = vocab_size
        self.num_hidden_layers = 1
        self.num_attention_heads = 1
        self.num_key_value_heads = 1
        self.head_dim = 1
        self.max_position_embeddings = kwargs.pop("max_position_embeddings", MAX_POSITION_EMBEDDINGS)
        kwargs.setdefault("tie_word_embeddings", False)
        kwargs.setdefault("eos_token_id", never_emitted_eos(vocab_size))
        kwargs.setdefault("bos_token_id", kwargs["eos_token_id"])
        kwargs.setdefault("pad_token_id", None)
        with own_token_ids_unwarned(vocab_size):
            super().__init__(**kwargs)

    @property
    def table(self) -> FixedLogits:
        return FixedLogits(self.table_kind, np.asarray(self.table_rows, dtype=np.float64), self.table_dtype)

    @classmethod
    def for_table(cls, table: FixedLogits, prompt_length: int, **kwargs) -> "FixedLogitsConfig":
        """The config of a stub emitting ``table`` (its rows, kind and dtype)."""
        # The rows stay a (read-only) array: ``generate()`` deep-copies the config (``to_dict``, from
        # ``GenerationConfig.from_model_config``), and a list of lm49k's 3.1M Python floats took 14 s
        # a copy (an array: a memcpy).
        return cls(vocab_size=table.vocab_size, table_kind=table.kind, table_rows=table.rows,
                   prompt_length=prompt_length, table_dtype=table.dtype, **kwargs)


class IdentityHead(nn.Linear):
    """An output projection with identity weights that passes its input through exactly.

    A matrix product would turn a ``-inf`` logit into NaN (``-inf * 0``); generators only need a
    ``Linear`` with a ``.weight`` to project (or prune) through.
    """

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden


#: Largest vocabulary whose stubs hold their identity head and one-hot embedding as dense ``V x V``
#: weights (a real ``nn.Linear``/``nn.Embedding``, which pruning and re-indexing act on). Past it the
#: same maps are computed without weights (``V = 32000`` would need 4 GB per matrix).
DENSE_WEIGHTS_MAX_VOCAB = 4096


class WeightlessIdentityHead(nn.Module):
    """:class:`IdentityHead` of a large vocabulary: passes its input through, holds no ``V x V`` weight."""

    def __init__(self, vocab_size: int, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.in_features = self.out_features = vocab_size
        # Generators read the head's weight for its device and dtype only: an empty one says them.
        self.weight = nn.Parameter(torch.zeros(0, dtype=dtype), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden


class OneHotEmbedding(nn.Module):
    """The identity embedding of a large vocabulary (token ``t`` -> one-hot row ``t``), computed on the fly."""

    def __init__(self, vocab_size: int, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.num_embeddings = self.embedding_dim = vocab_size
        self.weight = nn.Parameter(torch.zeros(0, dtype=dtype), requires_grad=False)  # device and dtype only

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Written in the weight's dtype directly: one_hot's int64 rows, then a copy, took 2 of DFlash's
        # 21 ms per trial on lm49k (a noise block of 512 rows x 4 tokens x 49,152).
        out = torch.zeros(*input_ids.shape, self.num_embeddings, dtype=self.weight.dtype)
        return out.scatter_(-1, input_ids[..., None], 1)


class RowSelectHead(nn.Linear):
    """A real output projection that maps a one-hot *row selector* to that row of a logits table.

    ``weight`` is the table transposed (``V x R`` for ``R`` rows), so a hidden state that is the
    one-hot of row ``i`` projects to row ``i`` exactly: each logit is ``1 * x`` plus zeros (in any of
    :data:`~lossless_check.laws.tables.LOGITS_DTYPES`, as products with 0 and sums of signed zeros are
    exact; a one-hot input is answered by a gather of the same values). It is an ``nn.Linear``
    with a real weight, so code that prunes or re-indexes a head
    (``prune_linear_layer``, the vocabulary translator) acts on it as on a model's, at ``V x R`` floats
    instead of a ``V x V`` identity. ``-inf`` logits are stored as the dtype's lowest finite value
    (``0 * -inf`` would be NaN): the softmax gives both exactly 0.
    """

    def __init__(self, rows: torch.Tensor):
        super().__init__(rows.shape[0], rows.shape[1], bias=False, dtype=rows.dtype)
        with torch.no_grad():
            self.weight.copy_(torch.nan_to_num(rows.T, neginf=torch.finfo(rows.dtype).min))
        self.weight.requires_grad_(False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # A one-hot selector (what the stubs emit) is answered by a gather, bitwise what the matrix
        # product gives: the product of 512 MTP rows with a 49,152 x 126 weight took 1 s a layer.
        # Anything else (never emitted by the stubs) gets the product.
        index = hidden.max(dim=-1).indices  # not argmax: provenance reads argmax as a draft rule
        if torch.equal(hidden, self.selector(index, self.in_features, hidden.dtype)):
            return self.weight.T[index]
        return super().forward(hidden)

    @staticmethod
    def selector(index: torch.Tensor, rows: int, dtype: torch.dtype) -> torch.Tensor:
        """The hidden state that selects row ``index`` (one-hot, ``rows`` wide)."""
        return torch.nn.functional.one_hot(index, rows).to(dtype)


def _mixin_prepares_inputs() -> bool:
    """Whether the installed ``GenerationMixin`` has a generic ``prepare_inputs_for_generation``
    (4.45 on); before it, every model wrote its own, and ``can_generate()`` was False without one."""
    import inspect

    return "NotImplementedError" not in inspect.getsource(GenerationMixin.prepare_inputs_for_generation)


#: Releases before 4.45: models kept the legacy tuple cache unless handed a ``Cache``, and each model
#: prepared its own inputs for ``generate()`` (as Llama did then).
LEGACY_GENERATION = not _mixin_prepares_inputs()


class _LegacyGenerationInputs:
    """``prepare_inputs_for_generation`` as the models of releases before 4.45 wrote it (Llama's):
    feed only the tokens past the cache, pass the cache through."""

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, attention_mask=None, **kwargs):
        if past_key_values is not None:
            past = (past_key_values.get_seq_length() if isinstance(past_key_values, Cache)
                    else past_key_values[0][0].shape[2])
            input_ids = input_ids[:, past:] if input_ids.shape[1] > past else input_ids[:, -1:]
        return {"input_ids": input_ids, "past_key_values": past_key_values, "attention_mask": attention_mask,
                "use_cache": kwargs.get("use_cache")}


class FixedLogitsLM(*((_LegacyGenerationInputs,) if LEGACY_GENERATION else ()), PreTrainedModel, GenerationMixin):
    """A causal LM whose logits at each position come from a fixed table.

    The logits predicting the token at absolute position ``t + 1`` are
    ``table.logits(t + 1 - prompt_length, input_ids[t])``. The token history is read back from the
    KV cache, exactly as an attention layer would, so a stale or mis-cropped cache shows up.
    """

    config_class = FixedLogitsConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _supports_cache_class = True
    _is_stateful = False

    def _prepare_special_tokens(self, *args, **kwargs):
        """``generate()``'s own set-up of the special tokens, without its notices that the stub has no
        pad token and got no attention mask (:func:`~.special_tokens.pad_notices_unlogged`): a stub's
        ``generate()``, and an assistant stub's inside a generator, would log them at every call.
        (Releases before 4.42 log them from ``generate()`` itself.)"""
        with pad_notices_unlogged():
            return super()._prepare_special_tokens(*args, **kwargs)

    def __init__(self, config: FixedLogitsConfig):
        super().__init__(config)
        table = config.table
        # Logits come out in the table's dtype, and so do the weights: a bf16 model says bf16 through
        # ``model.dtype`` and its heads' weights, which some generators read.
        dtype = table.torch_dtype
        self.register_buffer("table_rows", table.emitted_rows(), persistent=False)
        # A real (identity) output projection: hidden states are the logits. DFlash-style generators
        # project a drafter's hidden states through this layer.
        if config.vocab_size > DENSE_WEIGHTS_MAX_VOCAB:
            self.anchor = nn.Parameter(torch.zeros(1, dtype=dtype), requires_grad=False)  # gives the model a device and dtype
            self.lm_head = WeightlessIdentityHead(config.vocab_size, dtype)
            self.embed_tokens = OneHotEmbedding(config.vocab_size, dtype)
        else:
            self.lm_head = IdentityHead(config.vocab_size, config.vocab_size, bias=False, dtype=dtype)
            self.embed_tokens = nn.Embedding(config.vocab_size, config.vocab_size, dtype=dtype)
            with torch.no_grad():
                self.lm_head.weight.copy_(torch.eye(config.vocab_size))
                self.embed_tokens.weight.copy_(torch.eye(config.vocab_size))
        self.post_init()

    def _init_weights(self, module):  # weights are fixed by construction
        pass

    def get_input_embeddings(self):
        return self.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    # Every causal LM of transformers defines the setters until 4.54 gives PreTrainedModel defaults;
    # 4.52-4.53's translator swaps the assistant's head and embedding through them.
    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def table_row_index(self, token_positions: torch.Tensor, previous_tokens: torch.Tensor) -> torch.Tensor:
        """Index of the table row for predicted tokens at absolute ``token_positions``, given the tokens before them."""
        kind = self.config.table_kind
        if kind == "iid":
            return torch.zeros_like(token_positions)
        if kind == "per_position":
            return (token_positions - self.config.prompt_length).clamp(0, self.table_rows.shape[0] - 1)
        return previous_tokens

    def table_logits(self, token_positions: torch.Tensor, previous_tokens: torch.Tensor) -> torch.Tensor:
        """Logits rows for predicted tokens at absolute ``token_positions``, given the tokens before them."""
        return self.table_rows[self.table_row_index(token_positions, previous_tokens)]

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: DynamicCache | None = None,
        cache: DynamicCache | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | list | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        # Releases from 5.24 name the argument ``cache``; earlier ones ``past_key_values``.
        past_key_values = past_key_values if past_key_values is not None else cache
        # As a decoder of the installed release does: before 4.45, a model handed a tuple (or nothing)
        # returned the legacy tuple cache (and assisted decoding cropped caches into tuples).
        legacy = use_cache is not False and not isinstance(past_key_values, Cache) and (
            past_key_values is not None or LEGACY_GENERATION)
        if legacy and past_key_values is not None:
            past_key_values = DynamicCache.from_legacy_cache(past_key_values)
        if past_key_values is None and use_cache:
            # As a real decoder does (5.0 leaves creating the cache to the model: LlamaModel.forward).
            past_key_values = DynamicCache()
        batch, new_len = input_ids.shape
        past_len = past_key_values.get_seq_length() if past_key_values is not None else 0
        history = input_ids
        if past_key_values is not None:
            token_states = input_ids.to(torch.float32)[:, None, :, None]
            keys, _ = past_key_values.update(token_states, token_states, 0)
            # The cache's "keys" are the token ids themselves: the history the model attends to.
            history = keys[:, 0, :, 0].round().long()
        positions = torch.arange(past_len, past_len + new_len, device=input_ids.device).expand(batch, new_len)
        previous = history[:, past_len : past_len + new_len]
        # Without hidden states (which a real model returns at every position), only the kept rows are
        # gathered: a 512-row prompt's every position costs 512 x 49,152 logits apiece.
        kept = logits_to_keep if logits_to_keep and not output_hidden_states else 0
        if kept:
            positions, previous = positions[:, -kept:], previous[:, -kept:]
        logits = self.table_logits(positions + 1, previous)
        # A real decoder's hidden states cover every token it was given, whatever logits_to_keep asks
        # (5.25's _assisted_decoding finds their sequence dimension by the input's length).
        hidden_states = (logits, logits) if output_hidden_states else None
        if logits_to_keep and not kept:
            logits = logits[:, -logits_to_keep:]
        if legacy and past_key_values is not None:
            past_key_values = past_key_values.to_legacy_cache()
        return CausalLMOutputWithPast(
            logits=logits, hidden_states=hidden_states,
            **cache_output(CausalLMOutputWithPast, past_key_values if use_cache is not False else None),
        )


class TableDrafterStub(PreTrainedModel):
    """Base of drafter stubs that read logits rows from a table and hold no weights."""

    config_class = FixedLogitsConfig
    base_model_prefix = "model"

    def __init__(self, config: FixedLogitsConfig):
        super().__init__(config)
        table = config.table
        self.register_buffer("table_rows", table.emitted_rows(), persistent=False)  # in the table's dtype
        self.anchor = nn.Parameter(torch.zeros(1, dtype=table.torch_dtype), requires_grad=False)  # device, dtype
        self.post_init()

    def _init_weights(self, module):  # no weights to initialise
        pass


def fixed_logits_lm(table: FixedLogits, prompt_length: int, **generation_defaults) -> FixedLogitsLM:
    """Build a :class:`FixedLogitsLM` for ``table`` (emitting its logits in ``table.dtype``); extra
    keywords set its generation config."""
    config = FixedLogitsConfig.for_table(table, prompt_length)
    model = FixedLogitsLM(config).eval()
    model.generation_config.pad_token_id = None
    for key, value in generation_defaults.items():
        setattr(model.generation_config, key, value)
    return model
