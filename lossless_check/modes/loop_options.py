"""Options mode: what ``generate()`` returns and streams beside the tokens, and the loop's options around drafting.

Generate mode checks the law of the emitted tokens; the code of ``_assisted_decoding`` that builds what a user
gets back besides them ran in no case (measured with ``--coverage``). A case here is one generator family on a
fixed-logits scenario, driven through the real ``generate()`` exactly as generate mode drives it
(:func:`~.generate._setup`), with every output option on and a streamer, for :data:`CALLS` sampling calls.
Each call passes an attention mask (and token type ids, or the decoder's mask) over the prompt, as a tokenizer's
output does, so the loop grows and crops them with the candidates. Exact checks, per call (no statistics, no share
of alpha):

- *returned vs emitted*: the streamer received the prompt, then exactly the new tokens of ``sequences``, and
  ``end()`` once;
- *scores*: ``output_scores`` has one row per new token, and row ``i`` is plain sampling's processed scores
  after ``prompt + tokens[:i]`` (the target's logits there through the processors ``generate()`` builds for the
  same config, :func:`~lossless_check.laws.warpers.capture_processors`): equal, element for element;
- *logits*: ``output_logits`` row ``i`` is the target's raw logits there, equal element for element;
- *hidden states*: one entry per new token;
- *shapes*: every per-token output (attentions, cross-attentions, hidden states) is shaped as plain decoding's
  (the same target and config without the drafter; shapes depend on the position only);
- *heuristic schedule* (families whose generator subclasses ``AssistedCandidateGenerator`` with an assistant
  model, MTP excepted): the assistant's ``num_assistant_tokens_schedule`` is ``"heuristic"``, so the draft length
  moves across rounds, and after each call the assistant's config holds the length the call's generator ended
  with (what ``generate()`` restores for the next call).

For the assisted family, greedy speculative decoding with a cache of each layer kind the release rolls back
(sliding window, static: :mod:`.cache_kinds`) must give plain greedy decoding's tokens; on the encoder-decoder
scenario, so must greedy speculative decoding with a decoder-only assistant (DistilWhisper's case).

Beside the row, where the release has ``assistant_ensemble_weight`` and the family drafts with an assistant model
(the assisted family): greedy decoding with ``assistant_ensemble_weight=0.5``, the branch that keeps a draft when
it is the argmax of ``w p + (1 - w) q``. It is lossy by design (the drafter's law enters the output), so it is never
called lossless: the reason says whether it departed from plain greedy decoding here.
"""

from __future__ import annotations

import copy
import time

import torch

from lossless_check.core.errors import GeneratorFailure
from lossless_check.evidence.results import Case, CaseResult, one_line
from lossless_check.laws.stubs import fixed_logits_lm
from lossless_check.laws.warpers import capture_processors
from lossless_check.modes import loop_models
from lossless_check.modes.cache_kinds import check_cache_kinds
from lossless_check.modes.seq2seq import check_decoder_only_assistant, is_seq2seq
from lossless_check.modes.randomness import seed_streams
from lossless_check.running.chunks import deadline, guarded
from lossless_check.subjects.adapters.mtp import _quiet_loading

#: Sampling ``generate()`` calls per case.
CALLS = 12
#: Every output option ``generate()`` has, on.
OUTPUT_OPTIONS = {"return_dict_in_generate": True, "output_scores": True, "output_logits": True,
                  "output_hidden_states": True, "output_attentions": True}
#: The weight of the greedy ensemble variant run beside the row.
ENSEMBLE_WEIGHT = 0.5
#: What a greedy config leaves out of a sampling one.
SAMPLING_ONLY = ("temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff")


#: The stack of an options case: processors that change the scores (so that "scores are the processed logits"
#: is not "scores are the logits").
OPTIONS_STACK = {"top_k": 3, "temperature": 0.7}


def options_cases(generators: list, scenario, stacks: list | None = None) -> list[Case]:
    """One options case per resolved generator and stack (default :data:`OPTIONS_STACK`) on ``scenario``."""
    return [Case(g, dict(stack), "options", scenario) for g in generators for stack in (stacks or [OPTIONS_STACK])]


def skip_reason(case: Case) -> str | None:
    """Why options mode cannot drive this case (generate mode's reasons; a scenario without fixed logits)."""
    from lossless_check.laws.scenarios import Scenario
    from lossless_check.modes.generate import skip_reason as generate_skip

    if not isinstance(case.scenario, Scenario):
        return "options mode checks scores against fixed logits: it runs on the fixed-logits scenarios"
    return generate_skip(case)


class RecordingStreamer:
    """A streamer (``put``/``end``, as ``BaseStreamer``) keeping what it was given."""

    def __init__(self):
        self.puts: list[list[int]] = []
        self.ends = 0

    def put(self, value) -> None:
        self.puts.append(value.detach().cpu().reshape(-1).tolist())

    def end(self) -> None:
        self.ends += 1


def _with_attentions(module, args, kwargs, output):
    """A forward hook: attention weights (zeros, one layer, several heads) when ``output_attentions`` is asked, as a
    real decoder returns them (the stubs have no attention; 5.24's loop indexes ``outputs.attentions[0]``)."""
    if (not kwargs.get("output_attentions") or getattr(output, "attentions", None) is not None
            or hasattr(output, "decoder_attentions")):  # an encoder-decoder stub returns its own
        return output
    from lossless_check.laws.stubs import output_cache

    queries = output.logits.shape[1] if kwargs.get("logits_to_keep") in (None, 0) else None
    ids = kwargs.get("input_ids", args[0] if args else None)
    queries = ids.shape[1] if ids is not None else queries
    from lossless_check.laws.seq2seq_stubs import ATTENTION_HEADS

    cache = output_cache(output)
    keys = cache.get_seq_length() if cache is not None else queries
    output.attentions = (torch.zeros(ids.shape[0], ATTENTION_HEADS, queries, keys),)
    return output


def _taking_token_types(base: type) -> type:
    """``base`` with a ``forward`` that also takes ``token_type_ids`` (and ignores them: the laws are the table's),
    so that ``generate()`` accepts them and the loop grows them with the candidates. The forward keeps ``base``'s
    signature otherwise: ``generate()`` reads it (which inputs the model takes)."""
    import inspect

    def forward(self, *args, token_type_ids=None, **kwargs):
        return base.forward(self, *args, **kwargs)

    signature = inspect.signature(base.forward)
    parameters = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    parameters.append(inspect.Parameter("token_type_ids", inspect.Parameter.KEYWORD_ONLY, default=None))
    parameters += [p for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD]
    forward.__signature__ = signature.replace(parameters=parameters)
    return type(f"{base.__name__}TokenTypes", (base,), {"forward": forward})


def _options_model(model) -> None:
    """Make a decoder-only fixed-logits model take ``token_type_ids`` (:func:`_taking_token_types`) and return
    hidden states at every input position, as a real decoder does (5.25's loop checks their length against its
    input), whatever ``logits_to_keep`` asks of the logits (:class:`~lossless_check.modes.loop_models.FullHiddenStates`).
    Its class gains them: behaviour only, same modules and weights."""
    from lossless_check.laws.stubs import FixedLogitsLM

    if not isinstance(model, FixedLogitsLM) or model.config.is_encoder_decoder:
        return
    base = type(model)
    if not isinstance(model, loop_models.FullHiddenStates):
        base = type(f"{base.__name__}FullHiddenStates", (loop_models.FullHiddenStates, base), {})
    model.__class__ = _taking_token_types(base)


def _keeping_generator(target) -> list:
    """Every candidate generator ``target``'s ``generate()`` builds, in order (an instance attribute over the
    method: the class and transformers are untouched)."""
    built: list = []
    original = target._get_candidate_generator

    def _get_candidate_generator(*args, **kwargs):
        built.append(original(*args, **kwargs))
        return built[-1]

    target._get_candidate_generator = _get_candidate_generator
    return built


def check_call(out, streamer: RecordingStreamer, prompt: list[int], plain, processors) -> list[str]:
    """What differs between one ``generate()`` call's returned outputs, its stream, and plain sampling's scores."""
    problems = []
    tokens = out.sequences[0, len(prompt):].tolist()
    streamed = [t for put in streamer.puts[1:] for t in put]
    if streamer.puts[:1] != [prompt] or streamed != tokens or streamer.ends != 1:
        problems.append(f"the streamer got {streamer.puts} (end() {streamer.ends} times) for sequences {tokens}")
    hidden = "decoder_hidden_states" if hasattr(out, "decoder_hidden_states") else "hidden_states"
    for name in ("scores", "logits", hidden):
        rows = getattr(out, name, None)
        if rows is None or len(rows) != len(tokens):
            problems.append(f"{name}: {None if rows is None else len(rows)} entries for {len(tokens)} new tokens")
    if problems:
        return problems
    with torch.no_grad():
        for i in range(len(tokens)):
            history = torch.tensor([prompt + tokens[:i]])
            raw = plain(history, use_cache=False).logits[:, -1].to(torch.float32)
            expected = processors(history, raw.clone()) if len(processors) else raw
            if not torch.equal(out.logits[i].to(torch.float32), raw):
                problems.append(f"logits[{i}] is not the target's raw logits after {prompt + tokens[:i]}")
            if not torch.equal(out.scores[i].to(torch.float32), expected):
                problems.append(f"scores[{i}] is not plain sampling's processed scores after {prompt + tokens[:i]}")
    return problems


#: The per-token outputs a ``generate()`` call returns beside ``sequences``, ``scores`` and ``logits``.
PER_TOKEN = ("attentions", "hidden_states", "decoder_attentions", "cross_attentions", "decoder_hidden_states")


def _shapes(entry) -> list:
    return [tuple(t.shape) for t in entry] if isinstance(entry, (tuple, list)) else [tuple(entry.shape)]


def shape_problems(out, plain) -> list[str]:
    """Where the per-token outputs of a speculative call are shaped unlike plain decoding's (same model, config and
    options: the shapes depend on the position only, never on the tokens)."""
    problems = []
    for name in PER_TOKEN:
        mine, theirs = getattr(out, name, None), getattr(plain, name, None)
        if mine is None or theirs is None:
            if (mine is None) != (theirs is None):
                problems.append(f"{name}: {'none' if mine is None else 'some'} returned where plain decoding "
                                f"returns {'none' if theirs is None else 'some'}")
            continue
        for i in range(min(len(mine), len(theirs))):
            if _shapes(mine[i]) != _shapes(theirs[i]):
                problems.append(f"{name}[{i}] has shapes {_shapes(mine[i])} where plain decoding returns "
                                f"{_shapes(theirs[i])}")
                break
    return problems


def mask_kwargs(setup) -> dict:
    """An attention mask (and token type ids) over the prompt, as a tokenizer returns them: the loop then grows
    and crops them with the candidates (``_prepare_attention_mask``, ``_prepare_token_type_ids``)."""
    ones = torch.ones_like(setup.prompt_ids)
    if "decoder_input_ids" in setup.generate_kwargs:  # encoder-decoder: the encoder's mask and the decoder's
        return {"attention_mask": ones, "decoder_attention_mask": torch.ones_like(setup.generate_kwargs[
            "decoder_input_ids"])}
    return {"attention_mask": ones, "token_type_ids": torch.zeros_like(setup.prompt_ids)}


def _plain_call(setup, config):
    """Plain decoding's outputs under ``config``: the same target and call, without what routes the family."""
    from transformers import GenerationConfig

    plain_config = copy.deepcopy(config)
    defaults = GenerationConfig()
    for key in setup.routing:
        setattr(plain_config, key, getattr(defaults, key, None))
    kwargs = {k: v for k, v in setup.generate_kwargs.items() if k == "decoder_input_ids"}
    return setup.target.generate(setup.prompt_ids, generation_config=plain_config, **kwargs, **mask_kwargs(setup))


def _heuristic(assistant, built: list) -> str | None:
    """What is wrong with the schedule ``generate()`` restored (``None``: the assistant holds the length the last
    generator ended with)."""
    ended = getattr(built[-1], "num_assistant_tokens", None) if built else None
    held = assistant.generation_config.num_assistant_tokens
    if ended is not None and held != ended:
        return f"the heuristic schedule's draft length ended at {ended} but the assistant's config holds {held}"
    return None


def _drives_heuristic(family: str, assistant) -> bool:
    """Whether ``generate()`` restores a heuristic schedule for this family: an assistant model and a generator
    subclassing ``AssistedCandidateGenerator`` (MTP drafts with the target's own layers)."""
    from transformers.generation.candidate_generator import AssistedCandidateGenerator

    cls = loop_models.installed_class(family)
    return (assistant is not None and hasattr(assistant, "generation_config") and family != loop_models.MTP
            and cls is not None and issubclass(cls, AssistedCandidateGenerator))


def _greedy(setup):
    """The case's generation config for greedy decoding."""
    config = copy.deepcopy(setup.generation_config)
    config.do_sample = False
    for key in SAMPLING_ONLY:
        setattr(config, key, None)
    return config


def _ensemble(setup, prompt_ids) -> str:
    """The greedy ``assistant_ensemble_weight`` branch on this case's models, said in one clause."""
    from transformers import GenerationConfig

    if "assistant_ensemble_weight" not in GenerationConfig().to_dict():
        return ""
    config = _greedy(setup)
    plain = setup.target.generate(prompt_ids, generation_config=copy.deepcopy(config))
    config.assistant_ensemble_weight = ENSEMBLE_WEIGHT
    mixed = setup.target.generate(prompt_ids, generation_config=config, **setup.generate_kwargs)
    differs = "departs from" if not torch.equal(plain, mixed) else "equals"
    return (f"; assistant_ensemble_weight={ENSEMBLE_WEIGHT} (greedy) is lossy by design and not checked for "
            f"losslessness: here it {differs} plain greedy decoding")


def run_options_case(case: Case, seed: int = 0, timeout: float = 600.0) -> CaseResult:
    """The options case: ``lossless`` when every call's outputs, stream and restored schedule are right,
    ``not_lossless`` at the first that is not (the reason says what), ``skipped``, or ``error`` (``generate()``
    raised)."""
    from lossless_check.modes.generate import _setup

    result = case.result()
    reason = skip_reason(case)
    if reason is not None:
        result.verdict, result.reason = "skipped", reason
        return result

    def run() -> CaseResult:
        started = time.perf_counter()
        scenario = case.scenario
        setup = _setup(case, case.max_new_tokens)
        family = case.generator.adapter.name
        config = copy.deepcopy(setup.generation_config)
        for key, value in OUTPUT_OPTIONS.items():
            setattr(config, key, value)
        assistant = setup.generate_kwargs.get("assistant_model")
        heuristic = _drives_heuristic(family, assistant)
        if heuristic:
            assistant.generation_config.num_assistant_tokens_schedule = "heuristic"
        plain = fixed_logits_lm(scenario.target, prompt_length=len(scenario.prompt))
        processors, _ = capture_processors(plain, setup.prompt_ids, case.warpers, case.max_new_tokens,
                                           do_sample=bool(config.do_sample))
        _options_model(setup.target)
        _options_model(setup.generate_kwargs.get("assistant_model"))  # the generator hands it the token types too
        built = _keeping_generator(setup.target)
        hook = setup.target.register_forward_hook(_with_attentions, with_kwargs=True)
        prompt = list(scenario.prompt)
        problems: list[str] = []
        lengths = set()
        reference: list = []  # plain decoding's outputs, once
        seed_streams(seed)
        # _quiet_loading: MTP's generator loads its layers (from_pretrained) at every generate() call.
        with deadline(timeout, "options mode's generate() calls"), _quiet_loading():
            try:
                for _ in range(CALLS):
                    streamer = RecordingStreamer()
                    out = setup.target.generate(setup.prompt_ids, generation_config=config, streamer=streamer,
                                                **setup.generate_kwargs, **mask_kwargs(setup))
                    problems += check_call(out, streamer, prompt, plain, processors)
                    if not reference:
                        reference.append(_plain_call(setup, config))
                        problems += shape_problems(out, reference[0])
                    if heuristic:
                        lengths.add(assistant.generation_config.num_assistant_tokens)
                        problems += [p for p in [_heuristic(assistant, built)] if p]
                ensemble = _ensemble(setup, setup.prompt_ids) if family == loop_models.ASSISTED else ""
                kinds: list[str] = []
                # Every check runs whatever an earlier one found: each is a finding of its own, and code it runs.
                if family == loop_models.ASSISTED and not is_seq2seq(scenario):
                    found, kinds = check_cache_kinds(scenario, _greedy(setup))
                    problems += found
                if family == loop_models.ASSISTED and is_seq2seq(scenario):
                    problems += check_decoder_only_assistant(scenario, _greedy(setup))
            except Exception as exc:  # noqa: BLE001 - the generator under test (or the loop) failed
                raise GeneratorFailure(f"generate() raised {one_line(exc)}") from exc
            finally:
                hook.remove()
        result.samples, result.alpha_case = CALLS, 0.0
        result.seconds = time.perf_counter() - started
        checked = ("sequences, streamed tokens, scores (plain sampling's processed logits), raw logits and hidden "
                   "states agree at every position, and the attentions and hidden states are shaped as plain "
                   "decoding's")
        schedule = (f"; the heuristic draft schedule (lengths {sorted(lengths)} after the calls) was restored into "
                    f"the assistant's config every time" if heuristic else "")
        if is_seq2seq(scenario) and family == loop_models.ASSISTED:
            schedule += ("; greedy speculative decoding with a decoder-only assistant (DistilWhisper's case) keeps plain "
                         "greedy decoding's tokens")
        if kinds:
            schedule += (f"; greedy speculative decoding keeps plain greedy decoding's tokens with a cache of each kind "
                         f"({', '.join(kinds)}), each rolled back by its own crop")
        if problems:
            result.verdict = "not_lossless"
            result.failed_checks = ["outputs"]
            result.reason = f"{problems[0]} ({len(problems)} problem{'s' if len(problems) > 1 else ''} in all)"
        else:
            result.verdict = "lossless"
            result.reason = (f"{CALLS} generate() calls with return_dict_in_generate, every output option and a "
                             f"streamer: {checked}{schedule}")
        result.reason += ensemble
        return result

    return guarded(case, run)


__all__ = ["CALLS", "OUTPUT_OPTIONS", "RecordingStreamer", "check_call", "options_cases", "run_options_case",
           "skip_reason"]
