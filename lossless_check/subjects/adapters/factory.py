"""Users' own generators built by a factory: ``--generator module:make_generator``.

The factory protocol::

    def make_generator(ctx: lossless_check.subjects.adapters.DraftContext) -> CandidateGenerator

``ctx`` carries the stubs and the configuration of one case: ``ctx.scenario`` (the fixed-logits
tables and prompt), ``ctx.target`` (the fixed-logits target model, a real ``PreTrainedModel``),
``ctx.assistant()`` (a fixed-logits assistant model that drafts from the scenario's drafter table,
``gamma`` tokens per round), ``ctx.generation_config`` and ``ctx.processors`` (exactly what
``generate()`` built for the case's warpers), and ``ctx.prompt_ids``.

In step mode the harness calls the factory once per trial, so every trial is the first drafting
round from the prompt, and calls ``get_candidates`` as ``_assisted_decoding`` does: with
``input_ids`` alone, or, for a generator with ``requires_model_outputs = True``, also with the
target's ``model_kwargs``, its outputs over the prompt (hidden states included),
``is_first_iteration=False`` and ``n_last_matches=0`` (``ctx.model_kwargs`` is ``None``). Where the
installed ``generate()`` calls the generator itself (generate mode, and step mode's rounds for a
generator that returns no q), the factory is called where ``generate()`` builds its candidate
generator, with the context of that call
(:func:`~lossless_check.modes.loop_models.drafting_with_factory`).
"""

from __future__ import annotations

from typing import Callable

from lossless_check.core.errors import GeneratorFailure
from lossless_check.subjects.adapters.base import (
    DraftContext, FunctionSession, GeneratorAdapter, Prefills, first_round_after_prefill,
)
from lossless_check.subjects.adapters.rounds import first_round


def factory_generator(factory: Callable[[DraftContext], object], ctx: DraftContext):
    """``factory(ctx)``, or :class:`GeneratorFailure` if that is not a ``CandidateGenerator``."""
    from transformers.generation.candidate_generator import CandidateGenerator

    generator = factory(ctx)
    if not isinstance(generator, CandidateGenerator):
        raise GeneratorFailure(f"the factory returned {type(generator).__name__}, not a CandidateGenerator")
    return generator


class FactoryAdapter(GeneratorAdapter):
    """Drives whatever ``CandidateGenerator`` a user factory returns."""

    name = "factory"
    padded_drafter = True
    #: A user's generator may or may not draft a batch of rows correctly: not assumed here.
    batchable = False

    def __init__(self, factory: Callable[[DraftContext], object]):
        self.factory = factory

    def installed_class(self) -> type | None:
        return self.factory  # a factory needs nothing from the installed release to be tried

    def session(self, ctx: DraftContext) -> FunctionSession:
        prefills = Prefills(ctx.target)

        def draft(input_ids):
            generator = factory_generator(self.factory, ctx)
            if getattr(generator, "requires_model_outputs", False):
                model_kwargs, outputs = prefills(input_ids)
                return first_round_after_prefill(generator, input_ids, model_kwargs, outputs)
            return first_round(generator, input_ids)

        return FunctionSession(draft)
