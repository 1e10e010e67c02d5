"""Which cases a run holds: generators x warper stacks x modes."""

from __future__ import annotations

from typing import Any

from .adapters import ADAPTERS

#: Warper stacks by matrix name. Each stack is a dict of GenerationConfig keyword arguments.
MATRICES: dict[str, list[dict[str, Any]]] = {
    "smoke": [{}, {"top_k": 3}],
    "default": [
        {},
        {"temperature": 0.7},
        {"top_k": 3},
        {"top_p": 0.7},
        {"min_p": 0.1},
        {"top_k": 3, "temperature": 0.7},
        {"top_p": 0.7, "temperature": 1.3},
        {"repetition_penalty": 1.5},
    ],
}
MATRICES["full"] = MATRICES["default"]

DEFAULT_GENERATORS: tuple[str, ...] = tuple(ADAPTERS)
