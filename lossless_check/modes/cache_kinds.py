"""The cache layer kinds a release rolls back, each under greedy speculative decoding (options mode's rows).

``_assisted_decoding`` undoes rejected drafts with ``cache.crop(...)``, which each cache layer kind implements on
its own: the full-attention ``DynamicLayer`` (every stub's), but also the sliding-window ``DynamicSlidingWindowLayer``
(Mistral, Gemma), the preallocated ``StaticLayer`` (``cache_implementation="static"``) and ``StaticSlidingWindowLayer``.
Here a target whose logits depend on the position (:func:`position_models`) decodes greedily with a user-given
cache of each kind (``generate(..., cache=...)``), with and without the drafter: the tokens must be equal. A crop
that keeps a rejected draft's length shifts every later position, and the tokens with it (a layer whose ``crop``
does nothing is caught: ``tests/test_options_mode.py``). The target stub reads its history back from the cache at
absolute positions; :func:`absolute_positions` adapts a layer kind to that (a sliding window's visible tokens put
back at their positions, the length as a number) without touching what ``crop`` does, which stays the release's.

What it cannot show: a crop that gets the length right and the older tokens wrong (the table reads the position
and the newest token only).
Linear-attention (stateful) layers need stateful targets; the indexed layers of sparse-attention models an indexer
cache: neither is driven here.
"""

from __future__ import annotations

import copy

import torch

#: (layer class name in ``transformers.cache_utils``, its constructor's keywords): the kinds tried, where the
#: release has them. Sizes leave room for the longest sequence of a case (a prompt, 4 new tokens and a draft).
KINDS = (
    ("DynamicSlidingWindowLayer", {"sliding_window": 4}),
    ("StaticLayer", {"max_cache_len": 32}),
    ("StaticSlidingWindowLayer", {"max_cache_len": 32, "sliding_window": 32}),  # croppable: max_cache_len <= window
)


def absolute_positions(layer_class: type) -> type:
    """``layer_class`` returning its keys and values at absolute positions (a sliding window's missing past as
    zeros on the left) and its length as an ``int`` (a static layer's is a tensor it changes in place)."""

    def update(self, key_states, value_states, *args, **kwargs):
        keys, values = layer_class.update(self, key_states, value_states, *args, **kwargs)
        missing = int(layer_class.get_seq_length(self)) - keys.shape[-2]
        if missing > 0:
            pad = keys.new_zeros(*keys.shape[:-2], missing, keys.shape[-1])
            keys, values = torch.cat([pad, keys], dim=-2), torch.cat([pad, values], dim=-2)
        return keys, values

    def get_seq_length(self, *args, **kwargs) -> int:
        return int(layer_class.get_seq_length(self, *args, **kwargs))

    return type(f"Absolute{layer_class.__name__}", (layer_class,), {"update": update, "get_seq_length": get_seq_length})


def cache_factories() -> dict[str, object]:
    """A fresh cache of each kind of :data:`KINDS` the installed release has and can build (by kind name)."""
    from transformers import cache_utils

    factories = {}
    for name, kwargs in KINDS:
        layer_class = getattr(cache_utils, name, None)
        if layer_class is None or not hasattr(cache_utils, "Cache"):
            continue
        layer = absolute_positions(layer_class)

        def make(layer=layer, kwargs=kwargs):
            return cache_utils.Cache(layers=[layer(**kwargs)])

        try:
            make()
        except TypeError:  # a release whose layer or Cache takes other arguments
            continue
        factories[name] = make
    return factories


def _cache_keyword() -> str:
    from transformers.modeling_outputs import CausalLMOutputWithPast

    from lossless_check.laws.stubs import cache_output

    return next(iter(cache_output(CausalLMOutputWithPast, None)))


def position_models(scenario):
    """A target whose logits depend on the position (the scenario's per-position table, so a token kept at the wrong
    position changes the next ones) and an assistant drafting from the scenario's other table."""
    from lossless_check.laws.stubs import fixed_logits_lm
    from lossless_check.subjects.adapters.base import constant_drafts

    by_position = [t for t in (scenario.drafter, scenario.target) if t.kind == "per_position"]
    if not by_position:
        return None
    other = scenario.target if by_position[0] is scenario.drafter else scenario.drafter
    prompt = len(scenario.prompt)
    return (fixed_logits_lm(by_position[0], prompt_length=prompt),
            fixed_logits_lm(other, prompt_length=prompt, **constant_drafts(scenario.gamma)))


def check_cache_kinds(scenario, greedy_config) -> tuple[list[str], list[str]]:
    """Greedy speculative decoding against plain greedy decoding with a cache of each kind, on
    :func:`position_models`: the problems found and the kinds run (none without a per-position table)."""
    models = position_models(scenario)
    if models is None:
        return [], []
    target, assistant = models
    prompt_ids = torch.tensor([scenario.prompt])
    keyword = _cache_keyword()
    problems, kinds = [], []
    for name, make in cache_factories().items():
        plain = target.generate(prompt_ids, generation_config=copy.deepcopy(greedy_config), **{keyword: make()})
        drafted = target.generate(prompt_ids, generation_config=copy.deepcopy(greedy_config),
                                  assistant_model=assistant, **{keyword: make()})
        kinds.append(name)
        if not torch.equal(plain, drafted):
            problems.append(f"with a {name} cache, greedy speculative decoding gives {drafted[0].tolist()} where "
                            f"plain greedy decoding gives {plain[0].tolist()}")
    return problems, kinds


__all__ = ["KINDS", "absolute_positions", "cache_factories", "check_cache_kinds"]
