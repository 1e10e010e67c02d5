"""One sampling ``generate()`` call of a ``lossless-check models`` row, and what it gives the statistical check.

**The null is what the call computed.** The sampling call runs with ``return_dict_in_generate=True,
output_scores=True``. In ``_assisted_decoding`` the scores are the rows of ``new_logits``, the target's
logits after every processor (and, before 4.45, after the separate warpers too, applied in place on
``new_logits``), which ``_speculative_sampling`` (or, for a generator returning no q, the loop's own
``new_logits.softmax``) turns into ``p``; one row per emitted token (``n_matches + 1`` a round, counted
after the EOS and length crops). Read in a release of every minor from 4.37 to 5.25 (4.37.0, 4.38.2, 4.39.3,
4.40.0, 4.41.2, 4.42.0, 4.43.4, 4.44.0, 4.45.0, 4.46.3, 4.47.0, 4.48.3, 4.49.0, 4.50.0, 4.51.3, 4.52.4, 4.53.3,
4.54.1, 4.55.4, 4.56.2, 4.57.6, then 5.0.0 to 5.25.0): the same in all, so no release needs the law
recomputed, and no top_k boundary rule is needed (a call whose scores do not number its emitted tokens is an
error). ``p_t`` is the softmax of the score row in its own dtype, as the verifier computes it, then float64:
its support is exactly the verifier's, under every truncating warper (``top_k``, ``top_p``, ``min_p``,
``typical_p``, epsilon, eta) and every float rounding of the cached passes. ``q_t`` (the drafter's processed
law at the prefix, from one uncached pass of the assistant, processed by the very ``LogitsProcessorList``
``generate()`` builds: :func:`~lossless_check.laws.warpers.capture_processors`) only aims the bets.

**Why a lossless decoder satisfies the null** (:mod:`lossless_check.stats.betting`: each emitted token
follows ``p_t`` given all the test has seen). Fix a round and a position ``j`` in it: the state before the
round, the drafts ``d_1..d_j`` so far all accepted (each emitted), the verifier's row ``p_j``. If the round
stops drafting there (``L = j``), the token is the bonus, drawn from ``p_j``. Otherwise ``d_{j+1}`` is drawn
from the returned ``q_j`` (the drafter's contract), accepted with probability ``min(1, p_j / q_j)``, else
the token is drawn from ``norm(max(p_j - q_j, 0))``: the emitted token follows ``q_j min(1, p_j/q_j) +
(1 - sum q_j min(1, p_j/q_j)) norm(max(p_j - q_j, 0)) = p_j`` (Leviathan et al., Algorithm 1). This needs
``p_j`` fixed before ``d_{j+1}`` is drawn: a function of the history and ``d_1..d_j``, not of later drafts.
In exact arithmetic the causal mask guarantees it; in floating point a row's last bits may depend on how
many positions its forward pass holds (which an adaptive drafter can choose from its drafts): that, and
torch's generator being an ideal random source, are what "at most alpha" assumes beyond the algorithm. The
harness's ``q_t``, ``r_t`` and ``V_t`` are functions of the prefix and of an independent stream, so
conditioning on them changes nothing. That the verifier's row is what plain sampling would compute at that
prefix is not this test's null: the two differ by the float rounding of a cached pass (issue 49 measured up
to 1.4e-4 in ``log p``; 6.4e-5 on the close pair of ``fixtures/model_pair.py``), far below any departure a run
resolves, and never a false failure here.

Figures: per emitted position, ``TV(p_t, q_t)`` (how far drafter and target disagree) and the TV to
``p_t`` of the law a round's *first* emitted token would follow if the verifier were handed the
drafter's raw logits while drafts follow its processed law (the seed bug class):
``r = qs min(1, p/qc) + (1 - sum qs min(1, p/qc)) norm(max(0, p - qc))``, ``qs`` the processed and
``qc = softmax(raw)`` the returned law. The correct algorithm (``qc = qs``) gives ``r = p`` exactly.
The test also bets on ``r`` itself (toward-q family): computed from the laws at the prefix, so validity is
untouched.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch

from lossless_check.core.compat import release_warpers
from lossless_check.core.errors import PlainSamplingFails
from lossless_check.evidence.results import one_line
from lossless_check.laws.expected import processed
from lossless_check.laws.warpers import capture_processors, format_warpers
from lossless_check.modes.loop_models import ASSISTED, DIFFERENT_TOKENIZERS, PROMPT_LOOKUP, driving, installed_class
from lossless_check.modes.models.drafting import DraftingRecord, intercepting
from lossless_check.stats.betting import observe_token
from lossless_check.stats.power import PowerCall

#: Prompt lookup's draft length (generate()'s ``prompt_lookup_num_tokens``).
PROMPT_LOOKUP_TOKENS = 4

def _drafter_laws(model, processors, full: torch.Tensor, prompt_length: int,
                  encoder_ids: torch.Tensor | None = None) -> tuple[list, list]:
    """``model``'s processed and raw next-token laws after every prefix of the output (one uncached pass):
    they aim the bets only. ``full``: the (decoder's) ids, its first ``prompt_length`` the prefix; an
    encoder-decoder ``model`` reads ``encoder_ids`` in its encoder, and its processors see the decoder's ids, as
    in generate()."""
    n = full.shape[1] - prompt_length
    inputs = {"input_ids": full} if encoder_ids is None else {"input_ids": encoder_ids, "decoder_input_ids": full}
    with torch.no_grad():
        logits = model(**inputs, use_cache=False).logits[0, prompt_length - 1:prompt_length - 1 + n].float()
    laws, raw = [], []
    for t in range(n):
        row = logits[t:t + 1]
        raw.append(torch.softmax(row[0].double(), dim=-1).cpu().numpy())
        if len(processors) > 0:
            row = processed(processors, full[:, :prompt_length + t], row.clone())
        laws.append(torch.softmax(row[0].double(), dim=-1).cpu().numpy())
    return laws, raw


def _decoder_prefix(record: DraftingRecord, sequences: torch.Tensor) -> int | str:
    """How many of an encoder-decoder's ``sequences`` are the decoder's start, not emitted: the ids generate()
    handed its first drafting round (counted apart from the scores, so that the scores-number-the-tokens check
    still means something); an error line when no round ran or the output does not begin with them."""
    start = record.began_with
    if not start:
        return "generate() ran no drafting round: the decoder's start tokens cannot be told from emitted ones"
    if sequences[0, :len(start)].tolist() != start:
        return (f"generate() returned decoder ids beginning {sequences[0, :len(start)].tolist()}, not the start "
                f"{start} its first drafting round was handed")
    return len(start)


def verifier_laws(scores) -> np.ndarray:
    """The verifier's law at every emitted position from ``generate()``'s scores: the softmax in the scores'
    own dtype (as ``_speculative_sampling`` computes ``p``), then float64 ``(tokens, vocabulary)``."""
    rows = torch.stack([s[0] for s in scores])
    return torch.softmax(rows, dim=-1).double().cpu().numpy()


def raw_logits_law(p: np.ndarray, q_sampled: np.ndarray, q_claimed: np.ndarray) -> np.ndarray:
    """The law of a round's first emitted token when drafts follow ``q_sampled`` and the verifier is given
    ``q_claimed`` (module docstring); ``p`` itself when they are equal."""
    accepted = q_sampled * np.minimum(1.0, p / np.maximum(q_claimed, 1e-300))
    residual = np.maximum(0.0, p - q_claimed)
    return accepted + (1.0 - accepted.sum()) * (residual / residual.sum() if residual.sum() > 0 else 0.0)


def routing(family: str, target, assistant, generator_class, tokenizers=None) -> tuple[object, dict]:
    """The target (the class under test wired in where generate() builds its family) and generate() kwargs
    (``tokenizers``: the target's and the assistant's, for the two-tokenizer family)."""
    kwargs = {} if family == PROMPT_LOOKUP else {"assistant_model": assistant}
    if family == DIFFERENT_TOKENIZERS:
        kwargs.update(tokenizer=tokenizers[0], assistant_tokenizer=tokenizers[1])
    base = installed_class(family)
    if generator_class is not base:
        target = driving(copy.copy(target), generator_class, base)  # a shallow copy: the user's model is untouched
    return target, kwargs


@dataclass(frozen=True)
class RowSettings:
    """Everything one sampling ``generate()`` call of a row depends on (picklable: a task of the engine)."""

    target: str
    assistant: str
    device: str
    generator: str  # the spec resolve_generator takes
    stack: tuple  # the warper stack's items
    prompts: tuple
    max_new_tokens: int
    seed: int


@dataclass
class CallObservation:
    """What one sampling call gave: per emitted token its bets' observation (``None``: outside the
    verifier's support), the call's power-simulation replicates, its TV figures, and its drafting record."""

    record: DraftingRecord
    observations: list = field(default_factory=list)
    power: PowerCall = field(default_factory=PowerCall)
    tv_pq: list = field(default_factory=list)
    bug_tv: list = field(default_factory=list)
    drafter_law: bool = True  # False: no drafter law in the target's vocabulary aimed the bets (q = p)
    error: str = ""  # generate() raised, or its scores do not match its tokens
    skipped: str = ""  # the stack's processors fail on the drafter's pass


#: ``(settings, prompt length) -> processors``, per process: capture_processors builds a model from the config.
_PROCESSORS: dict = {}


def observe_call(settings: RowSettings, call: int) -> CallObservation:
    """Sampling call ``call`` of a row: a function of ``settings`` and ``call`` alone (its torch seed is
    ``seed * 1_000_003 + call``, its PIT uniforms ``default_rng([seed, 11, call])``, its power stream
    ``default_rng([seed, 7, call])``), so it gives the same data in an engine worker as here."""
    from transformers import GenerationConfig

    from lossless_check.modes.models.loading import load_pair
    from lossless_check.subjects.adapters import resolve_generator

    target, assistant = load_pair(settings.target, settings.assistant, settings.device)
    resolved = resolve_generator(settings.generator)
    family, stack = resolved.adapter.name, dict(settings.stack)
    device = next(target.parameters()).device
    config = GenerationConfig(do_sample=True, max_new_tokens=settings.max_new_tokens, return_dict_in_generate=True,
                              output_scores=True, **release_warpers(stack))
    if family == PROMPT_LOOKUP:
        config.prompt_lookup_num_tokens = PROMPT_LOOKUP_TOKENS
    routed, kwargs = routing(family, target, assistant, resolved.generator_class)
    vocab = (assistant if family == ASSISTED else target).get_output_embeddings().weight.shape[0]
    observed = CallObservation(DraftingRecord())
    watched = intercepting(routed, vocab, observed.record)
    prompt = list(settings.prompts[call % len(settings.prompts)])
    encoder_decoder = bool(target.config.is_encoder_decoder)
    # An encoder-decoder model's processors may hold its encoder's input (encoder_repetition_penalty...): per prompt.
    key = (settings.target, settings.device, format_warpers(stack), settings.max_new_tokens,
           tuple(prompt) if encoder_decoder else len(prompt))
    with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device]), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.manual_seed(settings.seed * 1_000_003 + call)
        ids = torch.tensor([prompt], dtype=torch.long, device=device)
        try:
            with torch.no_grad():
                output = watched.generate(ids, generation_config=config, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the generator under test (or the loop) failed
            observed.error = f"generate() raised {one_line(exc)}"
            return observed
        full = output.sequences
        prefix = _decoder_prefix(observed.record, full) if encoder_decoder else len(prompt)
        if isinstance(prefix, str):
            observed.error = prefix
            return observed
        emitted = full[0, prefix:].tolist()
        if len(output.scores) != len(emitted):
            observed.error = (f"generate() returned {len(output.scores)} score rows for {len(emitted)} emitted tokens: "
                              f"the verifier's law cannot be aligned with the tokens")
            return observed
        p_laws = verifier_laws(output.scores)
        try:
            if key not in _PROCESSORS:
                probe = ids if encoder_decoder else torch.zeros((1, len(prompt)), dtype=torch.long)
                _PROCESSORS[key] = capture_processors(target, probe.cpu(), stack, settings.max_new_tokens)[0]
            if assistant.get_output_embeddings().weight.shape[0] == target.get_output_embeddings().weight.shape[0]:
                q_laws, q_raw = _drafter_laws(assistant, _PROCESSORS[key], full, prefix,
                                              ids if encoder_decoder else None)
            else:  # prompt lookup beside an assistant of another vocabulary: nothing aims toward a q
                q_laws = q_raw = list(p_laws)
                observed.drafter_law = False
        except PlainSamplingFails as exc:  # the installed processors themselves fail on a history
            observed.skipped = str(exc)
            return observed
    uniforms = np.random.default_rng([settings.seed, 11, call]).random(len(emitted))
    rng = np.random.default_rng([settings.seed, 7, call])
    for x, p, q, qc, v in zip(emitted, p_laws, q_laws, q_raw, uniforms):
        aimed = raw_logits_law(p, q, qc)
        observed.power.add(p, q, aimed, rng)
        observed.observations.append(observe_token(p, q, aimed, x, v))
        observed.bug_tv.append(0.5 * float(np.abs(aimed - p).sum()))
        observed.tv_pq.append(0.5 * float(np.abs(p - q).sum()))
    return observed


