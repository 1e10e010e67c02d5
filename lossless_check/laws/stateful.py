"""Fixed-logits targets that keep their history in the cache kinds ``generate()`` rolls back.

:class:`~lossless_check.laws.stubs.FixedLogitsLM` reads its history from one full-attention cache
layer. Releases from 5.25 also verify drafts on targets whose layers keep *state* instead of keys:
linear-attention / SSM layers (Mamba, Qwen3-Next, Jamba, ...), whose conv and recurrent states
``_assisted_decoding`` records while it verifies (``activate_past_recording``) and restores on
rejection (``crop(-n)``). The stubs here keep their history in the real cache layers of the
installed release, one *target kind* each (:data:`TARGET_KINDS`):

- ``linear``: one linear-attention layer (``LinearAttentionLayer``: a conv state and a recurrent state);
- ``hybrid``: a linear-attention layer and a full-attention layer (as Qwen3-Next, Jamba);
- ``sliding``: a sliding-window layer and a full-attention layer (as Mistral, Gemma), window 3;
- ``static``: one full-attention layer of a ``StaticCache`` (``cache_implementation="static"``);
- ``linear-full``, ``linear-sliding``: one layer holding a linear-attention state and attention keys, full or in a
  window (layer types ``hybrid``, ``hybrid_sliding``: ``LinearAttentionAndFullAttentionLayer``,
  ``LinearAttentionAndSlidingWindowAttentionLayer``, as Falcon-H1 and Zamba2);
- ``indexed``, ``static-indexed``: one sparse-attention layer, keys and a second, indexer key cache (layer type
  ``indexed_attention``: ``DynamicIndexedLayer``, or ``StaticIndexedLayer`` in a ``StaticCache``; as DeepSeek V3.2
  and GLM-MoE-DSA), whose first indexed layer also keeps the positions of the tokens, as Qwen4-exp does where the
  release runs it.

Each layer keeps what a real one would, written through the cache's own methods: an attention layer
the tokens (as keys, as :class:`FixedLogitsLM` does); a linear-attention layer, as a causal conv, the
last :data:`CONV_KERNEL` inputs (its conv state) and, as its recurrent state, how many tokens it has
read and the last ``CONV_KERNEL - 1`` of them (passing ``generate()`` the intermediate states it asks
for, ``Cache.get_recurrent_states_to_keep``, exactly as Mamba2 and Qwen3-Next do); an indexed layer the
tokens as keys and as indexer keys (``Cache.update_indexer``), and their positions (``indexer_position_ids``).

**Why a check, and not just the law.** A real model's law depends on everything its state holds,
so a state left wrong by a rollback changes its output. The fixed-logits tables depend only on the
position and the last token, which a wrong state need not touch: a Markov target reads its context
from the input token, and the rollback bug of 5.25.0 (the recurrent state of one token too early)
leaves that unchanged. So the stub compares what each of its states says about the history before
the tokens it is given (their number, and the last tokens each one keeps: the conv window, the
recurrent register, the attention keys, the sliding window, the indexer keys and positions) with each other and with the positions
``generate()`` passes. Where they agree it emits the table's law at the position its *state* says
(per-position tables read it there, as a Mamba knows where it is only from its state). Where they
disagree it emits each row mirrored (token ``v`` gets the logit of ``V - 1 - v``): a law the table
never gives there, which the exact laws of plain sampling tell apart (the mirror of a row moves its
argmax, and its law is the row's only if the row is a palindrome). So any rollback that leaves a
state describing another history than the tokens the loop holds changes the law the harness compares
with, whatever the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch

from lossless_check.laws.scenarios import Scenario
from lossless_check.laws.stubs import FixedLogitsConfig, FixedLogitsLM, cache_output, fixed_logits_lm
from lossless_check.laws.tables import FixedLogits

#: Kernel of the stubs' causal conv (Mamba's and Qwen3-Next's default): the conv state holds the last
#: ``CONV_KERNEL`` inputs, the recurrent register the last ``CONV_KERNEL - 1`` tokens before a forward.
CONV_KERNEL = 4
#: The ``sliding`` kind's window: shorter than any generation, so that the window slides while it verifies.
SLIDING_WINDOW = 3


@dataclass(frozen=True)
class TargetKind:
    """One kind of stateful target: the layer types of its config and how ``generate()`` builds its cache."""

    name: str
    layer_types: tuple[str, ...]
    #: Holds recurrent state: ``generate()`` of releases before 5.25.0 refuses to verify drafts on it.
    stateful: bool
    #: ``GenerationConfig.cache_implementation`` (``None``: the dynamic cache ``generate()`` builds by default).
    cache_implementation: str | None = None


TARGET_KINDS: dict[str, TargetKind] = {k.name: k for k in (
    TargetKind("linear", ("linear_attention",), True),
    TargetKind("hybrid", ("linear_attention", "full_attention"), True),
    TargetKind("sliding", ("sliding_attention", "full_attention"), False),
    TargetKind("static", ("full_attention",), False, cache_implementation="static"),
    TargetKind("linear-full", ("hybrid",), True),
    TargetKind("linear-sliding", ("hybrid_sliding",), True),
    TargetKind("indexed", ("indexed_attention",), False),
    TargetKind("static-indexed", ("indexed_attention",), False, cache_implementation="static"),
)}
#: Layer types that hold a linear-attention state (conv and recurrent), and those that hold attention keys.
LINEAR_STATE_TYPES = ("linear_attention", "hybrid", "hybrid_sliding")
KEY_TYPES = ("full_attention", "sliding_attention", "hybrid", "hybrid_sliding", "indexed_attention")


class StatefulFixedLogitsConfig(FixedLogitsConfig):
    """A :class:`FixedLogitsConfig` whose ``layer_types`` (the cache ``generate()`` builds) are a kind's."""

    model_type = "lossless_check_stateful_fixed_logits"

    def __init__(self, target_kind: str = "linear", **kwargs):
        kind = TARGET_KINDS[target_kind]
        self.target_kind = target_kind
        super().__init__(**kwargs)
        # Set after the base, which makes every stub one layer deep.
        self.layer_types = list(kind.layer_types)
        self.num_hidden_layers = len(kind.layer_types)
        slides = {"sliding_attention", "hybrid_sliding"} & set(kind.layer_types)
        self.sliding_window = SLIDING_WINDOW if slides else None
        self.conv_kernel = CONV_KERNEL


def _encoded(tokens: torch.Tensor) -> torch.Tensor:
    """Tokens as the layers hold them: ``token + 1``, so that 0 is "no token" (the padding of a conv window)."""
    return tokens.to(torch.float64) + 1


class _Views:
    """What each state says about the history before a forward: its last tokens (encoded, 0 before the
    start) as far as it keeps them, and the number of tokens it has seen."""

    def __init__(self):
        self.tails: list[list[int]] = []
        self.lengths: list[int] = []

    def add(self, tokens: torch.Tensor | None = None, keeps: int | None = None, length=None) -> None:
        """``tokens``: a ``(n,)`` row of encoded tokens ending at the last one before the forward, of which
        the view speaks for the last ``keeps`` (all of them when ``None``; fewer held: none before them)."""
        if tokens is not None:
            held = [int(v) for v in tokens.round().long().tolist()]
            keeps = len(held) if keeps is None else keeps
            held = held[max(0, len(held) - keeps):] if keeps else []
            self.tails.append([0] * (keeps - len(held)) + held)
        if length is not None:
            self.lengths.append(int(length))

    def agree(self) -> bool:
        """Whether every two views name the same tokens where both speak, and every length is the same."""
        for i, a in enumerate(self.tails):
            for b in self.tails[i + 1:]:
                both = min(len(a), len(b))
                if both and a[len(a) - both:] != b[len(b) - both:]:
                    return False
        return all(n == self.lengths[0] for n in self.lengths)


class StatefulFixedLogitsLM(FixedLogitsLM):
    """A fixed-logits target whose history lives in the cache layers of its :class:`TargetKind` (module docstring).

    Batch 1 only, as ``_assisted_decoding``.
    """

    config_class = StatefulFixedLogitsConfig

    def __init__(self, config):
        super().__init__(config)
        # What real linear-attention and SSM models declare; generate() before 5.25.0 refuses them as targets.
        self._is_stateful = TARGET_KINDS[config.target_kind].stateful

    @property
    def kind(self) -> TargetKind:
        return TARGET_KINDS[self.config.target_kind]

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, cache=None,
                use_cache=None, output_hidden_states=None, logits_to_keep: int = 0, **kwargs):
        from transformers.modeling_outputs import CausalLMOutputWithPast

        cache = past_key_values if past_key_values is not None else cache
        if cache is None and use_cache:
            from transformers.cache_utils import DynamicCache

            cache = DynamicCache(config=self.config)
        views = _Views()
        if position_ids is not None:  # where generate() says the tokens are
            views.add(length=position_ids[0, 0])
        position = 0
        if cache is not None:
            by_state, by_keys = None, 0
            for layer, layer_type in enumerate(self.kind.layer_types):
                if layer_type in LINEAR_STATE_TYPES:
                    by_state = self._linear_layer(cache, layer, input_ids, views)
                if layer_type in KEY_TYPES:
                    by_keys = self._attention_layer(cache, layer, input_ids, views)
                if layer_type == "indexed_attention":
                    self._indexer(cache, layer, input_ids, views)
                    if (layer == self.kind.layer_types.index("indexed_attention")
                            and hasattr(cache.layers[layer], "indexer_position_ids") and _positions_kept()):
                        self._indexer_positions(cache.layers[layer], input_ids, position_ids, views)
            # A linear layer knows its position from its state only; an attention layer from its keys.
            position = by_state if by_state is not None else by_keys
        positions = torch.arange(position, position + input_ids.shape[1]).expand(input_ids.shape[0], -1)
        logits = self.table_logits(positions + 1, input_ids)
        if not views.agree():
            logits = logits.flip(-1)
        if logits_to_keep and not output_hidden_states:
            logits = logits[:, -logits_to_keep:]
        return CausalLMOutputWithPast(logits=logits, hidden_states=(logits, logits) if output_hidden_states else None,
                                      **cache_output(CausalLMOutputWithPast, cache if use_cache is not False else None))

    def _attention_layer(self, cache, layer: int, input_ids: torch.Tensor, views: _Views) -> int:
        """Write the tokens as keys of attention layer ``layer``; add what it held before them to ``views``;
        return how many tokens it had seen."""
        from transformers.cache_utils import StaticLayer

        new = input_ids.shape[1]
        before = int(cache.layers[layer].get_seq_length()) if layer < len(cache.layers) else 0
        states = _encoded(input_ids).to(torch.float32)[:, None, :, None]
        keys, _ = cache.update(states, states, layer)
        held = keys[0, 0, :, 0]
        if isinstance(cache.layers[layer], StaticLayer):  # its whole buffer: the tokens end where the new ones do
            held = held[: before + new]
        sliding = getattr(cache.layers[layer], "sliding_window", None)
        # A sliding layer shows the last ``window - 1`` tokens before the new ones; a full layer all of them.
        views.add(held[:-new], keeps=sliding - 1 if sliding else None, length=before)
        return before

    def _indexer(self, cache, layer: int, input_ids: torch.Tensor, views: _Views) -> None:
        """Write the tokens as indexer keys of layer ``layer`` (``Cache.update_indexer``); add what it held before
        them, and how many, to ``views``."""
        new = input_ids.shape[1]
        keys = cache.update_indexer(_encoded(input_ids).to(torch.float32)[:, :, None], layer)[0, :, 0]
        # A static indexer returns its whole buffer, filled up to the count it keeps (what its crop rolls back).
        filled = getattr(cache.layers[layer], "indexer_cumulative_length", None)
        held = keys[: int(filled)] if filled is not None else keys
        views.add(held[:-new], length=held.shape[0] - new)

    @staticmethod
    def _indexer_positions(layer, input_ids: torch.Tensor, position_ids: torch.Tensor | None, views: _Views) -> None:
        """Append the tokens' positions to the indexer's position history of ``layer``, as Qwen4-exp keeps it on
        its first indexed layer (``indexer_position_ids``: its indexer's rotary positions of every cached token,
        which the layer's ``crop`` rolls back); add how many it held before them to ``views``."""
        before = layer.indexer_position_ids
        held = 0 if before is None else before.shape[-1]
        new = (position_ids if position_ids is not None
               else torch.arange(held, held + input_ids.shape[1]).expand(input_ids.shape[0], -1))
        new = new[None].expand(3, -1, -1)  # Qwen4-exp's three rotary sections
        layer.indexer_position_ids = new if before is None else torch.cat([before, new], dim=-1)
        views.add(length=held)

    def _linear_layer(self, cache, layer: int, input_ids: torch.Tensor, views: _Views) -> int:
        """Run linear-attention layer ``layer`` over the tokens; add what its states held to ``views``; return
        the count its recurrent state held (the position it believes it is at)."""
        new = input_ids.shape[1]
        kernel = self.config.conv_kernel
        state = cache.get_recurrent_state(layer) if cache.has_previous_state(layer) else None
        if state is None:
            state = torch.zeros(input_ids.shape[0], kernel, dtype=torch.float64)
        # The causal conv sees the inputs its state holds (the last ``kernel``), then the new ones.
        window = cache.update_conv_state(_encoded(input_ids)[:, None, :], layer, conv_kernel_size=kernel)
        views.add(window[0, 0, :-new], keeps=kernel)
        # The recurrent state: how many tokens were read, then the last ``kernel - 1`` of them.
        views.add(state[0, 1:], length=state[0, 0])
        count = int(state[0, 0])
        states = []
        for i in range(new):
            state = torch.cat([state[:, :1] + 1, state[:, 2:], _encoded(input_ids[:, i : i + 1])], dim=1)
            states.append(state)
        # What a real layer hands the cache (Mamba2, Qwen3-Next): the state after a one-token step, or the
        # last ``get_recurrent_states_to_keep`` states of a longer forward (on the releases that record them).
        keep = min(_states_to_keep(cache, layer), new) if new > 1 else 0
        cache.update_recurrent_state(states[-keep:] if keep else states[-1], layer)
        return count


def _states_to_keep(cache, layer: int) -> int:
    keep = getattr(cache, "get_recurrent_states_to_keep", None)
    return keep(layer) if keep is not None else 0


def stateful_lm(table: FixedLogits, prompt_length: int, kind: str, **generation_defaults) -> StatefulFixedLogitsLM:
    """A :class:`StatefulFixedLogitsLM` of ``kind`` emitting ``table``; extra keywords set its generation config."""
    config = StatefulFixedLogitsConfig.for_table(table, prompt_length, target_kind=kind)
    model = StatefulFixedLogitsLM(config).eval()
    model.generation_config.pad_token_id = None
    model.generation_config.cache_implementation = TARGET_KINDS[kind].cache_implementation
    for key, value in generation_defaults.items():
        setattr(model.generation_config, key, value)
    return model


def target_lm(scenario: Scenario, **generation_defaults) -> FixedLogitsLM:
    """The target of ``scenario``: a :class:`StatefulFixedLogitsLM` of its ``target_kind``, or the plain stub."""
    if scenario.target_kind is None:
        return fixed_logits_lm(scenario.target, prompt_length=len(scenario.prompt), **generation_defaults)
    return stateful_lm(scenario.target, len(scenario.prompt), scenario.target_kind, **generation_defaults)


def stateful_variant(cls: type) -> type:
    """``cls`` (a :class:`FixedLogitsLM` subclass: a family's target stub) reading its history as
    :class:`StatefulFixedLogitsLM` does, whatever else it adds (hidden states, MTP layers)."""
    if issubclass(cls, StatefulFixedLogitsLM):
        return cls
    return _variants.setdefault(cls, type(f"{cls.__name__}Stateful", (cls, StatefulFixedLogitsLM), {}))


_variants: dict[type, type] = {}

#: What ``generate()`` raises where the installed release will not verify drafts on a target of a kind:
#: releases before 5.25.0 refuse ``_is_stateful`` models (``_validate_generation_mode``), a cache that
#: cannot be cropped (5.24.0's linear-attention layers once they hold a recurrent state), and 5.11-5.23
#: a static cache ("assisted generate is not supported with Static cache classes").
REFUSALS = ("not supported with stateful models", "requires a cache that can be cropped",
            "not supported with Static cache")


@cache
def _positions_kept() -> bool:
    """Whether an indexed target keeps the indexer's positions here: where the release's layers hold them and lets
    the one model that writes them, Qwen4-exp, verify drafts. It is a stateful model class, which releases before
    5.25 refuse ("not supported with stateful models")."""
    return refusal("linear") is None


@cache
def refusal(kind: str) -> str | None:
    """Why the installed release will not run speculative decoding on a target of ``kind``, or ``None``.

    A release whose caches have no layer of a type the kind is made of (``DYNAMIC_LAYER_TYPE_MAPPING``,
    ``STATIC_LAYER_TYPE_MAPPING`` of ``cache_utils``) cannot hold it. Otherwise the release is asked: a
    greedy ``generate()`` with prompt lookup on a 2-token prompt, 1 new token. Only what it says to
    refuse (:data:`REFUSALS`) counts as a refusal: any other failure is left to the cases, which report it.
    """
    import transformers
    from transformers import GenerationConfig, cache_utils

    target = TARGET_KINDS[kind]
    mapping = "STATIC_LAYER_TYPE_MAPPING" if target.cache_implementation == "static" else "DYNAMIC_LAYER_TYPE_MAPPING"
    missing = [t for t in target.layer_types if t not in getattr(cache_utils, mapping, {})]
    if missing:
        return f"transformers {transformers.__version__}'s caches have no {', '.join(missing)} layer"
    try:
        model = stateful_lm(FixedLogits.iid([0.0, 1.0]), 1, kind)
        model.generate(torch.tensor([[0, 1]]), generation_config=GenerationConfig(
            do_sample=False, max_new_tokens=1, prompt_lookup_num_tokens=1))
    except ValueError as exc:
        message = (str(exc).strip().splitlines() or [""])[0]
        if any(words in message for words in REFUSALS):
            return f"transformers {transformers.__version__} does not verify drafts on a {kind} target: {message}"
    return None


__all__ = [
    "CONV_KERNEL",
    "KEY_TYPES",
    "LINEAR_STATE_TYPES",
    "REFUSALS",
    "SLIDING_WINDOW",
    "TARGET_KINDS",
    "StatefulFixedLogitsLM",
    "TargetKind",
    "refusal",
    "stateful_lm",
    "stateful_variant",
    "target_lm",
]
