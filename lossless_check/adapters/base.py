"""What an adapter is: it builds a real candidate generator around the fixed-logits stubs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

from ..scenarios import Scenario
from ..stubs import FixedLogitsLM


@dataclass
class DraftContext:
    """Everything an adapter may use to build a generator for one case."""

    scenario: Scenario
    generator_class: type
    generation_config: Any  # the GenerationConfig generate() prepared (captured)
    processors: Any  # the LogitsProcessorList generate() built (captured)
    target: FixedLogitsLM
    prompt_ids: torch.LongTensor

    def assistant(self) -> FixedLogitsLM:
        """A fixed-logits assistant model drafting ``gamma`` tokens per round from the drafter table."""
        from .assisted import assistant_for

        return assistant_for(self)


class DraftSession(Protocol):
    def draft(self, input_ids: torch.LongTensor) -> tuple[torch.LongTensor, torch.Tensor | None]:
        """Call the real ``get_candidates`` as ``_assisted_decoding`` would for this input."""


class GeneratorAdapter:
    """Drives one family of ``transformers`` candidate generators (and their subclasses)."""

    #: Class name in ``transformers.generation.candidate_generator``.
    name: str = ""
    #: Drafter table kinds this family can express (a block drafter cannot condition on its own drafts).
    drafter_kinds: tuple[str, ...] = ("iid", "per_position", "markov")

    def installed_class(self) -> type | None:
        from transformers.generation import candidate_generator

        return getattr(candidate_generator, self.name, None)

    def session(self, ctx: DraftContext) -> DraftSession:
        raise NotImplementedError


def prefill_state(target, input_ids: torch.LongTensor, **forward_kwargs) -> tuple[dict, object]:
    """The ``model_kwargs`` and target outputs ``_assisted_decoding`` holds before drafting from ``input_ids``.

    The last token of ``input_ids`` is the one the target just sampled; the target has run over
    everything before it (hidden states included). ``generate()`` always holds positions and an
    attention mask (DFlash of 5.15-5.17 and MtpModel of 5.14 index into it).
    """
    length = input_ids.shape[1]
    model_kwargs = {"position_ids": torch.arange(length)[None, :], "attention_mask": torch.ones_like(input_ids)}
    outputs = target(input_ids[:, :-1], output_hidden_states=True, **forward_kwargs)
    return model_kwargs, outputs


def first_round_after_prefill(generator, input_ids: torch.LongTensor, model_kwargs: dict, outputs):
    """``get_candidates`` of a generator that needs the target's outputs, as its first drafting round."""
    return generator.get_candidates(input_ids, model_kwargs=dict(model_kwargs), model_outputs=outputs,
                                    is_first_iteration=False, n_last_matches=0)


class FunctionSession:
    """A session that is just a function of ``input_ids``."""

    def __init__(self, draft: Callable[[torch.LongTensor], tuple[torch.LongTensor, torch.Tensor | None]]):
        self.draft = draft
