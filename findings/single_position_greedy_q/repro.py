#!/usr/bin/env python
"""SinglePositionMultiTokenCandidateGenerator drafts greedily but returns its softmax as q.

Standalone reproduction: imports only torch and transformers. Nothing is downloaded: a tiny seeded
Gemma4ForCausalLM target and a tiny seeded Gemma4AssistantForCausalLM (both shipped by
transformers >= 5.8 and built here from configs), nothing overridden.

What runs: the real `target.generate(prompt, assistant_model=assistant, do_sample=True, top_k=0,
max_new_tokens=3)`, which builds the real SinglePositionMultiTokenCandidateGenerator (the assistant
is a Gemma4Assistant) and verifies its drafts with the real `_speculative_sampling`. The generator
skips the first round (the target runs alone and samples token 1 plainly); in round 2 it drafts
from the target's hidden state and shared KV states, and the verifier decides token 2. The law of
token 2 is compared with its exact law under plain sampling with the same generation config:
sum over t1 of p(t1 | prompt) p(t2 | prompt, t1), from the target's own logits.

The bug (transformers 5.24.0, generation/candidate_generator.py): each draft is the argmax of the
assistant's logits (line 1348), but those raw logits are returned as q (lines 1351, 1358-1359), and
`_assisted_decoding` runs `_speculative_sampling` whenever do_sample=True and q is not None
(generation/utils.py lines 4117-4118). A draft drawn from a point mass is verified as if it had
been drawn from softmax(logits): it is accepted with probability min(1, p/q) instead of p, so the
drafted token is over-emitted.

    python repro.py               # exits 1: the bug reproduces
    python repro.py --one-hot-q   # control, the natural fix: the generator returns a one-hot q for
                                  # its argmax drafts (a subclass); exits 0
    python repro.py --plain       # control: no assistant (checks the expected law); exits 0

Exit code: 1 when the run rejects "token 2 follows the target law" (bug reproduces), 0 when the
run is consistent with lossless, 2 on bad usage. The false-rejection probability of a lossless
generator is at most --alpha (default 1e-6), at any --samples: see `law_test`.
"""

import argparse
import math
import sys
import time

import torch
import transformers
import transformers.generation.utils as generation_utils

try:  # both appear in transformers 5.8
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4ForCausalLM, Gemma4TextConfig
    from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator
except ImportError:
    SinglePositionMultiTokenCandidateGenerator = None

# ----------------------------------------------------------------------------------------------
# Statistics (no numpy/scipy): TV with a finite-sample threshold, a KT-mixture likelihood ratio
# (an e-value, valid at any n), and Pearson's chi-square with its asymptotic p-value for reference.
# ----------------------------------------------------------------------------------------------


def chi2_sf_log10(x, df):
    """log10 of the upper tail of a chi-square(df) at x (regularized incomplete gamma Q)."""
    a, z = df / 2.0, x / 2.0
    if z <= 0:
        return 0.0
    log_front = -z + a * math.log(z) - math.lgamma(a)
    if z < a + 1:  # series for P(a, z)
        term = total = 1.0 / a
        k = a
        while abs(term) > abs(total) * 1e-15:
            k += 1
            term *= z / k
            total += term
        lower = math.exp(log_front) * total
        return math.log10(max(1.0 - lower, 1e-300))
    tiny = 1e-300  # Lentz's continued fraction for Q(a, z)
    b = z + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 100000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return (log_front + math.log(h)) / math.log(10)


def fmt_p(log10_p):
    return "1" if log10_p >= 0 else ("%.2g" % 10 ** log10_p if log10_p > -300 else "1e%d" % math.floor(log10_p))


def law_test(counts, expected, alpha):
    """Test H0 "the samples behind `counts` are iid from `expected`" over fixed cells.

    - support: a sample in a cell of probability 0 rejects exactly;
    - TV: E[TV_hat] <= 1/2 sum_k sqrt(p_k (1 - p_k) / n), and TV_hat moves by at most 1/n per
      sample, so McDiarmid gives P(TV_hat >= that + t) <= exp(-2 n t^2) at every n;
    - KT: E = m_KT(counts) / prod_k p_k^c_k, with m_KT the Krichevsky-Trofimov (Dirichlet(1/2))
      mixture; E is a likelihood ratio with mean 1 under H0, so P(E >= 1/a) <= a (Markov), at
      every n: p <= 1/E.
    Each test gets alpha/2; H0 is rejected when either rejects (Bonferroni: size <= alpha).
    """
    n = sum(counts)
    k = len(counts)
    support_fail = any(c > 0 and p <= 0 for c, p in zip(counts, expected))
    tv = 0.5 * sum(abs(c / n - p) for c, p in zip(counts, expected))
    mean_bound = 0.5 * sum(math.sqrt(p * (1 - p) / n) for p in expected)
    tv_threshold = mean_bound + math.sqrt(math.log(2 / alpha) / (2 * n))
    log10_p_tv = 0.0 if tv <= mean_bound else -2 * n * (tv - mean_bound) ** 2 / math.log(10)
    if support_fail:
        log_e = math.inf
    else:
        log_m = math.lgamma(k / 2) - math.lgamma(n + k / 2)
        log_m += sum(math.lgamma(c + 0.5) - math.lgamma(0.5) for c in counts)
        log_e = log_m - sum(c * math.log(p) for c, p in zip(counts, expected) if c > 0)
    log10_p_kt = min(0.0, -log_e / math.log(10))
    cells = [(c, p) for c, p in zip(counts, expected) if p > 0]
    x2 = sum((c - n * p) ** 2 / (n * p) for c, p in cells)
    log10_p_x2 = chi2_sf_log10(x2, len(cells) - 1) if len(cells) > 1 else 0.0
    log10_half_alpha = math.log10(alpha / 2)
    reject = support_fail or tv > tv_threshold or log10_p_kt <= log10_half_alpha
    return dict(n=n, tv=tv, tv_threshold=tv_threshold, log10_p_tv=log10_p_tv, log_e=log_e,
                log10_p_kt=log10_p_kt, x2=x2, df=len(cells) - 1, log10_p_x2=log10_p_x2,
                support_fail=support_fail, reject=reject)


# ----------------------------------------------------------------------------------------------
# Models, built inline
# ----------------------------------------------------------------------------------------------

VOCAB = 12
TARGET_SEED, ASSISTANT_SEED = 49, 50  # a pair whose greedy draft is often a likely target token
PROMPT = [3, 7, 5, 9]


def text_config(**extra):
    return Gemma4TextConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, global_head_dim=8, hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0, layer_types=["sliding_attention", "full_attention"], sliding_window=16,
        max_position_embeddings=64, initializer_range=0.5, pad_token_id=None, bos_token_id=None,
        eos_token_id=None, **extra)


def tiny_gemma4_pair(target_seed, assistant_seed, draft_tokens):
    torch.manual_seed(target_seed)
    target = Gemma4ForCausalLM(text_config()).eval()
    torch.manual_seed(assistant_seed)
    config = Gemma4AssistantConfig(text_config=text_config(num_kv_shared_layers=2), backbone_hidden_size=16,
                                   initializer_range=0.5)
    assistant = Gemma4AssistantForCausalLM(config).eval()
    assistant.generation_config.num_assistant_tokens = draft_tokens
    return target, assistant


def one_hot_q_generator():
    class OneHotQGenerator(SinglePositionMultiTokenCandidateGenerator):
        """Control (the natural fix, from outside): q is the point mass the argmax drafts come from."""

        def get_candidates(self, input_ids, *args, **kwargs):
            candidate_ids, logits = super().get_candidates(input_ids, *args, **kwargs)
            if logits is None:
                return candidate_ids, logits
            drafts = candidate_ids[:, -logits.shape[1]:]
            one_hot = torch.full_like(logits, -float("inf")).scatter(-1, drafts[..., None], 0.0)
            return candidate_ids, one_hot

    return OneHotQGenerator


# ----------------------------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=1000, help="generate() calls (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alpha", type=float, default=1e-6, help="false-rejection bound (default 1e-6)")
    parser.add_argument("--one-hot-q", action="store_true",
                        help="control: the generator returns a one-hot q for its argmax drafts (must exit 0)")
    parser.add_argument("--plain", action="store_true",
                        help="control: generate() without the assistant (checks the expected law; must exit 0)")
    args = parser.parse_args(argv)
    if args.samples < 1 or not 0 < args.alpha < 1:
        parser.error("--samples must be >= 1 and 0 < --alpha < 1")
    if SinglePositionMultiTokenCandidateGenerator is None:
        print(f"transformers {transformers.__version__} has no SinglePositionMultiTokenCandidateGenerator "
              "(added in 5.8.0): nothing to reproduce (exit 0)")
        return 0
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    started = time.time()

    target, assistant = tiny_gemma4_pair(TARGET_SEED, ASSISTANT_SEED, draft_tokens=4)
    prompt = torch.tensor([PROMPT])
    # Exact laws: token 1 from the prompt; token 2 from the prompt and each possible token 1.
    with torch.no_grad():
        p1 = target(prompt).logits[0, -1].float().softmax(-1)
        extended = torch.cat([prompt.repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], dim=1)
        p2_given_t1 = target(extended).logits[:, -1].float().softmax(-1)
    p2 = (p1[:, None] * p2_given_t1).sum(0).tolist()
    p1 = p1.tolist()

    # Watch the real verifier: record what the generator handed it (then call it unchanged).
    real_speculative_sampling = generation_utils._speculative_sampling
    real_generator = generation_utils.SinglePositionMultiTokenCandidateGenerator
    seen = {"rounds": 0, "first_drafts": [0] * VOCAB, "argmax": 0, "q_sum": 0.0, "accepted": 0}

    def watched_speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits, *a, **kw):
        draft = int(candidate_input_ids[0, -candidate_length])
        seen["rounds"] += 1
        seen["first_drafts"][draft] += 1
        seen["argmax"] += int(int(candidate_logits[0, 0].argmax()) == draft)
        seen["q_sum"] += float(candidate_logits[0, 0].float().softmax(-1)[draft])
        out = real_speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits, *a, **kw)
        seen["accepted"] += int(int(out[1]) > 0)
        return out

    generation_utils._speculative_sampling = watched_speculative_sampling
    if args.one_hot_q:
        generation_utils.SinglePositionMultiTokenCandidateGenerator = one_hot_q_generator()
    torch.manual_seed(args.seed)
    counts1, counts2 = [0] * VOCAB, [0] * VOCAB
    kwargs = dict(do_sample=True, top_k=0, max_new_tokens=3)
    if not args.plain:
        kwargs.update(assistant_model=assistant)
    try:
        for _ in range(args.samples):
            out = target.generate(prompt, **kwargs)
            counts1[int(out[0, len(PROMPT)])] += 1
            counts2[int(out[0, len(PROMPT) + 1])] += 1
    finally:
        generation_utils._speculative_sampling = real_speculative_sampling
        generation_utils.SinglePositionMultiTokenCandidateGenerator = real_generator

    # Report
    mode = "SinglePositionMultiTokenCandidateGenerator" + (" returning a one-hot q (control)" if args.one_hot_q else "")
    mode = "plain sampling (control, no assistant)" if args.plain else mode
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: {mode}; "
          f"generate(do_sample=True, top_k=0, max_new_tokens=3), seed {args.seed}")
    print(f"models: Gemma4ForCausalLM target and Gemma4AssistantForCausalLM, vocab {VOCAB}, hidden 16, 2 layers, "
          f"seeded random weights; prompt {PROMPT}")
    r1 = law_test(counts1, p1, args.alpha)
    print(f"token 1 (round 1: the generator does not draft, the target samples alone): TV {r1['tv']:.4f}, "
          f"p <= {fmt_p(min(r1['log10_p_kt'], r1['log10_p_tv']) + math.log10(2))} "
          f"({'as expected' if not r1['reject'] else 'UNEXPECTED: the expected law is off'})")

    rounds = max(seen["rounds"], 1)
    print(f"\ntoken 2 (round 2: one draft from the assistant, verified by _speculative_sampling), "
          f"n={args.samples} generate() calls:")
    print(f"  {'token':>6} {'expected p':>10} {'observed':>9} {'count':>6} {'drafted':>8}")
    for i in range(VOCAB):
        print(f"  {i:>6} {p2[i]:>10.4f} {counts2[i] / args.samples:>9.4f} {counts2[i]:>6} "
              f"{seen['first_drafts'][i] / rounds:>8.3f}")
    if seen["rounds"]:
        print(f"round-2 drafts: {seen['rounds']}; equal to the argmax of the returned logits: "
              f"{seen['argmax'] / rounds:.1%}; mean returned q(draft) {seen['q_sum'] / rounds:.3f} "
              f"(a greedy draft comes from a point mass: q(draft) must be 1); accepted {seen['accepted'] / rounds:.1%}")

    r = law_test(counts2, p2, args.alpha)
    print(f"\nTV = {r['tv']:.4f}; threshold {r['tv_threshold']:.4f} at alpha/2 (finite-sample McDiarmid bound), "
          f"p <= {fmt_p(r['log10_p_tv'])}")
    print(f"test: KT-mixture likelihood ratio E = 10^{r['log_e'] / math.log(10):.1f}, p <= 1/E = "
          f"{fmt_p(r['log10_p_kt'])} (valid at any n); Pearson chi-square {r['x2']:.1f}, df {r['df']}, "
          f"asymptotic p = {fmt_p(r['log10_p_x2'])} (reference only)"
          + ("; a token outside the target's support: exact failure" if r["support_fail"] else ""))
    verdict = "NOT LOSSLESS: the bug reproduces" if r["reject"] else "consistent with lossless"
    print(f"verdict at alpha {args.alpha:g}: {verdict} (exit {int(r['reject'])}); {time.time() - started:.1f} s")
    return 1 if r["reject"] else 0


if __name__ == "__main__":
    sys.exit(main())
