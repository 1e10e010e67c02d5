"""The ``tiny-llama`` scenario of generate mode: two seeded, randomly initialised 2-layer Llamas."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TinyLlamaScenario:
    """A randomly initialised 2-layer Llama target and a noisy copy of it as drafter (see :func:`tiny_llama_pair`)."""

    name: str = "tiny-llama"
    seed: int = 0
    vocab_size: int = 8
    prompt: tuple[int, ...] = (3, 1, 4)
    gamma: int = 3


TINY_LLAMA = TinyLlamaScenario()


def tiny_llama_pair(seed: int, vocab_size: int = 8, drafter_noise: float = 0.1):
    """``(target, drafter)``: seeded, randomly initialised 2-layer ``LlamaForCausalLM`` models (hidden 16).

    Weights are drawn with ``initializer_range=0.5`` so that next-token laws are far from uniform and
    depend on the context. The drafter is another Llama of the same shape whose weights are the
    target's plus Gaussian noise of scale ``drafter_noise``: it agrees with the target often enough
    that rounds accept several drafts, and disagrees often enough that rejections happen. No BOS,
    EOS or pad token is set; EOS cases pass ``eos_token_id`` as a warper. The global torch RNG is left
    as it was.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, initializer_range=0.5, tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        target = LlamaForCausalLM(config).eval()
        drafter = copy.deepcopy(target)
        with torch.no_grad():
            for weight in drafter.parameters():
                weight.add_(drafter_noise * torch.randn_like(weight))
    return target, drafter
