"""Generator adapters and the resolution of ``--generator`` specs.

A spec is either the class name of a built-in generator (``DFlashTokenCandidateGenerator``) or
``module:attr`` naming a user class or factory. A subclass of a built-in generator is driven by its
base's adapter; a factory by :class:`~.factory.FactoryAdapter`.
"""

from __future__ import annotations

from dataclasses import dataclass

from lossless_check.core.errors import UsageError
from lossless_check.core.options import load_attribute
from lossless_check.subjects.adapters.assisted import AssistedAdapter
from lossless_check.subjects.adapters.base import DraftContext, DraftSession, GeneratorAdapter
from lossless_check.subjects.adapters.dflash import DFlashAdapter
from lossless_check.subjects.adapters.different_tokenizers import DifferentTokenizersAdapter
from lossless_check.subjects.adapters.early_exit import EarlyExitAdapter
from lossless_check.subjects.adapters.factory import FactoryAdapter
from lossless_check.subjects.adapters.mtp import MTPAdapter
from lossless_check.subjects.adapters.prompt_lookup import PromptLookupAdapter
from lossless_check.subjects.adapters.single_position import SinglePositionAdapter
from lossless_check.subjects.adapters.universal import UniversalAdapter

ADAPTERS: dict[str, GeneratorAdapter] = {a.name: a for a in (
    AssistedAdapter(), DifferentTokenizersAdapter(), UniversalAdapter(), PromptLookupAdapter(), EarlyExitAdapter(),
    SinglePositionAdapter(), MTPAdapter(), DFlashAdapter())}
#: The generators a run checks when it names none: every built-in family.
DEFAULT_GENERATORS: tuple[str, ...] = tuple(ADAPTERS)


@dataclass(frozen=True)
class ResolvedGenerator:
    """A generator spec resolved to the class under test and the adapter that drives it."""

    spec: str
    adapter: GeneratorAdapter
    generator_class: type | None  # None: not in the installed transformers (the case is skipped)

    @property
    def display_name(self) -> str:
        """The class name (a ``module:attr`` spec is shown by its attribute)."""
        return self.spec.rpartition(":")[2]


def resolve_generator(spec: str) -> ResolvedGenerator:
    """Resolve ``NAME`` or ``module:attr``; raise :class:`UsageError` with a one-line reason if impossible."""
    spec = spec.strip()
    if ":" not in spec:
        adapter = ADAPTERS.get(spec)
        if adapter is None:
            known = ", ".join(sorted(ADAPTERS))
            raise UsageError(f"unknown generator {spec!r}; known: {known} (or module:attr)")
        return ResolvedGenerator(spec, adapter, adapter.installed_class())
    obj = load_attribute(spec, "generator", "NAME or module:attr")
    if not isinstance(obj, type):
        if callable(obj) and _takes_one_argument(obj):
            return ResolvedGenerator(spec, FactoryAdapter(obj), obj)
        raise UsageError(f"generator {spec!r} is neither a candidate generator class nor a factory taking one "
                         "argument (the case's DraftContext)")
    for base in obj.__mro__:
        adapter = ADAPTERS.get(base.__name__)
        if adapter is not None and base.__module__.startswith("transformers."):
            return ResolvedGenerator(spec, adapter, obj)
    raise UsageError(f"generator {spec!r} subclasses no built-in generator with an adapter")


def _takes_one_argument(factory) -> bool:
    """Whether ``factory(ctx)`` is a valid call (a callable whose signature cannot be read is given the benefit)."""
    import inspect

    try:
        inspect.signature(factory).bind(None)
    except TypeError:
        return False
    except ValueError:
        return True
    return True


__all__ = ["ADAPTERS", "DraftContext", "FactoryAdapter", "DraftSession", "GeneratorAdapter", "ResolvedGenerator", "resolve_generator"]
