"""Building the generators and calling ``get_candidates`` of those that need only ``input_ids``, in any release.

Releases 5.0-5.2 take a second, required argument, ``is_first_iteration``: ``_assisted_decoding``
passes ``True`` on its first round (the assistant runs its prefill then) and ``False`` after.
Later releases take ``input_ids`` alone.
"""

from __future__ import annotations

import inspect

import torch


def _takes_first_iteration(get_candidates) -> bool:
    return "is_first_iteration" in inspect.signature(get_candidates).parameters


_FIRST_ITERATION_ARGUMENT: dict[type, bool] = {}


def first_round(generator, input_ids: torch.LongTensor) -> tuple:
    """``generator.get_candidates(input_ids)`` as the first round of ``_assisted_decoding`` calls it.

    ``generator`` must be fresh (built for this call): the first round is the only one whose
    input is the prompt alone.
    """
    kind = type(generator)
    takes = _FIRST_ITERATION_ARGUMENT.get(kind)
    if takes is None:
        takes = _FIRST_ITERATION_ARGUMENT[kind] = _takes_first_iteration(generator.get_candidates)
    if takes:
        return generator.get_candidates(input_ids, is_first_iteration=True)
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
