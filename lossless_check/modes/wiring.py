"""Where ``generate()`` builds its candidate generator: a user's subclass or factory wired in there.

The installed ``GenerationMixin._get_candidate_generator`` builds the generator of every
``generate()`` call. A subclass of the stub target overrides it (nothing of ``transformers`` is
patched): :func:`driving` builds a user subclass of a built-in with the arguments the installed
release gives the built-in; :func:`drafting_with_factory` calls a user's factory with a
:class:`~lossless_check.subjects.adapters.DraftContext` of that very call.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from typing import Any, Callable

from transformers import GenerationMixin

from lossless_check.subjects.adapters import DraftContext
from lossless_check.subjects.adapters.factory import factory_generator


def _constructor_arguments(model, given: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """What ``_get_candidate_generator`` passes a family's constructor, by parameter name (lazily)."""
    config = given["generation_config"]

    def translator():
        from lossless_check.core.compat import vocab_translator

        return vocab_translator(given["target_tokenizer"], given["assistant_tokenizer"],
                                model.config.get_text_config().vocab_size, given["assistant_model"])

    return {
        "input_ids": lambda: given["input_ids"],
        "inputs_tensor": lambda: given["inputs_tensor"],
        "generation_config": lambda: config,
        "model_kwargs": lambda: given["model_kwargs"],
        "logits_processor": lambda: given["logits_processor"],
        # (GenerationConfig has assistant_early_exit from 4.46)
        "assistant_model": lambda: (model if getattr(config, "assistant_early_exit", None) is not None
                                    else given["assistant_model"]),
        "main_model": lambda: model,
        "target_tokenizer": lambda: given["target_tokenizer"],
        "assistant_tokenizer": lambda: given["assistant_tokenizer"],
        "atm_translator": translator,
        "target_model_input_embeddings": model.get_input_embeddings,
        "main_model_input_embeddings": model.get_input_embeddings,
        "main_model_output_embeddings": model.get_output_embeddings,
        "eos_token_id": lambda: getattr(config, "_eos_token_tensor", None),
        "num_output_tokens": lambda: config.prompt_lookup_num_tokens,
        "max_matching_ngram_size": lambda: config.max_matching_ngram_size or 2,
        "max_length": lambda: config.max_length,
        "vocab_size": lambda: model.config.get_text_config().vocab_size,
    }


def _given(model, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments of a call to the installed ``_get_candidate_generator``, by name, defaults filled in
    (its parameters differ between releases: 4.x takes ``assistant_model`` before ``logits_processor``)."""
    given = inspect.signature(GenerationMixin._get_candidate_generator).bind(model, *args, **kwargs)
    given.apply_defaults()
    return dict(given.arguments)


def _building_with(target, name: str, build: Callable):
    """``target``, its class swapped for a subclass (named ``name`` after its class) whose
    ``_get_candidate_generator`` is ``build(self, given)``, ``given`` the call's arguments by name."""

    def _get_candidate_generator(self, *args, **kwargs):
        return build(self, _given(self, args, kwargs))

    target.__class__ = type(f"{type(target).__name__}{name}", (type(target),),
                            {"_get_candidate_generator": _get_candidate_generator})
    return target


def driving(target, generator_class: type, base: type):
    """``target``, its class swapped for a subclass whose ``generate()`` drafts with ``generator_class``.

    ``generator_class`` subclasses the built-in ``base``; it is built with the arguments the
    installed ``generate()`` gives ``base`` (the parameters of ``base.__init__`` on this release,
    by name), where ``generate()`` would have built ``base``.
    """
    wanted = [name for name, p in inspect.signature(base.__init__).parameters.items()
              if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]

    def build(model, given):
        pool = _constructor_arguments(model, given)
        return generator_class(**{name: pool[name]() for name in wanted if name in pool})

    return _building_with(target, f"Drafting{generator_class.__name__}", build)


def drafting_with_factory(target, ctx: DraftContext):
    """``target``, its class swapped for a subclass whose ``generate()`` drafts with what the factory
    ``ctx.generator_class`` returns, called where ``generate()`` builds its candidate generator.

    The factory gets ``ctx`` as that call sees it: ``generate()``'s generation config, logits
    processors and ``model_kwargs`` (the target's live cache among them), the generating model as
    ``target`` and the call's ``input_ids`` as ``prompt_ids``; one call per ``generate()``, as
    ``generate()`` builds a generator per call.
    """
    factory = ctx.generator_class

    def build(model, given):
        return factory_generator(factory, replace(
            ctx, generation_config=given["generation_config"], processors=given["logits_processor"], target=model,
            prompt_ids=given["input_ids"], model_kwargs=given["model_kwargs"]))

    return _building_with(target, f"DraftingWith{getattr(factory, '__name__', 'Factory')}", build)


__all__ = ["drafting_with_factory", "driving"]
