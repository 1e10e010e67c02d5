"""Patching an attribute for a while (torch's sampling primitives, a module's global), and reading a
patched function's arguments."""

from __future__ import annotations


def replace_attribute(owner, name: str, value):
    """Set ``owner.name`` to ``value``; return what puts the original back."""
    original = getattr(owner, name)
    own = name in owner.__dict__  # Tensor methods live on TensorBase: restore by deleting
    setattr(owner, name, value)
    return (lambda: setattr(owner, name, original)) if own else (lambda: delattr(owner, name))


def call_argument(args, kwargs, index, name, default=None):
    """Argument ``index`` (positional) or ``name`` (keyword) of a call, else ``default``."""
    return args[index] if len(args) > index else kwargs.get(name, default)
