#!/usr/bin/env python
"""UniversalSpeculativeDecodingGenerator returns q with its vocabulary permuted.

Standalone reproduction: imports only torch and transformers (and `tokenizers`, which transformers
depends on). Nothing is downloaded: two tiny seeded LlamaForCausalLM and two fast tokenizers built
in memory with the `tokenizers` library, nothing overridden.

What runs: the real `target.generate(prompt, assistant_model=drafter, tokenizer=...,
assistant_tokenizer=..., do_sample=True, top_k=0, max_new_tokens=2)`, which builds the real
UniversalSpeculativeDecodingGenerator (the vocabularies differ and do_sample=True) and verifies its
one draft with the real `_speculative_sampling`. (max_new_tokens=2, not 1: with 1 the generator
drafts nothing, as max_length leaves no room for a draft.) The law of the first generated token is
compared with the target's exact softmax law at the end of the prompt: plain sampling with the same
generation config (top_k=0: no warper), which speculative decoding must reproduce exactly.

The bug (transformers 5.24.0, generation/candidate_generator.py): with do_sample=True the
assistant's LM head is pruned to the overlapping vocabulary in the order
`assistant_tokenizer.get_vocab()` iterates (lines 729, 764-792), and `get_target_ids` maps the
drafts through that same order (line 820), but `get_target_logits` scatters the pruned logits back
in increasing assistant-id order (lines 832-837). A fast tokenizer's `get_vocab()` iterates a hash
map, not in id order, so the returned q is the drafted q with its vocabulary permuted. That order
changes from process to process, and so does the size of the effect (order_sensitivity.py).

    python repro.py                     # exits 1: the bug reproduces
    python repro.py --id-ordered-vocab  # control: assistant get_vocab() sorted by id; exits 0
    python repro.py --fixed             # control: the proposed fix, applied in-process; exits 0
    python repro.py --plain             # control: no assistant (checks the expected law); exits 0
    python repro.py --bpe               # byte-level BPE pair trained offline on two corpora
    python repro.py --bpe --top-k 50    # generate()'s default top_k: most drafts get q = 0

Exit code: 1 when the run rejects "the first token follows the target law" (bug reproduces),
0 when the run is consistent with lossless, 2 on bad usage. The false-rejection probability of a
lossless generator is at most --alpha (default 1e-6), at any --samples: see `law_test`.
"""

import argparse
import math
import sys
import time

import torch
import transformers
import transformers.generation.utils as generation_utils
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

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


def cells_for(expected, max_cells):
    """A partition fixed by the expected law alone (before any sample): the `max_cells` most likely
    tokens each in a cell, the other tokens of positive probability in one cell "(rest)", and the
    tokens of probability 0 (e.g. cut by top-k) in one cell "(p = 0)". Returns a list of id lists."""
    support = sorted((i for i in range(len(expected)) if expected[i] > 0), key=lambda i: -expected[i])
    outside = [i for i in range(len(expected)) if expected[i] <= 0]
    if len(support) <= max_cells + 1:
        cells = [[i] for i in sorted(support)]
    else:
        cells = [[i] for i in support[:max_cells]] + [sorted(support[max_cells:])]
    return cells + ([outside] if outside else [])


# ----------------------------------------------------------------------------------------------
# Models and tokenizers, built inline
# ----------------------------------------------------------------------------------------------

# Different but overlapping vocabularies: 22 shared words, at different ids; 2 target-only words
# (cat, dog), 3 assistant-only words (ship, sea, boat). The vocabulary sizes differ, as generate()
# requires for an assistant_tokenizer.
TARGET_WORDS = ("<unk> the a cat dog sat ran on under mat rug red blue old big small new sun moon tree house car "
                "road bird").split()
ASSISTANT_WORDS = ("<unk> a the bird road car house tree moon sun new small big old blue red rug mat under on ran sat "
                   "ship sea boat").split()

TARGET_CORPUS = [
    "the cat sat on the mat and the dog sat on the rug",
    "a red cat ran under the blue table while the old dog slept",
    "the old cat and the young dog ran to the red door",
    "cats and dogs sit on mats and rugs in the house",
]
ASSISTANT_CORPUS = [
    "ships sail on the sea and boats rest in the harbour",
    "the captain steered the ship through the storm at night",
    "sailors sang songs on the deck of the old ship",
    "the sea was calm and the boats drifted to the shore",
]


class IdOrderedVocabTokenizer(PreTrainedTokenizerFast):
    """Control: `get_vocab()` in increasing id order (as a slow tokenizer's usually is)."""

    def get_vocab(self):
        return dict(sorted(super().get_vocab().items(), key=lambda item: item[1]))


def word_level_tokenizer(words, cls):
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return cls(tokenizer_object=backend, unk_token="<unk>")


def byte_level_bpe_tokenizer(corpus, vocab_size, cls):
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(corpus, trainer)
    return cls(tokenizer_object=backend)


def apply_proposed_fix():
    """The fix proposed upstream, applied in-process: scatter the pruned logits through the same
    mapping the drafts go through (pruned row j -> assistant id overlap[j] -> target id)."""
    translator_cls = transformers.generation.candidate_generator.AssistantToTargetTranslator
    original = translator_cls.get_target_logits

    def get_target_logits(self, assistant_logits):
        if not (getattr(self, "assistant_prune_lm_head", False) and hasattr(self, "assistant_overlap_token_ids")):
            return original(self, assistant_logits)
        target_logits = torch.full((*assistant_logits.shape[:-1], self.target_vocab_size), self.FILTER_VALUE,
                                   device=assistant_logits.device)
        target_ids = self._assistant_to_target_input_ids[self.assistant_overlap_token_ids]
        target_logits[..., target_ids] = assistant_logits
        return target_logits

    translator_cls.get_target_logits = get_target_logits
    return lambda: setattr(translator_cls, "get_target_logits", original)


def tiny_llama(vocab_size, seed):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         initializer_range=0.5, tie_word_embeddings=False,
                         pad_token_id=None, bos_token_id=None, eos_token_id=None)
    return LlamaForCausalLM(config).eval()


def top_k_filter(logits, k):
    """What TopKLogitsWarper does (k = 0: nothing): logits below the k-th largest become -inf."""
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k).values[..., -1:]
    return logits.masked_fill(logits < kth, -float("inf"))


# ----------------------------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=1000, help="generate() calls (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--alpha", type=float, default=1e-6, help="false-rejection bound (default 1e-6)")
    parser.add_argument("--id-ordered-vocab", action="store_true",
                        help="control: the assistant tokenizer's get_vocab() is sorted by id (must exit 0)")
    parser.add_argument("--fixed", action="store_true",
                        help="control: apply the proposed fix in-process (must exit 0)")
    parser.add_argument("--plain", action="store_true",
                        help="control: generate() without the assistant (checks the expected law; must exit 0)")
    parser.add_argument("--top-k", type=int, default=0,
                        help="top_k of the generation config (default 0: no warper; generate()'s own default is 50)")
    parser.add_argument("--bpe", action="store_true",
                        help="byte-level BPE tokenizers trained on two different corpora instead of word-level")
    args = parser.parse_args(argv)
    if args.samples < 1 or not 0 < args.alpha < 1 or args.top_k < 0:
        parser.error("--samples must be >= 1, 0 < --alpha < 1 and --top-k >= 0")
    if not hasattr(transformers.generation.candidate_generator, "UniversalSpeculativeDecodingGenerator"):
        print(f"transformers {transformers.__version__} has no UniversalSpeculativeDecodingGenerator "
              "(added in 4.50.0): nothing to reproduce (exit 0)")
        return 0
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()  # transformers' own deprecation chatter from inside generate()
    started = time.time()

    assistant_cls = IdOrderedVocabTokenizer if args.id_ordered_vocab else PreTrainedTokenizerFast
    if args.bpe:
        target_tok = byte_level_bpe_tokenizer(TARGET_CORPUS, 320, PreTrainedTokenizerFast)
        assistant_tok = byte_level_bpe_tokenizer(ASSISTANT_CORPUS, 300, assistant_cls)
    else:
        target_tok = word_level_tokenizer(TARGET_WORDS, PreTrainedTokenizerFast)
        assistant_tok = word_level_tokenizer(ASSISTANT_WORDS, assistant_cls)
    prompt_text = "the cat sat on the"
    target_vocab, assistant_vocab = len(target_tok), len(assistant_tok)
    target = tiny_llama(target_vocab, seed=49)
    drafter = tiny_llama(assistant_vocab, seed=50)
    prompt = target_tok(prompt_text, return_tensors="pt").input_ids
    assistant_prompt = assistant_tok(prompt_text, return_tensors="pt").input_ids
    target_names = target_tok.convert_ids_to_tokens(list(range(target_vocab)))
    assistant_names = assistant_tok.convert_ids_to_tokens(list(range(assistant_vocab)))

    # Exact laws at the end of the prompt (before generate() prunes the drafter's LM head in place).
    with torch.no_grad():
        target_logits = target(prompt).logits[0, -1].float()
        drafter_logits = drafter(assistant_prompt).logits[0, -1].float()
    p = top_k_filter(target_logits, args.top_k).softmax(-1).tolist()
    overlap = {a: target_names.index(name) for a, name in enumerate(assistant_names) if name in target_names}
    rows = sorted(overlap)  # the pruned head keeps exactly the overlapping rows: q is their softmax
    q_rows = top_k_filter(drafter_logits[rows], args.top_k).softmax(-1).tolist()
    q_true = [0.0] * target_vocab  # the drafter's law, expressed over the target's ids
    for a, qa in zip(rows, q_rows):
        q_true[overlap[a]] = qa

    # Watch the real verifier: record what the generator handed it (then call it unchanged).
    real_speculative_sampling = generation_utils._speculative_sampling
    seen = {"drafts": 0, "q_zero": 0, "accepted": 0, "returned_q": None}

    def watched_speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits, *a, **kw):
        q = candidate_logits.float().softmax(-1)
        drafts = candidate_input_ids[0, -candidate_length:]
        q_at_drafts = q[0, torch.arange(candidate_length), drafts]
        seen["drafts"] += candidate_length
        seen["q_zero"] += int((q_at_drafts == 0).sum())
        if seen["returned_q"] is None:
            seen["returned_q"] = q[0, 0].tolist()
        out = real_speculative_sampling(candidate_input_ids, candidate_logits, candidate_length, new_logits, *a, **kw)
        seen["accepted"] += int(out[1])
        return out

    generation_utils._speculative_sampling = watched_speculative_sampling
    undo_fix = apply_proposed_fix() if args.fixed else (lambda: None)
    torch.manual_seed(args.seed)
    counts = [0] * target_vocab
    kwargs = dict(do_sample=True, top_k=args.top_k, max_new_tokens=2)
    if not args.plain:
        kwargs.update(assistant_model=drafter, tokenizer=target_tok, assistant_tokenizer=assistant_tok)
    try:
        for _ in range(args.samples):
            out = target.generate(prompt, **kwargs)
            counts[int(out[0, prompt.shape[1]])] += 1
    finally:
        generation_utils._speculative_sampling = real_speculative_sampling
        undo_fix()

    # Report
    mode = "UniversalSpeculativeDecodingGenerator" + (" with the proposed fix (control)" if args.fixed else "")
    mode = "plain sampling (control, no assistant)" if args.plain else mode
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: {mode}; "
          f"generate(do_sample=True, top_k={args.top_k}, max_new_tokens=2), seed {args.seed}")
    print(f"tokenizers: {'byte-level BPE' if args.bpe else 'WordLevel'} fast, target vocab {target_vocab}, "
          f"assistant vocab {assistant_vocab}, overlap {len(overlap)}; assistant get_vocab() "
          f"{'sorted by id (control)' if args.id_ordered_vocab else 'as the tokenizer returns it (hash-map order)'}")
    translator = None
    if not args.plain:
        cache = transformers.generation.candidate_generator.AssistantVocabTranslatorCache
        translator = cache.get_translator(target_tok, assistant_tok, target.config.vocab_size)
    pruned = getattr(translator, "assistant_overlap_token_ids", None)
    if pruned is not None:
        pruned = pruned.tolist()
        moved = sum(1 for x, y in zip(pruned, sorted(pruned)) if x != y)
        print(f"pruned LM head rows (assistant ids, get_vocab() order): {pruned if len(pruned) <= 40 else '...'}; "
              f"{moved} of {len(pruned)} not where increasing-id order puts them")

    cells = cells_for(p, 20 if args.bpe else target_vocab)
    cell_counts = [sum(counts[i] for i in cell) for cell in cells]
    cell_expected = [sum(p[i] for i in cell) for cell in cells]
    returned = seen["returned_q"]
    print(f"\nfirst generated token, n={args.samples} generate() calls (prompt {prompt_text!r}):")
    header = f"  {'token':>10} {'expected p':>10} {'observed':>9} {'count':>6}"
    if returned is not None:
        header += f" {'drafter q':>10} {'returned q':>10}"
    print(header)
    for cell, c, e in zip(cells, cell_counts, cell_expected):
        name = (repr(target_names[cell[0]]) if len(cell) == 1 else
                f"(p = 0: {len(cell)})" if e == 0 else f"(rest {len(cell)})")
        line = f"  {name:>10} {e:>10.4f} {c / args.samples:>9.4f} {c:>6}"
        if returned is not None:
            line += f" {sum(q_true[i] for i in cell):>10.4f} {sum(returned[i] for i in cell):>10.4f}"
        print(line)
    if returned is not None:
        diff = 0.5 * sum(abs(x - y) for x, y in zip(q_true, returned))
        print(f"returned q vs the drafter's q at round 1: TV {diff:.4f} "
              f"({'the same law' if diff < 1e-4 else 'NOT the law the draft was sampled from'})")
        print(f"drafts verified: {seen['drafts']}, accepted {seen['accepted']} "
              f"({seen['accepted'] / max(seen['drafts'], 1):.1%}), returned q(draft) == 0: {seen['q_zero']} "
              f"({seen['q_zero'] / max(seen['drafts'], 1):.1%})")

    r = law_test(cell_counts, cell_expected, args.alpha)
    full_tv = 0.5 * sum(abs(c / args.samples - e) for c, e in zip(counts, p))
    print(f"\nTV = {r['tv']:.4f} over {len(cells)} cells (full vocabulary {full_tv:.4f}); threshold "
          f"{r['tv_threshold']:.4f} at alpha/2 (finite-sample McDiarmid bound), p <= {fmt_p(r['log10_p_tv'])}")
    print(f"test: KT-mixture likelihood ratio E = 10^{r['log_e'] / math.log(10):.1f}, p <= 1/E = "
          f"{fmt_p(r['log10_p_kt'])} (valid at any n); Pearson chi-square {r['x2']:.1f}, df {r['df']}, "
          f"asymptotic p = {fmt_p(r['log10_p_x2'])} (reference only)"
          + ("; a token outside the target's support: exact failure" if r["support_fail"] else ""))
    verdict = "NOT LOSSLESS: the bug reproduces" if r["reject"] else "consistent with lossless"
    print(f"verdict at alpha {args.alpha:g}: {verdict} (exit {int(r['reject'])}); {time.time() - started:.1f} s")
    return 1 if r["reject"] else 0


if __name__ == "__main__":
    sys.exit(main())
