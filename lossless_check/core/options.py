"""Option value parsers shared by the CLI and the pytest plugin (light: no torch, no transformers)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from lossless_check.core.errors import UsageError

#: A user's rejection sampler's protocols (``lossless_check.subjects.sampler``): transformers'
#: ``_speculative_sampling`` signature, or engine style ``(draft_probs, draft_token_ids, target_probs)``.
SAMPLER_PROTOCOLS = ("transformers", "probs")
#: Trials per statistical case where a face is not told otherwise (CLI, Python API, pytest plugin, fuzzing): position 1
#: then detects a TV of about 0.07 at batch 1, 0.097 in a batched case (markov8, alpha 1e-6).
DEFAULT_SAMPLES = 5_000
#: The family-wise false-failure rate of a run where a face is not told otherwise.
DEFAULT_ALPHA = 1e-6


def probability(text: str) -> float:
    """A number strictly between 0 and 1 (an error rate)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must lie strictly between 0 and 1")
    return value


def positive_int(text: str) -> int:
    """An integer of at least 1 (a sample count, a number of workers)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def load_attribute(spec: str, what: str, expected: str = "module:attr"):
    """The object ``module:attr`` names, imported from where the user runs (like pytest and uvicorn),
    or a one-line :class:`~lossless_check.core.errors.UsageError` naming ``what`` it was meant to be."""
    module_name, _, attr = spec.strip().partition(":")
    if not module_name or not attr:
        raise UsageError(f"bad {what} {spec!r}: expected {expected}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import module {module_name!r} for {what} {spec!r}: {exc}") from None
    obj = module
    try:
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise UsageError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj
