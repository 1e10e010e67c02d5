"""Multi-token drafting from one position (`SinglePositionMultiTokenCandidateGenerator`, Gemma 4 assistants).

Written by `lossless-check export-tests`; imports only torch, transformers, pytest, numpy and scipy (through the
shared helper `_speculative_laws.py`, which states the statistics and the false-failure rate of all law tests).
The real `generate()` picks the generator itself for a `Gemma4AssistantForCausalLM` assistant; round 1 is the
target's alone, round 2 drafts. Tiny seeded Gemma 4 models (vocabulary 12) built from configs.
- `do_sample=True`: the laws of generated tokens 1 and 2 against plain sampling's exact laws. Detects, e.g.,
  argmax drafts verified against softmax(logits) instead of a point mass.
- `do_sample=False`: greedy equals plain greedy decoding (exact).
"""

import pytest
import torch
import transformers

try:
    from ._speculative_laws import check_greedy, check_sampling
except ImportError:  # the directory is not a package
    from _speculative_laws import check_greedy, check_sampling

candidate_generator = pytest.importorskip("transformers.generation.candidate_generator")
if not (hasattr(candidate_generator, "SinglePositionMultiTokenCandidateGenerator")
        and hasattr(transformers, "Gemma4AssistantForCausalLM")):
    pytest.skip("this transformers has no SinglePositionMultiTokenCandidateGenerator", allow_module_level=True)

VOCAB = 12
PROMPT = torch.tensor([[3, 7, 5, 9]])


def text_config(**extra):
    return transformers.Gemma4TextConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, global_head_dim=8, hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0, layer_types=["sliding_attention", "full_attention"], sliding_window=16,
        max_position_embeddings=64, initializer_range=0.5, pad_token_id=None, bos_token_id=None,
        eos_token_id=None, **extra)


def models():
    torch.manual_seed(49)
    target = transformers.Gemma4ForCausalLM(text_config()).eval()
    torch.manual_seed(50)
    config = transformers.Gemma4AssistantConfig(text_config=text_config(num_kv_shared_layers=2),
                                                backbone_hidden_size=16, initializer_range=0.5)
    assistant = transformers.Gemma4AssistantForCausalLM(config).eval()
    assistant.generation_config.num_assistant_tokens = 4
    return target, assistant


def test_single_position_sampling_follows_target_law():
    target, assistant = models()
    check_sampling(target, PROMPT, {"top_k": 0}, 2, {"assistant_model": assistant},
                   "SinglePositionMultiTokenCandidateGenerator")


def test_single_position_greedy_equals_plain_greedy():
    target, assistant = models()
    prompts = [PROMPT, torch.tensor([[1, 2, 3]]), torch.tensor([[11, 0, 4, 4, 8]])]
    check_greedy(target, prompts, {"assistant_model": assistant}, "SinglePositionMultiTokenCandidateGenerator")
