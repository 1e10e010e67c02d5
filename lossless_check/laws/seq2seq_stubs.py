"""A fixed-logits encoder-decoder model: speculative decoding's canonical case (Whisper with a distilled assistant).

:class:`FixedLogitsSeq2SeqLM` is a real ``PreTrainedModel`` + ``GenerationMixin`` with
``config.is_encoder_decoder``: ``generate()`` runs its encoder once, builds an ``EncoderDecoderCache`` and drives
the decoder, and ``AssistedCandidateGenerator`` runs an encoder-decoder assistant's own encoder and drafts through
its ``generate()`` on ``decoder_input_ids``, all unmodified. The decoder is the fixed-logits causal LM
(:class:`~lossless_check.laws.stubs.FixedLogitsLM`) on the decoder's tokens, reading its history from the cache's
self-attention part, so a wrong crop of the ``EncoderDecoderCache`` shows as wrong logits. Given the decoder
prompt as ``decoder_input_ids`` (the scenario's prompt, also the encoder's input), the decoder's laws are the
decoder-only stub's: the same exact laws apply. Attention weights (zeros; one layer, :data:`ATTENTION_HEADS`
heads) and hidden states are returned when asked, shaped as a real model's ``(batch, heads, queries, keys)`` and
``(batch, positions, hidden)``, for the loop's ``return_dict_in_generate`` outputs.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from lossless_check.laws.stubs import FixedLogitsConfig, FixedLogitsLM, cache_output, output_cache
from lossless_check.laws.tables import FixedLogits

#: Heads of the attention weights the stubs return: more than a prompt's tokens, so that weights split along the
#: heads instead of the query positions come back with wrong shapes (an index error would hide what went wrong).
ATTENTION_HEADS = 4


class FixedLogitsEncoder(nn.Module):
    """The encoder: one-hot states of the input ids (the decoder ignores them: its laws are the table's)."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.vocab_size = vocab_size
        self.main_input_name = "input_ids"

    def forward(self, input_ids=None, attention_mask=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, **kwargs) -> BaseModelOutput:
        states = torch.nn.functional.one_hot(input_ids, self.vocab_size).to(torch.float32)
        length = input_ids.shape[1]
        return BaseModelOutput(
            last_hidden_state=states,
            hidden_states=(states, states) if output_hidden_states else None,
            attentions=(torch.zeros(input_ids.shape[0], ATTENTION_HEADS, length, length),) if output_attentions
            else None)


class FixedLogitsSeq2SeqLM(FixedLogitsLM):
    """An encoder-decoder model whose decoder's logits come from a fixed table (module docstring)."""

    def __init__(self, config: FixedLogitsConfig):
        super().__init__(config)
        self.encoder = FixedLogitsEncoder(config.vocab_size)

    def get_encoder(self, modality: str | None = None):
        return self.encoder

    def forward(self, input_ids=None, attention_mask=None, decoder_input_ids=None, decoder_attention_mask=None,
                encoder_outputs=None, past_key_values=None, cache=None, use_cache=None, output_attentions=None,
                output_hidden_states=None, logits_to_keep: int = 0, **kwargs) -> Seq2SeqLMOutput:
        kv = past_key_values if past_key_values is not None else cache
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids, output_attentions=output_attentions,
                                           output_hidden_states=output_hidden_states)
        if kv is None and use_cache is not False:
            kv = EncoderDecoderCache(DynamicCache(), DynamicCache())
        own = kv.self_attention_cache if isinstance(kv, EncoderDecoderCache) else kv
        # Hidden states at every decoder position, as a real decoder returns them, whatever logits_to_keep asks.
        decoded = super().forward(decoder_input_ids, past_key_values=own, use_cache=use_cache,
                                  output_hidden_states=output_hidden_states,
                                  logits_to_keep=0 if output_hidden_states else logits_to_keep)
        if output_hidden_states and logits_to_keep:
            decoded.logits = decoded.logits[:, -logits_to_keep:]
        batch, queries = decoder_input_ids.shape
        keys = output_cache(decoded).get_seq_length() if output_cache(decoded) is not None else queries
        encoded = encoder_outputs[0] if isinstance(encoder_outputs, (tuple, list)) else encoder_outputs.last_hidden_state
        attentions = (torch.zeros(batch, ATTENTION_HEADS, queries, keys),) if output_attentions else None
        cross = (torch.zeros(batch, ATTENTION_HEADS, queries, encoded.shape[1]),) if output_attentions else None
        return Seq2SeqLMOutput(
            logits=decoded.logits, decoder_hidden_states=decoded.hidden_states, decoder_attentions=attentions,
            cross_attentions=cross, encoder_last_hidden_state=encoded,
            **cache_output(Seq2SeqLMOutput, kv if use_cache is not False else None))


class DecoderOnlyAssistant(FixedLogitsLM):
    """A decoder-only fixed-logits assistant for an encoder-decoder target (DistilWhisper's case):
    ``AssistedCandidateGenerator`` hands it the target's encoder outputs, which it takes and ignores."""

    def forward(self, input_ids=None, encoder_outputs=None, **kwargs):
        return super().forward(input_ids, **kwargs)


def decoder_only_assistant(table: FixedLogits, prompt_length: int, **generation_defaults) -> DecoderOnlyAssistant:
    """A :class:`DecoderOnlyAssistant` emitting ``table``; extra keywords set its generation config."""
    model = DecoderOnlyAssistant(FixedLogitsConfig.for_table(table, prompt_length)).eval()
    model.generation_config.pad_token_id = None
    for key, value in generation_defaults.items():
        setattr(model.generation_config, key, value)
    return model


def fixed_logits_seq2seq(table: FixedLogits, prompt: tuple[int, ...], **generation_defaults) -> FixedLogitsSeq2SeqLM:
    """An encoder-decoder stub whose decoder emits ``table`` after the decoder prompt ``prompt`` (given as
    ``decoder_input_ids``; its first token is the decoder start token, so ``generate()`` prepends nothing and the
    decoder's sequences are laid out as a decoder-only model's); extra keywords set its generation config."""
    config = FixedLogitsConfig.for_table(table, len(prompt), is_encoder_decoder=True,
                                         decoder_start_token_id=prompt[0])
    model = FixedLogitsSeq2SeqLM(config).eval()
    model.generation_config.pad_token_id = None
    model.generation_config.decoder_start_token_id = prompt[0]
    for key, value in generation_defaults.items():
        setattr(model.generation_config, key, value)
    return model


__all__ = ["ATTENTION_HEADS", "DecoderOnlyAssistant", "FixedLogitsEncoder", "FixedLogitsSeq2SeqLM",
           "decoder_only_assistant", "fixed_logits_seq2seq"]
