"""``MTPCandidateGenerator``: multi-token-prediction layers of the target draft the tokens.

The generator loads the target's MTP layers with the real ``MtpModel.from_pretrained`` and drafts
in the real ``MtpModel.forward``, which samples each draft from the logits *after* the logits
processors and returns those logits. Only the pieces an architecture supplies are stubs:

- the decoder layer class (``MtpModel`` instantiates the target's own layer class for its
  ``mtp_block``): :class:`FixedLogitsMtpBlock` outputs the drafter table's row for the token the
  layer predicts;
- the norm class (found by name inside that layer): :class:`IdentityNorm`;
- the vocabulary projection: the target's identity ``lm_head``, so hidden states are logits.

The MTP weights come from a real safetensors checkpoint, in the DeepSeek-V3 layout (MTP layer
``k`` stored as decoder layer ``num_hidden_layers + k``), written to a temporary folder. Its
``eh_proj`` passes the input token's (one-hot) embedding through, so a layer sees which token
precedes the one it drafts, as a Markov drafter table needs.

Past :data:`~lossless_check.laws.stubs.DENSE_WEIGHTS_MAX_VOCAB` the hidden size is not the vocabulary
(``eh_proj`` is a real ``2H x H`` ``nn.Linear``: 19 GB at ``H = V = 49,152``): the hidden states are
one-hot selectors of the rows of the target and drafter tables (``H`` = their rows together), and
the shared head is a :class:`~lossless_check.laws.stubs.RowSelectHead` holding both tables
(:class:`LowRankMtpLM`). ``MtpModel`` then projects each layer's output through the target's real
head, as with a real model. A drafter that reads the previous token (``markov``) needs the
one-hot token path and stays below the threshold.
"""

from __future__ import annotations

import copy
import os
import tempfile
from contextlib import contextmanager

import torch
from torch import nn

from lossless_check.core.errors import NotApplicable
from lossless_check.laws.stateful import stateful_variant, target_lm
from lossless_check.laws.stubs import DENSE_WEIGHTS_MAX_VOCAB, FixedLogitsConfig, FixedLogitsLM, RowSelectHead
from lossless_check.subjects.adapters.base import (
    DraftContext, FunctionSession, GeneratorAdapter, Prefills, first_round_after_prefill, installed_release,
)

#: Releases 5.16-5.17 crop the draft after its first EOS, reading the EOS position from row 0 only and
#: cutting every row there (5.17 ``candidate_generator.py`` lines 1552-1558: ``drafted_tokens =
#: candidate_ids[0]``, ``candidate_ids[:, :num_drafted]``): a batch row's draft depends on another
#: row's. Other releases draft one token per MTP layer, always.
CROPS_DRAFT_AT_ROW_0_EOS = (5, 16) <= installed_release() <= (5, 17)


class IdentityNorm(nn.Module):
    """A norm with the constructor of an RMSNorm that leaves hidden states (the logits) unchanged."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()

    def forward(self, hidden_states):
        return hidden_states


def _mtp_rows(config) -> torch.Tensor:
    """The drafter table as the MTP layers hold it: in the scenario's dtype, rounded as the stubs round."""
    from lossless_check.laws.tables import FixedLogits

    return FixedLogits(config.mtp_table_kind, config.mtp_table_rows, getattr(config, "mtp_table_dtype", "float32")).emitted_rows()


class FixedLogitsMtpBlock(nn.Module):
    """Decoder layer stub: at each position, the drafter table's logits for the token that follows it.

    ``hidden_states`` arrive as ``eh_proj([embedding, previous hidden])``, which the checkpoint makes
    the one-hot of the input token. The table is a weight, loaded from the checkpoint like any other
    (``MtpModel`` builds its layers on the meta device and only loads what the checkpoint holds).
    The layer records its input in the cache, as attention does.
    """

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.table_kind = config.mtp_table_kind
        self.prompt_length = config.prompt_length
        self.table_rows = nn.Parameter(_mtp_rows(config), requires_grad=False)
        self.input_norm = IdentityNorm(config.hidden_size)  # MtpModel takes its norm class from here

    def forward(self, hidden_states, position_ids=None, past_key_values=None, **kwargs):
        tokens = hidden_states.max(dim=-1).indices  # not argmax: provenance reads argmax as a draft rule
        if past_key_values is not None:
            states = tokens.to(hidden_states.dtype)[:, None, :, None]
            past_key_values.update(states, states, self.layer_idx)
        if self.table_kind == "iid":
            index = torch.zeros_like(tokens)
        elif self.table_kind == "per_position":
            # The token at position t predicts the token at t + 1.
            index = (position_ids + 1 - self.prompt_length).clamp(0, self.table_rows.shape[0] - 1)
            index = index.expand_as(tokens)  # one row per sequence, also from positions shared by the batch
        else:
            index = tokens
        return self.table_rows[index]


class LowRankMtpBlock(nn.Module):
    """:class:`FixedLogitsMtpBlock` of a large vocabulary: outputs the one-hot selector of the drafter
    row for the token the layer predicts (``iid`` or ``per_position``), which the shared
    :class:`~lossless_check.laws.stubs.RowSelectHead` projects to that row. Its input is not read."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.table_kind = config.mtp_table_kind
        self.prompt_length = config.prompt_length
        self.rows, self.offset, self.width = config.mtp_rows, config.mtp_row_offset, config.hidden_size
        self.input_norm = IdentityNorm(config.hidden_size)  # MtpModel takes its norm class from here
        # MTPCandidateGenerator reads its device from the last layer's first parameter.
        self.anchor = nn.Parameter(torch.zeros(1, dtype=getattr(torch, config.mtp_table_dtype)), requires_grad=False)

    def forward(self, hidden_states, position_ids=None, past_key_values=None, cache=None, **kwargs):
        past_key_values = past_key_values if past_key_values is not None else cache
        if past_key_values is not None:  # the cache grows as attention's does
            states = hidden_states[:, None, :, :1]  # (batch, 1 head, length, 1)
            past_key_values.update(states, states, self.layer_idx)
        batch, length = hidden_states.shape[:2]
        if self.table_kind == "iid":
            index = torch.zeros(batch, length, dtype=torch.long)
        else:
            index = (position_ids + 1 - self.prompt_length).clamp(0, self.rows - 1).expand(batch, length)
        return RowSelectHead.selector(index + self.offset, self.width, hidden_states.dtype)


def _low_rank(config) -> bool:
    return config.vocab_size > DENSE_WEIGHTS_MAX_VOCAB


class _Decoder(nn.Module):
    """What ``get_decoder()`` returns: the ``layers`` whose class ``MtpModel`` reuses."""

    def __init__(self, config):
        super().__init__()
        block = LowRankMtpBlock if _low_rank(config) else FixedLogitsMtpBlock
        self.layers = nn.ModuleList([block(config, i) for i in range(config.num_hidden_layers)])


class ZeroEmbedding(nn.Module):
    """The input embedding of :class:`LowRankMtpLM`: ``H`` zeros per token (no law here reads the token)."""

    def __init__(self, width: int, dtype: torch.dtype):
        super().__init__()
        self.embedding_dim = width
        self.weight = nn.Parameter(torch.zeros(0, dtype=dtype), requires_grad=False)  # device and dtype only

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*input_ids.shape, self.embedding_dim, dtype=self.weight.dtype)


class FixedLogitsMtpLM(FixedLogitsLM):
    """The target stub with MTP layers in its checkpoint (target table for its own logits).

    Past :data:`~lossless_check.laws.stubs.DENSE_WEIGHTS_MAX_VOCAB`, low rank: its head holds the target's
    and the drafter's rows, its hidden states select one of them (see the module's docstring).
    """

    # MTP weights sit in the checkpoint past the main layers; MtpModel finds them through this list.
    _keys_to_ignore_on_load_unexpected = [r"model\.layers\.[1-9][0-9]*\."]

    def __init__(self, config):
        super().__init__(config)
        self.decoder = _Decoder(config)
        if _low_rank(config):
            drafter = torch.tensor(config.mtp_drafter_rows, dtype=torch.float64).to(self.table_rows.dtype)
            self.lm_head = RowSelectHead(torch.cat([self.table_rows, drafter]))
            self.embed_tokens = ZeroEmbedding(config.hidden_size, self.table_rows.dtype)

    def table_logits(self, token_positions: torch.Tensor, previous_tokens: torch.Tensor) -> torch.Tensor:
        if not _low_rank(self.config):
            return super().table_logits(token_positions, previous_tokens)
        index = self.table_row_index(token_positions, previous_tokens)
        return RowSelectHead.selector(index, self.config.hidden_size, self.table_rows.dtype)

    def forward(self, input_ids=None, **kwargs):
        out = super().forward(input_ids, **kwargs)
        if _low_rank(self.config):
            out.logits = self.lm_head(out.logits)  # hidden states select rows; the head gives the logits
        return out


def mtp_checkpoint(config: FixedLogitsConfig) -> dict[str, torch.Tensor]:
    """MTP weights in the DeepSeek-V3 checkpoint layout: ``eh_proj`` keeps the embedding half, the
    layers hold the drafter table."""
    weights = {}
    if _low_rank(config):
        # The blocks read nothing from their input: eh_proj is a real 2H x H projection, all zeros.
        dtype = getattr(torch, config.mtp_table_dtype)
        for k in range(config.num_mtp_layers):
            layer = f"model.layers.{config.num_hidden_layers + k}"
            weights[f"{layer}.eh_proj.weight"] = torch.zeros(config.hidden_size, 2 * config.hidden_size, dtype=dtype)
            weights[f"{layer}.anchor"] = torch.zeros(1, dtype=dtype)
        return weights
    vocab = config.vocab_size
    dtype = _mtp_rows(config).dtype
    pass_embedding = torch.cat([torch.eye(vocab), torch.zeros(vocab, vocab)], dim=1).to(dtype)
    for k in range(config.num_mtp_layers):
        layer = f"model.layers.{config.num_hidden_layers + k}"
        weights[f"{layer}.eh_proj.weight"] = pass_embedding.clone()
        weights[f"{layer}.table_rows"] = _mtp_rows(config)
    return weights


def mtp_target_for(ctx: DraftContext, folder: str) -> FixedLogitsMtpLM:
    """The target stub with ``gamma`` MTP layers drafting from the drafter table, saved in ``folder``.

    Past :data:`~lossless_check.laws.stubs.DENSE_WEIGHTS_MAX_VOCAB` the stub is low rank (hidden size: the
    two tables' rows); a ``markov`` drafter (one row per token) is then refused with
    :class:`~lossless_check.core.errors.NotApplicable`.
    """
    scenario = ctx.scenario
    low_rank = scenario.vocab_size > DENSE_WEIGHTS_MAX_VOCAB
    if low_rank and "markov" in (scenario.drafter.kind, scenario.target.kind):
        raise NotApplicable(f"a markov table over {scenario.vocab_size} tokens needs the MTP stub's one-hot token "
                            f"path, dense up to vocabulary {DENSE_WEIGHTS_MAX_VOCAB}")
    from safetensors.torch import save_file

    plain = target_lm(scenario)
    config = plain.config
    config.num_mtp_layers = scenario.gamma
    if getattr(config, "layer_types", None) is not None:  # a stateful target: its MTP layers are attention layers
        config.mtp_layer_types = ["full_attention"] * scenario.gamma
    config.mtp_table_kind = scenario.drafter.kind
    # An array: get_mtp_config() deep-copies the config (a list of lm49k's rows: seconds per copy).
    config.mtp_table_rows = scenario.drafter.rows
    config.mtp_table_dtype = scenario.drafter.dtype  # a half-precision model's MTP layers are half precision too
    if low_rank:
        config.mtp_drafter_rows, config.mtp_table_rows = config.mtp_table_rows, None
        config.mtp_rows = scenario.drafter.rows.shape[0]
        config.mtp_row_offset = scenario.target.rows.shape[0]
        config.hidden_size = config.mtp_row_offset + config.mtp_rows
    config.rms_norm_eps = 1e-6
    config.dtype = scenario.drafter.torch_dtype
    config.name_or_path = folder
    save_file(mtp_checkpoint(config), os.path.join(folder, "model.safetensors"))
    model = (stateful_variant(FixedLogitsMtpLM) if scenario.target_kind else FixedLogitsMtpLM)(config).eval()
    model.generation_config = plain.generation_config
    # What from_pretrained records for a checkpoint that needs no renaming: MtpModel.from_pretrained
    # of 5.14-5.18 reads it from the main model (later releases fall back when it is absent).
    model._weight_conversions = []
    return model


@contextmanager
def _quiet_loading():
    """Hide the weight-loading progress bar (it would interleave with the run's own progress)."""
    from transformers.utils import logging

    was_enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            logging.enable_progress_bar()


class MTPAdapter(GeneratorAdapter):
    name = "MTPCandidateGenerator"
    batchable = not CROPS_DRAFT_AT_ROW_0_EOS
    #: 5.16-5.17 end a draft at its first EOS (see :data:`CROPS_DRAFT_AT_ROW_0_EOS`).
    drafts_stop_at_eos = CROPS_DRAFT_AT_ROW_0_EOS

    def session(self, ctx: DraftContext) -> FunctionSession:
        with tempfile.TemporaryDirectory(prefix="lossless-check-mtp-") as folder, _quiet_loading():
            target = mtp_target_for(ctx, folder)
            # MtpModel.from_pretrained reads the checkpoint here, once.
            template = ctx.generator_class(
                main_model=target,
                generation_config=ctx.generation_config,
                model_kwargs={"use_cache": True},
                logits_processor=ctx.processors,
            )
        prefills = Prefills(target)
        # Models hold only weights and are shared, and so are the processors (every other family
        # hands ctx.processors itself to each fresh generator); the rest (the MTP cache, the
        # prefill flag) is copied.
        shared = {id(v): v for v in vars(template).values() if isinstance(v, nn.Module)}
        shared[id(ctx.processors)] = ctx.processors

        def draft(input_ids):
            model_kwargs, outputs = prefills(input_ids)
            # Each call is the first drafting round after prefill: a copy of the generator as built.
            generator = copy.deepcopy(template, memo=dict(shared))
            return first_round_after_prefill(generator, input_ids, model_kwargs, outputs)

        return FunctionSession(draft)
