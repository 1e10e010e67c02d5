"""What an adapter is: it builds a real candidate generator around the fixed-logits stubs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from lossless_check.laws.scenarios import Scenario
from lossless_check.laws.stubs import FixedLogitsLM, fixed_logits_lm


def constant_drafts(gamma: int) -> dict:
    """Assistant generation defaults for exactly ``gamma`` drafts per round.

    No confidence-based early stop and no adaptive schedule: a fixed draft length keeps the
    acceptance law exact and the rounds independent.
    """
    return {"num_assistant_tokens": gamma, "num_assistant_tokens_schedule": "constant",
            "assistant_confidence_threshold": 0.0}


@dataclass
class DraftContext:
    """Everything an adapter may use to build a generator for one case.

    Where the harness calls ``get_candidates`` itself (step mode), ``generation_config`` and
    ``processors`` are what ``generate()`` prepares for the case (captured) and ``model_kwargs`` is
    ``None``. Where the installed ``generate()`` builds the generator (generate mode, and step mode's
    round of the real loop), they are what it passes ``_get_candidate_generator`` on that call:
    its generation config, its logits processors and its ``model_kwargs`` (the target's live cache
    among them), ``target`` the model generating and ``prompt_ids`` its ``input_ids``.
    """

    scenario: Scenario
    generator_class: type
    generation_config: Any  # the GenerationConfig generate() prepared (captured)
    processors: Any  # the LogitsProcessorList generate() hands the generator (compat.generator_processors)
    target: FixedLogitsLM
    prompt_ids: torch.LongTensor
    model_kwargs: dict | None = None  # generate()'s, where generate() builds the generator

    def assistant(self) -> FixedLogitsLM:
        """A fixed-logits assistant model drafting ``gamma`` tokens per round from the drafter table."""
        return fixed_logits_lm(self.scenario.drafter, prompt_length=len(self.scenario.prompt),
                               **constant_drafts(self.scenario.gamma))


class DraftSession(Protocol):
    def draft(self, input_ids: torch.LongTensor) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """One real ``get_candidates`` call of a fresh generator on ``input_ids``.

        ``input_ids`` is ``(B, L)``: ``B >= 1`` identical rows (the prompt). The call is the first
        drafting round of ``_assisted_decoding`` after the prompt; it returns ``candidate_ids``
        ``(B, L + gamma)`` and ``candidate_logits`` ``(B, gamma, V)`` or ``None``.
        """


class GeneratorAdapter:
    """Drives one family of ``transformers`` candidate generators (and their subclasses)."""

    #: Class name in ``transformers.generation.candidate_generator``.
    name: str = ""
    #: Drafter table kinds this family can express (a block drafter cannot condition on its own drafts).
    drafter_kinds: tuple[str, ...] = ("iid", "per_position", "markov")
    #: Whether the family can meet a drafter head padded past the target's vocabulary (scenario
    #: ``iid8-padded-drafter``): it takes a separate assistant model with an ``lm_head`` of its own
    #: (or no drafter at all). Families that draft through the target's own head or hidden states
    #: (EarlyExit, MTP, DFlash, SinglePosition's Gemma4 assistant) cannot: the case is skipped.
    padded_drafter: bool = False
    #: Whether one ``session.draft`` call on ``B`` identical rows gives ``B`` independent first-round
    #: drafts, each row distributed as a batch-1 call (verified for the built-in generator on the
    #: installed release: ``tests/test_batching.py``). False: call ``draft`` with one row only. A
    #: subclass of a built-in generator inherits its family's flag; factories are False.
    batchable: bool = False
    #: Whether a draft may end early at an EOS token: the drafts come from the assistant's own
    #: ``generate()`` (Assisted, EarlyExit, Universal, DifferentTokenizers). A batch-1 call then
    #: returns the draft up to and including its first EOS; in a batch, ``generate()`` pads a row
    #: that drew EOS (pad = EOS: the stubs set no pad token) to the longest row, its later logits rows
    #: computed from the padding. Cut after its first EOS draft token, such a row is exactly (same
    #: tokens, bitwise the same logits rows, drawn from the same law) what a batch-1 call drafting the
    #: same tokens returns: verified for the batchable families on every 5.x release
    #: (``tests/test_batching.py``). Block drafters draft their whole block (False), except on the
    #: releases whose DFlash, MTP (5.16-5.17) or SinglePosition (up to 5.17) stop at EOS.
    drafts_stop_at_eos: bool = False

    def installed_class(self) -> type | None:
        from transformers.generation import candidate_generator

        return getattr(candidate_generator, self.name, None)

    def session(self, ctx: DraftContext) -> DraftSession:
        raise NotImplementedError


def installed_release() -> tuple[int, int]:
    """``(major, minor)`` of the installed ``transformers``."""
    import transformers

    major, minor = transformers.__version__.split(".")[:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def prefill_state(target, input_ids: torch.LongTensor, **forward_kwargs) -> tuple[dict, object]:
    """The ``model_kwargs`` and target outputs ``_assisted_decoding`` holds before drafting from ``input_ids``.

    The last token of ``input_ids`` is the one the target just sampled; the target has run over
    everything before it (hidden states included), one row per row of ``input_ids``. ``generate()``
    always holds positions and an attention mask (DFlash of 5.15-5.17 and MtpModel of 5.14 index
    into it), one row per sequence.
    """
    batch, length = input_ids.shape
    model_kwargs = {"position_ids": torch.arange(length).repeat(batch, 1), "attention_mask": torch.ones_like(input_ids)}
    outputs = target(input_ids[:, :-1], output_hidden_states=True, **forward_kwargs)
    return model_kwargs, outputs


class Prefills:
    """:func:`prefill_state` of ``target``, computed once per batch size and prompt.

    The target's outputs over a prompt are a deterministic function of it (fixed tables): every
    draft call of a session shares them (``model_kwargs`` is copied per call, as a generator may
    update it).
    """

    def __init__(self, target, **forward_kwargs):
        self.target = target
        self.forward_kwargs = forward_kwargs
        self._states: dict[tuple, tuple[dict, object]] = {}

    def __call__(self, input_ids: torch.LongTensor) -> tuple[dict, object]:
        key = (input_ids.shape[0], tuple(input_ids[0].tolist()))
        state = self._states.get(key)
        if state is None:
            with torch.no_grad():
                state = self._states[key] = prefill_state(self.target, input_ids, **self.forward_kwargs)
        return dict(state[0]), state[1]


def first_round_after_prefill(generator, input_ids: torch.LongTensor, model_kwargs: dict, outputs):
    """``get_candidates`` of a generator that needs the target's outputs, as its first drafting round."""
    return generator.get_candidates(input_ids, model_kwargs=dict(model_kwargs), model_outputs=outputs,
                                    is_first_iteration=False, n_last_matches=0)


class FunctionSession:
    """A session that is just a function of ``input_ids``. ``facts``: what the generator was built
    with that the run does not choose (a translator's vocabulary order), reported with the case."""

    def __init__(self, draft: Callable[[torch.LongTensor], tuple[torch.LongTensor, torch.Tensor | None]],
                 facts: dict | None = None):
        self.draft = draft
        self.facts = facts or {}
