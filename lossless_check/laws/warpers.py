"""Warper specs: parse ``"top_k=3,temperature=0.7"`` and build the processors ``generate()`` builds.

The processors are never re-implemented: :func:`capture_processors` runs the real ``generate()`` of
the target stub up to the point where it hands its ``LogitsProcessorList`` to the sampling loop, and
takes that list. Whatever the installed release builds, in whatever order, is what is tested.
"""

from __future__ import annotations

import ast
import warnings
from typing import Any

from lossless_check.core.compat import release_warpers
from lossless_check.core.errors import UsageError


def _split_top_level(spec: str) -> list[str]:
    """Split on commas that are not inside brackets (``bad_words_ids=[[1],[2]]`` stays whole)."""
    parts, depth, current = [], 0, []
    for char in spec:
        if char in "[({":
            depth += 1
        elif char in "])}":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def split_warpers(spec: str) -> dict[str, Any]:
    """Parse a warper spec's syntax (``key=literal`` items) and check value ranges, without transformers.

    Raises :class:`UsageError` with a one-line message for malformed items, non-literal values,
    repeated keys and out-of-range values; :func:`parse_warpers` then checks the keys.
    """
    if spec is None or not spec.strip() or spec.strip() == "none":
        return {}
    kwargs: dict[str, Any] = {}
    for item in _split_top_level(spec):
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key or not raw:
            raise UsageError(f"bad warper {item!r}: expected key=value")
        if key in kwargs:
            raise UsageError(f"bad warper spec {spec!r}: {key!r} given twice")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "invalid decimal literal" and friends: the error below says it
                value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            raise UsageError(f"bad warper {item!r}: {raw!r} is not a number or literal") from None
        kwargs[key] = value
    _check_ranges(kwargs)
    return kwargs


def parse_warpers(spec: str) -> dict[str, Any]:
    """Parse a warper spec into ``GenerationConfig`` keyword arguments.

    Values are Python literals (``3``, ``0.7``, ``[[1, 2]]``, ``None``). Raises :class:`UsageError`
    with a one-line message for unknown keys, non-literal values, or values ``GenerationConfig``
    rejects.
    """
    from transformers import GenerationConfig

    kwargs = split_warpers(spec)
    known = GenerationConfig().to_dict()
    for key, value in kwargs.items():
        if key not in known:
            raise UsageError(f"bad warper {key}={value!r}: {key!r} is not a GenerationConfig option")
    validate_warpers(kwargs)
    return kwargs


#: Ranges ``generate()`` does not always enforce (``top_p=2`` silently keeps everything).
_RANGES: dict[str, tuple[str, Any]] = {
    "temperature": ("a number > 0", lambda v: v > 0),
    "top_k": ("an integer >= 0", lambda v: isinstance(v, int) and v >= 0),
    "top_p": ("a number in (0, 1]", lambda v: 0 < v <= 1),
    "min_p": ("a number in [0, 1]", lambda v: 0 <= v <= 1),
    "typical_p": ("a number in (0, 1]", lambda v: 0 < v <= 1),
    "epsilon_cutoff": ("a number in [0, 1)", lambda v: 0 <= v < 1),
    "eta_cutoff": ("a number in [0, 1)", lambda v: 0 <= v < 1),
    "repetition_penalty": ("a number > 0", lambda v: v > 0),
    "no_repeat_ngram_size": ("an integer >= 0", lambda v: isinstance(v, int) and v >= 0),
    "min_new_tokens": ("an integer >= 0", lambda v: isinstance(v, int) and v >= 0),
}


def _check_ranges(kwargs: dict[str, Any]) -> None:
    for key, value in kwargs.items():
        if key in _RANGES and value is not None:
            wanted, ok = _RANGES[key]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
                raise UsageError(f"bad warper {key}={value!r}: must be {wanted}")


def validate_warpers(kwargs: dict[str, Any]) -> None:
    """Raise :class:`UsageError` if a value is out of range or ``GenerationConfig`` refuses it."""
    _check_ranges(kwargs)

    from transformers import GenerationConfig

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            GenerationConfig(do_sample=True, **release_warpers(kwargs)).validate(strict=True)
    except TypeError:
        # Older releases have no strict= argument.
        try:
            GenerationConfig(do_sample=True, **release_warpers(kwargs)).validate()
        except Exception as exc:  # noqa: BLE001 - any refusal is the user's input
            raise UsageError(f"bad warpers {format_warpers(kwargs)!r}: {_first_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"bad warpers {format_warpers(kwargs)!r}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def format_warpers(kwargs: dict[str, Any]) -> str:
    """Canonical spec string (the form reports use); ``"none"`` for plain sampling."""
    if not kwargs:
        return "none"
    return ",".join(f"{k}={v!r}".replace(" ", "") for k, v in kwargs.items())


class _Captured(Exception):
    def __init__(self, processors, generation_config):
        super().__init__("captured")
        self.processors = processors
        self.generation_config = generation_config


def capture_processors(model, prompt_ids, warpers: dict[str, Any], max_new_tokens: int, do_sample: bool = True):
    """Run ``model.generate`` until it starts sampling; return its ``(LogitsProcessorList, GenerationConfig)``.

    The list is every processor the sampling loop applies, in its order: releases before 4.45 hand
    the loop a ``logits_processor`` and a ``logits_warper`` (applied after it), joined here. The config
    is the one ``generate()`` prepared (read where it builds the processors: releases before 4.40 do
    not pass it to the loop). ``model`` must be a :class:`~lossless_check.laws.stubs.FixedLogitsLM`; the
    capture uses a throwaway subclass whose sampling loop stops at once, so the model itself is untouched.
    """
    from transformers import GenerationConfig, LogitsProcessorList

    base = type(model)
    prepared: list = []

    def _get_logits_processor(self, *args, **kwargs):
        prepared.append(kwargs["generation_config"] if "generation_config" in kwargs else args[0])
        return base._get_logits_processor(self, *args, **kwargs)

    def _sample(self, *args, **kwargs):
        values = list(args) + list(kwargs.values())
        # The processors first, then the warpers, as the loop applies them.
        lists = sorted((v for v in values if isinstance(v, LogitsProcessorList)),
                       key=lambda v: v is kwargs.get("logits_warper"))
        config = next((v for v in values if isinstance(v, GenerationConfig)), None) or prepared[-1]
        raise _Captured(LogitsProcessorList([p for part in lists for p in part]), config)

    # ``sample`` is the loop's name before 4.39 (a deprecated alias of ``_sample`` until 4.41); greedy
    # decoding (``do_sample=False``) has its own loop before 4.45, ``_greedy_search`` (``greedy_search`` before 4.39).
    loops = {name: _sample for name in ("_sample", "sample", "_greedy_search", "greedy_search")}
    capture_cls = type(f"_Capture{base.__name__}", (base,), {**loops, "_get_logits_processor": _get_logits_processor})
    probe = capture_cls(model.config)
    probe.generation_config = model.generation_config
    config = GenerationConfig(**{**release_warpers(warpers), "do_sample": do_sample, "max_new_tokens": max_new_tokens})
    # The model's special tokens where the warpers name none, as generate() takes them from the model's
    # generation config on 5.x: releases before 4.41 ignore the model's when handed a config, and their
    # sampling loop then reads the model's EOS with no pad token (4.37-4.39 raise "If `eos_token_id` is
    # defined, make sure that `pad_token_id` is defined" in a generator's nested generate()).
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(config, name, None) is None:
            setattr(config, name, getattr(model.generation_config, name, None))
    try:
        probe.generate(prompt_ids, generation_config=config)
    except _Captured as captured:
        return captured.processors, captured.generation_config
    except Exception as exc:  # noqa: BLE001 - the user's warper values were refused by generate()
        raise UsageError(f"generate() refused warpers {format_warpers(warpers)!r}: {_first_line(exc)}") from None
    raise RuntimeError("generate() did not reach the sampling loop")
