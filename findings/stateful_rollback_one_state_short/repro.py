"""Speculative decoding on linear-attention / SSM targets restores the wrong recurrent state (transformers 5.25.0).

`_assisted_decoding` asks the target's cache to record `num_drafting_tokens` recurrent states while
it verifies a round (`cache.activate_past_recording(recurrent_states_to_keep=...)`), but the
verification forward runs one token more than that: the last accepted token, then the drafts. When
the generator drafted its full length and every draft is rejected, `crop` restores the state from
before the last accepted token (the layer's zeros after the first round), and the target goes on
from a history that lacks a token.

The check is exact: with `do_sample=False` speculative decoding must return plain greedy decoding's
tokens. Tiny seeded models built from configs (no download): Mamba2 (SSM layers only) and
Qwen3-Next (a gated-delta-net linear-attention layer and a full-attention layer), with prompt lookup,
and an unrelated tiny Llama drafting for Mamba2 (AssistedCandidateGenerator, whole drafts rejected).

    python repro.py              # exit 1 where the bug is (5.25.0)
    python repro.py --keep-one-more   # control: the target's cache keeps one more state; exit 0

Exit 1 when any speculative call differs from plain greedy decoding, 0 when none does (or the
release refuses these targets: nothing to reproduce).
"""

import argparse
import sys
import time

import torch
import transformers
from transformers import (
    DynamicCache,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    Mamba2Config,
    Mamba2ForCausalLM,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)
from transformers.utils import logging

VOCAB = 32
PROMPTS = 5
PROMPT_LENGTH = 24
NEW_TOKENS = 12


def mamba2():
    torch.manual_seed(0)
    # initializer_range 1.0: peaked logits (a random model at the default 0.02 is nearly uniform: argmax ties)
    return Mamba2ForCausalLM(Mamba2Config(
        vocab_size=VOCAB, hidden_size=16, state_size=4, num_hidden_layers=2, expand=2, conv_kernel=4, num_heads=4,
        head_dim=8, n_groups=1, chunk_size=8, initializer_range=1.0)).eval()


def qwen3_next():
    torch.manual_seed(0)
    return Qwen3NextForCausalLM(Qwen3NextConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"], num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_conv_kernel_dim=4, moe_intermediate_size=16, shared_expert_intermediate_size=16, num_experts=2,
        num_experts_per_tok=1, initializer_range=1.0)).eval()


def llama_drafter():
    """An unrelated drafter over the same vocabulary: most of its drafts are rejected."""
    torch.manual_seed(1)
    drafter = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, initializer_range=1.0)).eval()
    # A constant draft length, no confidence stop: every round drafts num_assistant_tokens
    drafter.generation_config.num_assistant_tokens = 4
    drafter.generation_config.num_assistant_tokens_schedule = "constant"
    drafter.generation_config.assistant_confidence_threshold = 0.0
    return drafter


class KeepOneMore(DynamicCache):
    """The control: the cache the loop records in keeps one recurrent state more than it is asked to."""

    def activate_past_recording(self, recurrent_states_to_keep=None, **kwargs):
        if recurrent_states_to_keep is not None:
            recurrent_states_to_keep += 1
        super().activate_past_recording(recurrent_states_to_keep=recurrent_states_to_keep, **kwargs)


def config(**routing) -> GenerationConfig:
    # eos outside the vocabulary: every call emits NEW_TOKENS tokens
    return GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=0, eos_token_id=VOCAB, **routing)


def compare(name: str, model, keep_one_more: bool, fields: dict, assistant=None) -> int:
    """Greedy speculative decoding (``fields`` of the generation config, an ``assistant``) against plain greedy
    decoding on PROMPTS seeded prompts; returns how many differ."""
    g = torch.Generator().manual_seed(2)
    differ, first = 0, None
    started = time.perf_counter()
    for _ in range(PROMPTS):
        # Prompt tokens from 8 of the 32: prompt lookup finds n-gram matches to draft from
        prompt = torch.randint(0, 8, (1, PROMPT_LENGTH), generator=g)
        kwargs = {"assistant_model": assistant} if assistant is not None else {}
        if keep_one_more:
            kwargs["cache"] = KeepOneMore(config=model.config)
        with torch.no_grad():
            plain = model.generate(prompt, generation_config=config())
            speculative = model.generate(prompt, generation_config=config(**fields), **kwargs)
        if not torch.equal(plain, speculative):
            differ += 1
            if first is None:
                j = int((plain[0] != speculative[0]).nonzero()[0])
                with torch.no_grad():  # the uncached forward on the common prefix: what the target's argmax is there
                    logits = model(plain[:, :j], use_cache=False).logits[0, -1]
                first = (f"first at output position {j - PROMPT_LENGTH + 1}: speculative {int(speculative[0, j])}, "
                         f"plain {int(plain[0, j])}; the uncached forward's argmax is {int(logits.argmax())}, "
                         f"{float(logits.max() - logits[int(speculative[0, j])]):.2f} logits above the speculative token")
    what = ", ".join([f"{k}={v}" for k, v in fields.items()] + (["assistant_model=tiny Llama"] if assistant else []))
    print(f"{name:<11} {what:<30} differs from plain greedy decoding on {differ:>2} of {PROMPTS} prompts "
          f"({time.perf_counter() - started:.1f} s)" + (f"; {first}" if first else ""))
    return differ


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep-one-more", action="store_true",
                        help="control: the target's cache records one more recurrent state than the loop asks for")
    args = parser.parse_args()
    logging.set_verbosity_error()  # the pure-PyTorch fallbacks of the SSM kernels warn once each
    print(f"transformers {transformers.__version__}, torch {torch.__version__}"
          + (" (control: the cache keeps one more recurrent state)" if args.keep_one_more else ""))
    target = mamba2()
    try:
        target.generate(torch.zeros(1, 2, dtype=torch.long), generation_config=config(prompt_lookup_num_tokens=1))
    except ValueError as exc:  # releases before 5.25.0 refuse stateful targets
        print(f"nothing to reproduce: this release refuses speculative decoding on a Mamba2 target ({exc})")
        return 0
    hybrid = qwen3_next()
    runs = [("Mamba2", target, {"prompt_lookup_num_tokens": 10}, None),
            ("Qwen3-Next", hybrid, {"prompt_lookup_num_tokens": 4}, None),
            ("Mamba2", target, {}, llama_drafter())]
    differ = sum(compare(name, model, args.keep_one_more, fields, assistant) for name, model, fields, assistant in runs)
    lossless = differ == 0
    print(f"verdict: {'consistent with lossless (identical to plain greedy decoding)' if lossless else 'NOT LOSSLESS'}: "
          f"{differ} of {len(runs) * PROMPTS} greedy speculative calls differ from plain greedy decoding (exact)")
    return 0 if lossless else 1


if __name__ == "__main__":
    sys.exit(main())
