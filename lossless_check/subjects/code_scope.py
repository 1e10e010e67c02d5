"""Which code a run's coverage report measures, and why some of its lines are out of a run's reach.

The subject's code is the speculative decoding of the installed ``transformers`` (:func:`subject_files`):
every function of ``generation/candidate_generator.py``; ``_assisted_decoding``, ``_speculative_sampling`` and
``_get_candidate_generator`` of ``generation/utils.py``; the cache classes' rollback methods of ``cache_utils.py``
(``crop`` and ``activate_past_recording`` of every cache and cache layer kind the release has); and every
function of a user's own generator module (a ``module:attr`` spec). Paths are found without importing the
modules (:func:`importlib.util.find_spec` of the top-level package), so a process can start measuring before
``transformers`` is imported and its import-time lines count as run.

A line a run never executes is either a gap (a case could run it) or out of reach on purpose: an error raised
on a misuse, an abstract method, a multi-GPU path. :func:`out_of_reach` says which, with the reason; the
report lists those lines with their reasons instead of hiding them.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

#: ``generation/utils.py``'s functions of speculative decoding (older releases name the loop ``assisted_decoding``).
LOOP_FUNCTIONS = ("_assisted_decoding", "assisted_decoding", "_speculative_sampling", "_get_candidate_generator")
#: The rollback methods of ``cache_utils.py``: what ``_assisted_decoding`` calls to undo rejected drafts.
ROLLBACK_METHODS = ("crop", "activate_past_recording")


@dataclass(frozen=True)
class CodeFile:
    """One measured source file: ``functions`` the last components of the qualified names reported
    (``None``: every function of the file, and the file's own total)."""

    module: str
    path: str
    functions: tuple[str, ...] | None = None

    def selects(self, qualname: str) -> bool:
        """Whether the report shows function region ``qualname`` (``""`` is the module's own code)."""
        if self.functions is None:
            return True
        return bool(qualname) and qualname.rpartition(".")[2] in self.functions


def module_path(module: str) -> str | None:
    """The source file of ``module`` (dotted), found without importing it where its package allows; ``None``
    when there is none."""
    top, _, rest = module.partition(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    if not rest:
        return spec.origin
    base = Path(spec.origin).parent.joinpath(*rest.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return str(candidate)
    return None


def user_module(spec: str) -> str | None:
    """The module of a ``module:attr`` generator spec (``None`` for a built-in name)."""
    module, colon, _ = spec.strip().partition(":")
    return module if colon and module else None


def subject_files(generator_specs=()) -> list[CodeFile]:
    """The files a run measures: the installed release's speculative decoding, and the modules of the
    ``module:attr`` generators among ``generator_specs`` (every function of each)."""
    files = []
    for module, functions in (("transformers.generation.candidate_generator", None),
                              ("transformers.generation.utils", LOOP_FUNCTIONS),
                              ("transformers.cache_utils", ROLLBACK_METHODS)):
        path = module_path(module)
        if path is not None:
            files.append(CodeFile(module, path, functions))
    seen = {f.path for f in files}
    for spec in generator_specs or ():
        module = user_module(spec)
        path = None if module is None else _user_path(module)
        if path is not None and path not in seen:
            seen.add(path)
            files.append(CodeFile(module, path))
    return files


def _user_path(module: str) -> str | None:
    import os
    import sys

    if os.getcwd() not in sys.path:  # as load_attribute resolves the spec: from where the user runs
        sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.origin and spec.origin.endswith(".py") else None


# --------------------------------------------------------------------------------------------------
# Out of reach, on purpose

#: (function name's last component or ``None`` for any, a regular expression on the line's source, the reason).
#: The first that matches a line no run executed gives its reason.
_REASONS: tuple[tuple[str | None, str, str], ...] = (
    (None, r"^raise NotImplementedError\b", "abstract: every concrete generator overrides it"),
    ("_assisted_decoding", r"get_compiled_call",
     "a model torch.compile auto-compiles (a compileable cache on an accelerator)"),
    ("assisted_decoding", r"get_compiled_call",
     "a model torch.compile auto-compiles (a compileable cache on an accelerator)"),
    ("_speculative_sampling", r"^p_prime = p_n_plus_1$",
     "the ensemble's fallback when the residual [p - q]+ sums below float32's smallest normal number after a "
     "rejection: a rejected draft x has p(x) < q(x), which leaves at least q(x) - p(x) of residual elsewhere, so it "
     "needs p = q to float32 precision but at a draft of probability about 1e-30"),
)
#: Functions no ``generate()`` call runs: (qualified name, the reason).
_FUNCTIONS = (
    ("AssistantVocabTranslatorCache.cleanup", "a maintenance method for users: generate() never calls it"),
)
#: ``if`` statements whose body no run can reach here: (a regular expression on the test's source, the reason,
#: whether it applies in this environment).
_GUARDS: tuple[tuple[str, str, object], ...] = (
    (r"is_sklearn_available\(\)", "needs scikit-learn (the assistant's confidence threshold tuned on an ROC curve), "
     "which is not installed here", lambda: importlib.util.find_spec("sklearn") is None),
    (r"synced_gpus", "synced_gpus=True only (several GPUs under FSDP or DeepSpeed ZeRO-3, a peer finished first)",
     lambda: True),
    (r"\bmm_encoder_outputs\b", "multimodal targets only (pre-encoded image or audio features)", lambda: True),
    (r"\bcross_attention_mask\b", "multimodal targets only (Mllama's cross_attention_mask)", lambda: True),
    (r"\bimage_attention_mask\b", "multimodal targets only (IDEFICS's image_attention_mask)", lambda: True),
    (r"^not torch\.is_tensor\(compare_mat\)$", "dead for tensors: compare_mat is `==` of two tensors, a tensor",
     lambda: True),
    (r"^not self\.is_indexer_initialized or self\.indexer_keys\.numel\(\) == 0$",
     "an indexed layer cropped before any indexer key was written: every indexed model of the release writes its "
     "indexer keys in each forward, and generate() crops only after a forward", lambda: True),
)
#: The same for the ``else`` of such an ``if``.
_ELSE_GUARDS: tuple[tuple[str, str, object], ...] = (
    (r"^self\.logits_processor is not None$", "a generator built with logits_processor=None: generate() always "
     "passes it a LogitsProcessorList (GenerationMixin._get_candidate_generator)", lambda: True),
)
_RAISE = re.compile(r"^raise\s+([A-Za-z_][\w.]*)")


def guarded_lines(source: str) -> dict[int, str]:
    """The lines of ``source`` (a module's text) inside the body of an ``if`` that a guard of :data:`_GUARDS`
    names (or its ``else``: :data:`_ELSE_GUARDS`), with the guard's reason: out of reach wherever they are, whatever a case does."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    lines: dict[int, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        test = ast.get_source_segment(source, node.test) or ""
        for guards, body in ((_GUARDS, node.body), (_ELSE_GUARDS, node.orelse)):
            for pattern, reason, applies in guards:
                if re.search(pattern, test) and applies():
                    for statement in body:
                        for line in range(statement.lineno, statement.end_lineno + 1):
                            lines.setdefault(line, reason)
                    break
    return lines


def out_of_reach(function: str, source: str) -> str | None:
    """Why line ``source`` (stripped) of function region ``function`` is out of a run's reach on purpose, or
    ``None`` (a gap: a case could execute it). Lines in a guarded block: :func:`guarded_lines`."""
    for name, reason in _FUNCTIONS:
        if function == name:
            return reason
    name = function.rpartition(".")[2]
    for where, pattern, reason in _REASONS:
        if (where is None or where == name) and re.search(pattern, source):
            return reason
    raised = _RAISE.match(source)
    if raised:
        return (f"raises {raised.group(1)} on a misuse or a configuration generate() refuses; the harness "
                f"drives valid ones")
    return None


__all__ = ["CodeFile", "LOOP_FUNCTIONS", "ROLLBACK_METHODS", "guarded_lines", "module_path", "out_of_reach",
           "subject_files", "user_module"]
