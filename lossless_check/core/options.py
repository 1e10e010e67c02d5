"""Option value parsers shared by the CLI and the pytest plugin (light: no torch, no transformers)."""

from __future__ import annotations

import argparse


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
