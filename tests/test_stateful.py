"""The stateful targets (lossless_check.laws.stateful): their law, their rollback check, and their rows.

The stubs keep their history in the real cache layers of the installed release: a linear-attention
layer (conv and recurrent state), a linear-attention and a full-attention layer, a sliding-window and a
full-attention layer, a static cache. They must emit the scenario's table exactly when their states
describe the history the loop holds, and a law the table never gives when a rollback left one of them
describing another (the negative controls: cache layers that restore the wrong state). Their rows are
``skipped`` (not applicable) where the release refuses such targets (before 5.25.0 for ``linear`` and
``hybrid``), and ``not_lossless`` where it rolls them back wrongly (5.25.0: findings/stateful_rollback_one_state_short).
"""

import pytest
import torch

from fixtures.releases import INSTALLED, STATEFUL_ROLLBACK_ONE_STATE_SHORT, STATEFUL_TARGETS_REFUSED, within
from lossless_check.evidence.results import Case
from lossless_check.faces.api import run_cases
from lossless_check.laws.scenarios import STATEFUL, TARGET_KIND_NAMES
from lossless_check.laws.stateful import TARGET_KINDS, refusal, target_lm
from lossless_check.modes.greedy import run_greedy_case
from lossless_check.modes.loop_models import ASSISTED, EARLY_EXIT, PROMPT_LOOKUP, SINGLE_POSITION
from lossless_check.subjects.adapters import resolve_generator

REFUSED = within(STATEFUL_TARGETS_REFUSED)
#: The kinds holding recurrent state (declared ``_is_stateful``, as the real models are): refused before 5.25.0.
STATEFUL_KINDS = ("linear", "hybrid", "linear-full", "linear-sliding")
#: Releases whose generate() verifies drafts on the linear and hybrid targets (skip the tests that need it).
verifies_stateful = pytest.mark.skipif(REFUSED, reason=f"transformers {INSTALLED} refuses speculative decoding on "
                                                       f"stateful targets (5.25.0 is the first that runs it)")


def _table_logits(scenario, history):
    """The table's logits after each token of ``history`` (the prompt's included), as the plain stub emits them."""
    table, prompt = scenario.target, len(scenario.prompt)
    return torch.stack([table.emitted(j + 1 - prompt, t) for j, t in enumerate(history)])


def _forward(model, cache, tokens, position: int):
    """``tokens`` at ``position`` onwards, with the position ids ``generate()`` passes."""
    positions = torch.arange(position, position + len(tokens))[None]
    with torch.no_grad():
        return model(torch.tensor([tokens]), position_ids=positions, cache=cache, use_cache=True).logits[0]


def _cache(model):
    from transformers.cache_utils import DynamicCache, StaticCache

    if model.kind.cache_implementation == "static":
        return StaticCache(config=model.config, max_cache_len=32)
    return DynamicCache(config=model.config)


@pytest.mark.parametrize("kind", TARGET_KIND_NAMES)
def test_a_stub_fed_in_pieces_emits_the_table(kind):
    """Prefill, then one token, then three at once (a verification-sized forward): the table's rows at every
    position, as plain decoding and a round that keeps all its drafts see them."""
    scenario = STATEFUL[kind]
    model = target_lm(scenario)
    history = list(scenario.prompt) + [2, 7, 0, 5, 1]
    cache = _cache(model)
    pieces = [history[:6], history[6:7], history[7:]]
    logits = torch.cat([_forward(model, cache, piece, sum(map(len, pieces[:i]))) for i, piece in enumerate(pieces)])
    assert torch.equal(logits, _table_logits(scenario, history))


def _recurrent_after(model, tokens):
    """The recurrent state of ``model``'s linear layer after reading ``tokens`` from an empty cache."""
    cache = _cache(model)
    _forward(model, cache, tokens, 0)
    return cache.layers[0].recurrent_states[0].clone()


@pytest.mark.parametrize("kind", ["linear", "hybrid"])
@pytest.mark.parametrize("restored", ["correct", "one token early", "zeros"])
def test_a_rollback_that_restores_the_wrong_recurrent_state_changes_the_law(kind, restored):
    """The negative control at the stub: after the loop's rollback, the recurrent state is set to the state
    of the accepted history (correct), of the history without its last token (5.25.0's bug: the state from
    before the bonus token), or the layer's zeros (5.25.0's first round). The next forward must emit the
    table's rows only for the correct one, and each row mirrored otherwise."""
    scenario = STATEFUL[kind]
    model = target_lm(scenario)
    accepted = list(scenario.prompt) + [2]
    cache = _cache(model)
    _forward(model, cache, accepted, 0)  # the conv window and the attention keys hold the accepted history
    layer = cache.layers[0]
    if restored == "one token early":
        layer.recurrent_states[0] = _recurrent_after(model, accepted[:-1])
    elif restored == "zeros":
        layer.recurrent_states[0] = torch.zeros_like(layer.recurrent_states[0])
    logits = _forward(model, cache, [5, 1], len(accepted))
    expected = _table_logits(scenario, accepted + [5, 1])[-2:]
    assert torch.equal(logits, expected if restored == "correct" else expected.flip(-1))


@pytest.mark.parametrize("kind, damage", [("sliding", "window"), ("sliding", "length"), ("static", "length"),
                                          ("hybrid", "keys")])
def test_attention_layers_that_hold_another_history_change_the_law(kind, damage):
    """A sliding window or attention keys that lost a token, a length left one too long (as a crop that forgot
    to count): the stub's views disagree and its rows are mirrored."""
    scenario = STATEFUL[kind]
    model = target_lm(scenario)
    history = list(scenario.prompt) + [2]
    cache = _cache(model)
    _forward(model, cache, history, 0)
    layer = cache.layers[-1] if damage == "keys" else cache.layers[0]
    if damage in ("window", "keys"):
        layer.keys, layer.values = layer.keys[:, :, :-1], layer.values[:, :, :-1]
    elif kind == "sliding":
        layer.cumulative_length += 1
    else:
        layer.cumulative_length.add_(1)
    logits = _forward(model, cache, [5], len(history))
    assert torch.equal(logits, _table_logits(scenario, history + [5])[-1:].flip(-1))


def test_kinds_are_the_scenarios_and_the_stubs_declare_state_as_real_models_do():
    assert tuple(TARGET_KINDS) == TARGET_KIND_NAMES == tuple(STATEFUL)
    for kind, scenario in STATEFUL.items():
        assert scenario.target_kind == kind and scenario.name == f"markov8-{kind}"
        assert target_lm(scenario)._is_stateful == (kind in STATEFUL_KINDS)


def test_the_release_refuses_the_stateful_kinds_exactly_before_5_25():
    for kind in TARGET_KIND_NAMES:
        reason = refusal(kind)
        if kind in STATEFUL_KINDS and REFUSED:
            assert reason is not None and "not supported with stateful models" in reason
        else:
            assert reason is None, reason


def _case(generator, kind, mode="generate", warpers=None):
    return Case(resolve_generator(generator), warpers or {}, mode, STATEFUL[kind], 4)


@pytest.mark.parametrize("mode", ["generate", "greedy"])
def test_refused_or_unpaired_kinds_are_not_applicable(mode):
    """Not an error and not a pass: ``skipped``, saying why."""
    from lossless_check.modes import skip_reason

    for generator in (EARLY_EXIT, SINGLE_POSITION):
        reason = skip_reason(_case(generator, "sliding", mode))
        assert reason is not None and reason.startswith("not applicable to a sliding target")
    reason = skip_reason(_case(PROMPT_LOOKUP, "linear", mode))
    assert (reason is not None and reason.startswith("not applicable: transformers")) == REFUSED, reason


def test_runs_and_gates_carry_a_row_per_stack_where_a_kind_applies_and_one_row_where_it_does_not():
    from lossless_check.faces.api import cases_for
    from lossless_check.laws.matrix import matrix

    cases = cases_for([PROMPT_LOOKUP, EARLY_EXIT], matrix="smoke", mode="generate")
    per = {(c.generator.spec, c.scenario.name): 0 for c in cases}
    for c in cases:
        per[(c.generator.spec, c.scenario.name)] += 1
    stacks = len(matrix("smoke"))
    for kind in TARGET_KIND_NAMES:
        assert per[(EARLY_EXIT, f"markov8-{kind}")] == 1
        refused = REFUSED and kind in STATEFUL_KINDS
        assert per[(PROMPT_LOOKUP, f"markov8-{kind}")] == (1 if refused else stacks)
    greedy = [c for c in cases_for([PROMPT_LOOKUP], mode="greedy") if getattr(c.scenario, "target_kind", None)]
    assert sorted(c.scenario.target_kind for c in greedy) == sorted(TARGET_KIND_NAMES)
    # Step mode has nothing to roll back: a named stateful scenario is refused there with a one-line reason.
    from lossless_check.core.errors import UsageError

    with pytest.raises(UsageError, match="generate and greedy modes only"):
        cases_for([PROMPT_LOOKUP], "none", None, "step", "markov8-linear")


# --- Through the real loop --------------------------------------------------------------------------------


def _generate(generator, kind, samples=400):
    """One generate-mode case as a run decides it (in this process: a monkeypatched cache layer holds)."""
    return run_cases([_case(generator, kind)], samples, 1e-6, seed=0).cases[0]


@pytest.mark.parametrize("generator", [ASSISTED, PROMPT_LOOKUP])
def test_release_verdicts_on_the_linear_target(generator):
    """``skipped`` where the release refuses it; ``not_lossless`` where the rollback is one state short;
    ``lossless`` on a release that fixes it."""
    result = _generate(generator, "linear")
    if REFUSED:
        assert result.verdict == "skipped" and "not applicable" in result.reason
    else:
        expected = "not_lossless" if within(STATEFUL_ROLLBACK_ONE_STATE_SHORT) else "lossless"
        assert result.verdict == expected, result.reason


class _ForgetfulSlidingLayer:
    """A sliding-window layer whose crop past the window drops the tokens but not their count."""

    def crop(self, tokens_to_remove):
        length = self.cumulative_length
        super().crop(tokens_to_remove)
        self.cumulative_length = length


class _OverCroppingStaticLayer:
    """A static layer whose crop after a rejection removes one token more than it is asked to."""

    def crop(self, tokens_to_remove):
        super().crop(tokens_to_remove - 1 if tokens_to_remove < 0 else tokens_to_remove)


class _KeepOneMore:
    """A linear-attention layer that records one recurrent state more than the loop asks for (5.25.0's fix)."""

    def activate_past_recording(self, recurrent_states_to_keep=None, **kwargs):
        more = None if recurrent_states_to_keep is None else recurrent_states_to_keep + 1
        super().activate_past_recording(recurrent_states_to_keep=more, **kwargs)


def _replace_layer(monkeypatch, layer_type: str, mixin: type, static: bool = False):
    from transformers import cache_utils

    mapping = cache_utils.STATIC_LAYER_TYPE_MAPPING if static else cache_utils.DYNAMIC_LAYER_TYPE_MAPPING
    base = mapping[layer_type]
    monkeypatch.setitem(mapping, layer_type, type(f"{mixin.__name__}{base.__name__}", (mixin, base), {}))


@pytest.mark.parametrize("kind, layer_type, mutant, static", [
    ("sliding", "sliding_attention", _ForgetfulSlidingLayer, False),
    ("static", "full_attention", _OverCroppingStaticLayer, True),
])
def test_a_cache_that_rolls_back_wrongly_is_caught_in_both_modes_and_the_real_one_passes(
        monkeypatch, kind, layer_type, mutant, static):
    """The negative controls through the real loop (assistant model, whose drafts never pass max_length):
    the installed cache layer passes; a mutant of it that restores the wrong state fails generate mode
    and greedy mode."""
    assert _generate(ASSISTED, kind).verdict == "lossless"
    assert run_greedy_case(_case(ASSISTED, kind, "greedy")).verdict == "lossless"
    _replace_layer(monkeypatch, layer_type, mutant, static)
    assert _generate(ASSISTED, kind).verdict == "not_lossless"
    assert run_greedy_case(_case(ASSISTED, kind, "greedy")).verdict == "not_lossless"


@verifies_stateful
def test_the_linear_layer_that_keeps_one_more_state_passes(monkeypatch):
    """The positive control of the 5.25.0 finding, in-process: the same linear-attention layer recording one
    more state is lossless, in generate and greedy mode, with prompt lookup."""
    _replace_layer(monkeypatch, "linear_attention", _KeepOneMore)
    assert _generate(PROMPT_LOOKUP, "linear").verdict == "lossless"
    assert run_greedy_case(_case(PROMPT_LOOKUP, "linear", "greedy")).verdict == "lossless"


def test_prompt_lookup_on_a_static_cache_errs_where_drafts_overflow_it():
    """findings/static_cache_drafts_past_max_length: drafts reaching max_length are written past a static cache
    of max_length - 1 positions (5.24.0 on): ``error``, explained; ``skipped`` where the release refuses a static
    cache for speculative decoding (5.15-5.23)."""
    from fixtures.releases import STATIC_CACHE_OVERFLOWS, STATIC_CACHE_REFUSED

    result = _generate(PROMPT_LOOKUP, "static")
    if within(STATIC_CACHE_REFUSED):
        assert result.verdict == "skipped" and "Static cache" in result.reason
    elif within(STATIC_CACHE_OVERFLOWS):
        assert result.verdict == "error" and "IndexError" in result.explain()
    else:
        assert result.verdict == "lossless", result.reason


def test_no_generated_script_claims_to_reproduce_a_stateful_case():
    """The generated scripts' table model keeps no state: they point to the hand-written reproduction instead."""
    from lossless_check.outputs.repro import repro_unsupported

    reason = repro_unsupported(_case(PROMPT_LOOKUP, "linear"))
    assert reason is not None and "findings/stateful_rollback_one_state_short/repro.py" in reason
