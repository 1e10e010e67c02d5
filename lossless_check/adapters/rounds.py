"""Calling ``get_candidates`` of the generators that need only ``input_ids``, in any 5.x release.

Releases 5.0.x take a second, required argument, ``is_first_iteration``: ``_assisted_decoding``
passes ``True`` on its first round (the assistant runs its prefill then) and ``False`` after.
Later releases take ``input_ids`` alone.
"""

from __future__ import annotations

import inspect
import itertools
from typing import Callable

import torch

Draft = Callable[[torch.LongTensor], tuple]


def rounds_of(generator) -> Draft:
    """``generator.get_candidates`` as ``_assisted_decoding`` calls it, round after round."""
    get_candidates = generator.get_candidates
    if "is_first_iteration" not in inspect.signature(get_candidates).parameters:
        return get_candidates
    rounds = itertools.count()
    return lambda input_ids: get_candidates(input_ids, is_first_iteration=next(rounds) == 0)
