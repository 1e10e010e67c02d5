"""Building the generators and calling ``get_candidates`` of those that need only ``input_ids``, in any release.

Releases 5.0-5.2 take a second, required argument, ``is_first_iteration``: ``_assisted_decoding``
passes it positionally, ``get_candidates(input_ids, is_first_iteration)``, ``True`` on its first
round (the assistant runs its prefill then) and ``False`` after. Later releases pass ``input_ids``
alone. The harness calls as the installed loop does, whatever a subclass's signature says: an
override written ``get_candidates(self, input_ids, *args, **kwargs)`` works there, one that cannot
take the argument fails as it would in the real loop.
"""

from __future__ import annotations

import functools
import inspect

import torch


@functools.cache
def loop_passes_first_iteration() -> bool:
    """Whether the installed ``_assisted_decoding`` passes ``is_first_iteration`` (5.0-5.2): the
    installed base ``CandidateGenerator.get_candidates`` names it."""
    from transformers.generation.candidate_generator import CandidateGenerator

    return "is_first_iteration" in inspect.signature(CandidateGenerator.get_candidates).parameters


def first_round(generator, input_ids: torch.LongTensor) -> tuple:
    """``generator.get_candidates`` as the first round of the installed ``_assisted_decoding`` calls it.

    ``generator`` must be fresh (built for this call): the first round is the only one whose
    input is the prompt alone.
    """
    if loop_passes_first_iteration():
        return generator.get_candidates(input_ids, True)
    return generator.get_candidates(input_ids)


def construct(generator_class, **arguments):
    """``generator_class(**arguments)``, each argument passed only if the installed constructor takes it.

    ``arguments`` are what the newest ``generate()`` passes; an older release's ``generate()`` passes
    the subset its constructor names (``PromptLookupCandidateGenerator`` takes no ``logits_processor``
    before 4.45, for one). A constructor with ``**kwargs`` takes them all.
    """
    parameters = inspect.signature(generator_class.__init__).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        arguments = {k: v for k, v in arguments.items() if k in parameters}
    return generator_class(**arguments)


def first_assisted_round(generator_class, input_ids: torch.LongTensor, generation_config, processors,
                         **arguments) -> tuple:
    """A fresh generator of the ``AssistedCandidateGenerator`` family, built with the arguments
    ``generate()`` passes it (plus the family's own ``arguments``), and its first round."""
    generator = construct(generator_class, input_ids=input_ids, generation_config=generation_config,
                          model_kwargs={"use_cache": True}, inputs_tensor=input_ids,
                          logits_processor=processors, **arguments)
    return first_round(generator, input_ids)
