"""A user's own rejection sampler as the subject: loading it, its two protocols, one call of it, and
putting it in place of the installed ``_speculative_sampling``.

Two protocols (:data:`PROTOCOLS`):

- ``transformers``: the installed ``_speculative_sampling``'s own signature,
  ``(candidate_input_ids, candidate_logits, candidate_length, new_logits, ...)`` returning
  ``(valid_tokens, n_matches)`` with ``valid_tokens`` of shape ``(1, n_matches + 1)``. Releases up to
  5.17 also pass ``is_done_candidate`` (``last_assistant_token_is_eos`` up to 4.38, with
  ``max_matches``); a sampler written with or without them works on every release (see :meth:`Sampler.verify`).
- ``probs``: engine style, ``(draft_probs (k, V), draft_token_ids (k,), target_probs (k + 1, V))``
  returning the emitted token ids (1 to ``k + 1`` of them: the accepted drafts, then one more).

The protocol is read from the signature (:func:`protocol_of`): three required positional parameters
are ``probs``, four or more (or transformers' parameter names) ``transformers``; ``protocol=`` states it
where the signature cannot tell (``*args``). A function that fits neither is a one-line usage error.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from lossless_check.core.errors import GeneratorFailure, UsageError
from lossless_check.core.options import SAMPLER_PROTOCOLS as PROTOCOLS
from lossless_check.core.options import load_attribute

TRANSFORMERS_PARAMETERS = ("candidate_input_ids", "candidate_logits", "candidate_length", "new_logits")
PROBS_PARAMETERS = ("draft_probs", "draft_token_ids", "target_probs")
#: What releases up to 5.17 (4.38) pass after ``new_logits``: whether the candidate already hit a stop.
DONE_PARAMETERS = ("is_done_candidate", "last_assistant_token_is_eos")
#: Optional parameters a ``transformers``-protocol sampler may take, and that a call fills when it does.
KNOWN_OPTIONAL = DONE_PARAMETERS + ("max_matches", "assistant_ensemble_weight")
#: The prompt before the drafts in a call the checks make (``candidate_input_ids = PROMPT + drafts``).
PROMPT = (7, 7)
USAGE = ("a sampler is module:function taking transformers' (candidate_input_ids, candidate_logits, "
         "candidate_length, new_logits, ...) or probs (draft_probs, draft_token_ids, target_probs); "
         "see docs/guides/sampler.md")


class Untraceable(BaseException):
    """The sampler drew randomness an exact check cannot enumerate (raised inside its call by the
    check's controlled primitives). A ``BaseException``, so that a sampler's own ``except Exception``
    does not swallow it."""


class SamplerFailure(GeneratorFailure, RuntimeError):
    """The sampler raised or returned something malformed on a valid input (a verdict, not a harness bug).

    A ``RuntimeError`` too, so that step mode's check for a target plain sampling cannot sample
    (:meth:`~lossless_check.modes.step.StepCase.verified`) sees it as it sees the installed verifier's."""


def _required_positional(parameters) -> list[str]:
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            and p.default is p.empty]


def protocol_of(function: Callable, stated: str | None = None, spec: str = "sampler") -> str:
    """The protocol ``function`` follows: ``stated`` if given (checked against the signature), else read
    from it. Raises a one-line :class:`UsageError` for a function that fits neither."""
    if stated is not None and stated not in PROTOCOLS:
        raise UsageError(f"unknown protocol {stated!r}; known: {', '.join(PROTOCOLS)}")
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):
        if stated is None:
            raise UsageError(f"cannot read the signature of {spec}: state its protocol (--protocol "
                             f"{'|'.join(PROTOCOLS)})") from None
        return stated
    variadic = any(p.kind == p.VAR_POSITIONAL for p in parameters)
    positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = _required_positional(parameters)
    fits = {"probs": variadic or len(positional) >= 3, "transformers": variadic or len(positional) >= 4}
    if stated is not None:
        if not fits[stated] or (stated == "probs" and len(required) > 3):
            raise UsageError(f"{spec} takes ({', '.join(positional)}): it cannot be called with the {stated} "
                             f"protocol's arguments; {USAGE}")
        _check_extra_required(required, stated, spec)
        return stated
    if positional[:4] == list(TRANSFORMERS_PARAMETERS) or (not variadic and len(required) >= 4):
        _check_extra_required(required, "transformers", spec)
        return "transformers"
    if not variadic and len(required) == 3:
        return "probs"
    if variadic:
        raise UsageError(f"{spec} takes *args: state its protocol (--protocol {'|'.join(PROTOCOLS)})")
    raise UsageError(f"{spec} takes ({', '.join(positional)}): neither protocol fits; {USAGE}")


def _check_extra_required(required: list[str], protocol: str, spec: str) -> None:
    """A transformers-protocol sampler may require only the four arguments and the ones a release passes."""
    if protocol != "transformers":
        return
    unknown = [name for name in required[4:] if name not in KNOWN_OPTIONAL]
    if unknown:
        raise UsageError(f"{spec} requires {', '.join(unknown)}, which _speculative_sampling's callers never "
                         f"pass; {USAGE}")


@dataclass(frozen=True)
class Sampler:
    """A rejection sampler under test: its function, how it is called, and how it is named in reports."""

    spec: str
    function: Callable = field(compare=False)
    protocol: str
    parameters: frozenset[str] = field(default_factory=frozenset, compare=False)

    def __reduce__(self):
        # Pickled by name (a run's worker processes import it again): see :func:`load_sampler`.
        return load_sampler, (self.spec, self.protocol)

    # -- calls as the checks make them ---------------------------------------------------------

    def emit(self, target_probs: torch.Tensor, draft_probs: torch.Tensor, drafts: list[int],
             draft_dtype: torch.dtype = torch.float32, is_done: bool = False) -> list[int]:
        """One call on known laws: ``target_probs`` ``(k + 1, V)`` and ``draft_probs`` ``(k, V)`` (float32),
        the ``k`` drafts; the emitted token ids. A ``transformers``-protocol sampler gets their logs as
        logits (``candidate_logits`` in ``draft_dtype``), and ``is_done`` (see :meth:`verify`). Raises
        :class:`SamplerFailure` (one line) when the call raises or returns something either protocol forbids."""
        k = len(drafts)
        if self.protocol == "probs":
            out = self._call(draft_probs.clone(), torch.tensor(drafts, dtype=torch.long), target_probs.clone())
            return self._emitted(out, drafts, target_probs.shape[-1])
        with torch.no_grad():
            candidate_ids = torch.tensor([list(PROMPT) + list(drafts)], dtype=torch.long)
            valid, _ = self.verify(candidate_ids, torch.log(draft_probs)[None].to(draft_dtype), k,
                                   torch.log(target_probs)[None], is_done)
        return valid[0].tolist()

    def verify(self, candidate_input_ids, candidate_logits, candidate_length, new_logits, is_done=False, **extra):
        """The sampler in the calling convention of :func:`~lossless_check.core.compat.speculative_sampling`:
        ``(valid_tokens (1, n + 1), n_matches)`` whatever its protocol.

        ``is_done`` (releases up to 5.17: the candidate hit a stop): passed to a sampler that takes it;
        for one that does not, a full accept then drops the bonus token (``n_matches - 1``), as those
        releases' verifier does. ``extra`` (``assistant_ensemble_weight``, ``max_matches``) goes to a
        sampler that takes it; a value other than ``None`` for one that does not is a :class:`SamplerFailure`.
        """
        k = int(candidate_length)
        drafts = candidate_input_ids[0, candidate_input_ids.shape[1] - k:].tolist()
        if self.protocol == "probs":
            q = candidate_logits.softmax(dim=-1).float()[0]
            p = new_logits.softmax(dim=-1).float()[0]
            tokens = self._emitted(self._call(q, torch.tensor(drafts, dtype=torch.long, device=q.device), p),
                                   drafts, p.shape[-1])
            valid = torch.tensor([tokens], dtype=candidate_input_ids.dtype, device=candidate_input_ids.device)
            n = len(tokens) - 1
            done_taken = False
        else:
            kwargs = {}
            done_name = next((name for name in DONE_PARAMETERS if name in self.parameters), None)
            if done_name is not None:
                kwargs[done_name] = is_done
            if "max_matches" in self.parameters:  # 4.37-4.38: the drafts the length limit lets the round accept
                kwargs["max_matches"] = k
            for name, value in extra.items():
                if name in self.parameters:
                    kwargs[name] = value
                elif value is not None and name != "max_matches":
                    raise SamplerFailure(f"sampler {self.spec} does not take {name} (the loop passes {value!r})")
            valid, n = self._valid(self._call(candidate_input_ids, candidate_logits, candidate_length, new_logits,
                                              **kwargs), drafts, new_logits.shape[-1])
            done_taken = done_name is not None
        if is_done and not done_taken and n == k:
            return valid[:, :k], k - 1
        return valid, n

    def _call(self, *args, **kwargs):
        try:
            return self.function(*args, **kwargs)
        except SamplerFailure:
            raise
        except Exception as exc:  # noqa: BLE001 - what the sampler under test raises is its verdict
            lines = str(exc).strip().splitlines()
            raise SamplerFailure(f"sampler {self.spec} raised {type(exc).__name__}: {lines[0] if lines else ''}"
                                 .rstrip(": ")) from exc

    def _valid(self, out, drafts: list[int], vocab: int) -> tuple[torch.Tensor, int]:
        """``(valid_tokens, n_matches)`` of a transformers-protocol return, checked."""
        if not isinstance(out, (tuple, list)) or len(out) != 2 or not isinstance(out[0], torch.Tensor):
            raise SamplerFailure(f"sampler {self.spec} returned {type(out).__name__}, not (valid_tokens, n_matches)")
        valid, n = out
        try:
            n = int(n)
        except (TypeError, ValueError, RuntimeError):
            raise SamplerFailure(f"sampler {self.spec} returned n_matches {n!r}, not an integer") from None
        if valid.dim() != 2 or valid.shape[0] != 1 or valid.shape[1] != n + 1:
            raise SamplerFailure(f"sampler {self.spec} returned valid_tokens of shape {tuple(valid.shape)} with "
                                 f"n_matches={n}: expected (1, n_matches + 1)")
        self._emitted(valid[0], drafts, vocab)
        return valid, n

    def _emitted(self, out, drafts: list[int], vocab: int) -> list[int]:
        """The emitted ids, checked: 1 to ``k + 1`` integers in the vocabulary, all but the last the drafts."""
        try:
            ids = torch.as_tensor(out).reshape(-1)
        except (TypeError, ValueError, RuntimeError):
            raise SamplerFailure(f"sampler {self.spec} returned {type(out).__name__}, not token ids") from None
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise SamplerFailure(f"sampler {self.spec} returned token ids of dtype {ids.dtype}")
        tokens = [int(t) for t in ids.tolist()]
        k = len(drafts)
        if not 1 <= len(tokens) <= k + 1:
            raise SamplerFailure(f"sampler {self.spec} emitted {len(tokens)} tokens for {k} drafts "
                                 f"(1 to {k + 1} expected): {tokens}")
        if tokens[:-1] != list(drafts[: len(tokens) - 1]):
            raise SamplerFailure(f"sampler {self.spec} emitted {tokens} for drafts {list(drafts)}: every token "
                                 "but the last must be the accepted draft at its position")
        if not all(0 <= t < vocab for t in tokens):
            raise SamplerFailure(f"sampler {self.spec} emitted {tokens}: outside the vocabulary of {vocab}")
        return tokens

    # -- in place of the installed verifier ----------------------------------------------------

    def as_installed(self, installed: Callable) -> Callable:
        """A function with ``installed``'s calling convention (the global ``_assisted_decoding`` calls)
        that runs this sampler (:meth:`verify`)."""
        names = [n for n in inspect.signature(installed).parameters][4:]

        def replaced(candidate_input_ids, candidate_logits, candidate_length, new_logits, *args, **kwargs):
            kwargs.update(zip(names, args))
            done = next((bool(kwargs.pop(n)) for n in DONE_PARAMETERS if n in kwargs), False)
            return self.verify(candidate_input_ids, candidate_logits, candidate_length, new_logits, done, **kwargs)

        replaced.sampler = self
        return replaced


def load_sampler(sampler: str | Callable, protocol: str | None = None) -> Sampler:
    """A :class:`Sampler` from ``module:function`` or a function; raises a one-line :class:`UsageError`."""
    if isinstance(sampler, Sampler):
        return sampler
    if isinstance(sampler, str):
        spec, function = sampler.strip(), load_attribute(sampler, "sampler", "module:function")
    else:
        spec, function = f"{getattr(sampler, '__module__', '?')}:{getattr(sampler, '__qualname__', sampler)}", sampler
    if not callable(function):
        raise UsageError(f"sampler {spec!r} is a {type(function).__name__}, not a function; {USAGE}")
    try:
        parameters = frozenset(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        parameters = frozenset()
    return Sampler(spec, function, protocol_of(function, protocol, spec), parameters)


@contextmanager
def sampler_in_place(sampler: Sampler | None):
    """While active, ``transformers.generation.utils._speculative_sampling`` (the global the installed
    ``_assisted_decoding`` calls) runs ``sampler``; restored after. ``None``: nothing changes."""
    if sampler is None:
        yield
        return
    from transformers.generation import utils

    installed = utils._speculative_sampling
    utils._speculative_sampling = sampler.as_installed(installed)
    try:
        yield
    finally:
        utils._speculative_sampling = installed
