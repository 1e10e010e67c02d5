"""A user's model pair and prompts: local checkpoints, offline, checked before any work; both decoder-only
(``AutoModelForCausalLM``) or both encoder-decoder (``AutoModelForSeq2SeqLM``), as their saved configs say."""

from __future__ import annotations

from pathlib import Path

from lossless_check.core.errors import UsageError

#: Built-in prompts: this many seeded random token-id prompts of :data:`PROMPT_LENGTH` tokens.
BUILTIN_PROMPTS, PROMPT_LENGTH = 8, 8


def check_checkpoint_dir(path: str, option: str) -> None:
    """A directory holding a ``config.json`` (what ``from_pretrained`` reads first); one-line error otherwise."""
    folder = Path(path)
    if not folder.is_dir():
        raise UsageError(f"{option} {path!r} is not a directory")
    if not (folder / "config.json").is_file():
        raise UsageError(f"{option} {path!r} has no config.json: not a saved model (save_pretrained writes one)")


def check_prompts_file(path: str | None) -> None:
    if path is not None and not Path(path).is_file():
        raise UsageError(f"--prompts {path!r} is not a file")


def is_encoder_decoder(path: str, option: str) -> bool:
    """What the saved config says (``AutoConfig``, offline): an encoder-decoder model or a decoder-only one."""
    from transformers import AutoConfig

    check_checkpoint_dir(path, option)
    try:
        return bool(AutoConfig.from_pretrained(path, local_files_only=True).is_encoder_decoder)
    except Exception as exc:  # noqa: BLE001 - a broken or foreign config is the user's input
        raise UsageError(f"{option} {path!r} cannot be loaded: {_first_line(exc)}") from None


def load_model(path: str, device: str, option: str, encoder_decoder: bool = False):
    """``AutoModelForSeq2SeqLM`` (``encoder_decoder``) or ``AutoModelForCausalLM`` ``.from_pretrained(path,
    local_files_only=True)`` in eval mode on ``device``."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    from lossless_check.subjects.adapters.mtp import _quiet_loading

    check_checkpoint_dir(path, option)
    auto = AutoModelForSeq2SeqLM if encoder_decoder else AutoModelForCausalLM
    try:
        with _quiet_loading():
            model = auto.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - a broken or foreign checkpoint is the user's input
        raise UsageError(f"{option} {path!r} cannot be loaded: {_first_line(exc)}") from None
    try:
        return model.to(device).eval()
    except Exception as exc:  # noqa: BLE001 - e.g. --device cuda without a GPU
        raise UsageError(f"--device {device!r}: {_first_line(exc)}") from None


#: The pair this process has loaded: ``(target, assistant, device) -> (target model, assistant model)``.
_LOADED: dict[tuple[str, str, str], tuple] = {}


def load_pair(target: str, assistant: str, device: str) -> tuple:
    """Both models, loaded once per process (the run's own, or an engine worker's)."""
    key = (target, assistant, device)
    if key not in _LOADED:
        encoder_decoder = check_same_kind(target, assistant)
        _LOADED.clear()  # one pair at a time: a model can be large
        _LOADED[key] = (load_model(target, device, "--target", encoder_decoder),
                        load_model(assistant, device, "--assistant", encoder_decoder))
    return _LOADED[key]


def check_same_kind(target: str, assistant: str) -> bool:
    """Whether the pair is encoder-decoder; a one-line :class:`UsageError` when the two configs disagree (a
    decoder-only assistant beside an encoder-decoder target, as generate() allows for Whisper, is not driven:
    the drafter's laws that aim the bets come from an encoder-decoder pass)."""
    mine, theirs = is_encoder_decoder(target, "--target"), is_encoder_decoder(assistant, "--assistant")
    if mine != theirs:
        kinds = {True: "an encoder-decoder", False: "a decoder-only"}
        raise UsageError(f"--target {target!r} is {kinds[mine]} model and --assistant {assistant!r} is {kinds[theirs]} "
                         f"one (is_encoder_decoder in their config.json): a model pair must be of one kind")
    return mine


def load_tokenizer(path: str, option: str = "--target"):
    """The tokenizer saved in a model's folder, or ``None`` when the folder has none."""
    folder = Path(path)
    if not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        raise UsageError(f"{option} {path!r}: its tokenizer cannot be loaded: {_first_line(exc)}") from None


def read_prompts(path: str | None, tokenizer, vocab_size: int, seed: int) -> list[list[int]]:
    """Prompts as token ids: one per non-empty line of ``path`` (text through ``tokenizer``, or
    space-separated token ids when there is none), else :data:`BUILTIN_PROMPTS` seeded random ones."""
    import numpy as np

    if path is None:
        rng = np.random.default_rng([seed, 42])
        return [[int(t) for t in rng.integers(0, vocab_size, PROMPT_LENGTH)] for _ in range(BUILTIN_PROMPTS)]
    prompts = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        if tokenizer is not None:
            ids = tokenizer(line, add_special_tokens=True)["input_ids"]
        else:
            try:
                ids = [int(t) for t in line.split()]
            except ValueError:
                raise UsageError(f"--prompts {path}:{number}: no tokenizer beside the target, so a line must be "
                                 f"token ids separated by spaces") from None
            if any(not 0 <= t < vocab_size for t in ids):
                raise UsageError(f"--prompts {path}:{number}: token ids must lie in [0, {vocab_size})")
        if not ids:
            raise UsageError(f"--prompts {path}:{number}: the prompt has no tokens")
        prompts.append(list(ids))
    if not prompts:
        raise UsageError(f"--prompts {path!r} has no prompt (one per line)")
    return prompts


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def tokenizers_differ(target: str, assistant: str) -> bool:
    """Whether both folders hold a tokenizer and their vocabularies differ (the two-tokenizer family applies)."""
    mine, theirs = load_tokenizer(target), load_tokenizer(assistant, "--assistant")
    return mine is not None and theirs is not None and mine.get_vocab() != theirs.get_vocab()
