"""The few places where transformers releases differ in what the harness calls."""

from __future__ import annotations

import inspect
from functools import lru_cache


@lru_cache(maxsize=None)
def speculative_sampling():
    """The installed ``_speculative_sampling`` as ``f(candidate_ids, candidate_logits, gamma, new_logits, is_done)``.

    Releases up to 5.17 take ``is_done_candidate`` (the candidate already hit a stopping criterion);
    later ones crop after the call instead. ``extra`` keywords go through unchanged (e.g.
    ``assistant_ensemble_weight`` where :func:`verifier_parameters` has it).
    """
    from transformers.generation.utils import _speculative_sampling

    takes_is_done = "is_done_candidate" in inspect.signature(_speculative_sampling).parameters

    def call(candidate_ids, candidate_logits, gamma, new_logits, is_done=False, **extra):
        kwargs = {"is_done_candidate": is_done} if takes_is_done else {}
        return _speculative_sampling(candidate_ids, candidate_logits, gamma, new_logits, **kwargs, **extra)

    return call


def verifier_parameters() -> frozenset[str]:
    """The parameter names of the installed ``_speculative_sampling``."""
    from transformers.generation.utils import _speculative_sampling

    return frozenset(inspect.signature(_speculative_sampling).parameters)


def versions() -> dict[str, str]:
    import torch
    import transformers

    return {"transformers_version": transformers.__version__, "torch_version": torch.__version__}
