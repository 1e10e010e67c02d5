"""Shared helper of the speculative-decoding losslessness tests (written by `lossless-check export-tests`).

What the tests check: speculative decoding is *lossless*. With `do_sample=True`, `generate()` with a drafter
must emit tokens whose law is exactly that of plain sampling from the target with the same generation config;
with `do_sample=False` it must emit plain greedy decoding's tokens. Every test runs the installed transformers'
real `generate()` (which builds the real candidate generator and calls the real `_speculative_sampling`) around
tiny seeded models whose logits are fixed by their seed: the exact law of plain sampling is read from the
installed processors themselves (`output_scores` of a plain `generate()` call), never re-implemented.

Statistics (a law test compares the counts of one generated position with its exact law):
- support: a token of exact probability 0 emitted is an exact failure;
- KT e-value: E = m_KT(counts) / prod_x p(x)^c(x), with m_KT the Krichevsky-Trofimov (Dirichlet(1/2)) mixture.
  E is a likelihood ratio with mean 1 under the law, so P(E >= 1/a) <= a at every n (Markov);
- TV: E[TV_hat] <= 1/2 sum_x sqrt(p(x)(1 - p(x))/n) and TV_hat moves by at most 1/n per sample, so McDiarmid
  gives P(TV_hat >= that + t) <= exp(-2 n t^2) at every n.
Each of the two gets half of a position's alpha; a test splits its alpha over its positions; the file's
`FILE_ALPHA` is split evenly over its `LAW_TESTS` law tests (Bonferroni): the whole set of files fails a
lossless transformers with probability at most FILE_ALPHA. Exact tests (greedy, the verifier, drafts past
`max_length`) never fail a correct implementation. `detectable_tv` states each law test's power.
Where the verifier accepts when `r <= p / q` (4.37-5.24), a draft of probability 0 is accepted when `rand()`
returns exactly 0 (2^-24 per draft; test_speculative_verifier.py): add 2^-24 per such draft to the rate above
(at most about 10,000 drafts under the exported top-k stacks: at most about 6e-4 on those releases).
"""

import inspect
import math

import numpy as np
import torch
import transformers
from scipy.special import gammaln

#: The false-failure rate of all exported law tests together (Bonferroni across them).
FILE_ALPHA = 1e-6
#: How many law tests the exported files hold (written by the exporter for the installed release).
LAW_TESTS = 8
#: Each law test's share of FILE_ALPHA.
TEST_ALPHA = FILE_ALPHA / LAW_TESTS
#: A law test's power is stated as the TV it detects with probability at least 1 - MISS.
MISS = 1e-3
#: The TV each law test is sized to detect (TV part alone, worst case over laws; the e-value is usually sharper).
TARGET_TV = 0.35


def tiny_llama(vocab_size, seed, layers=1, head_scale=1.0, **config):
    """A tiny `LlamaForCausalLM` with seeded weights: its logits, hence every law, are fixed by `seed`.

    `head_scale` multiplies the LM head: above 1 a more peaked law, below 1 a flatter one. The EOS token is
    `vocab_size`, past the vocabulary: never emitted, so it ends nothing and the laws need no EOS term, but the
    releases whose loops require an EOS id (4.37-4.43 assisted decoding, 4.44-5.12 prompt lookup) have one."""
    torch.manual_seed(seed)
    settings = {"vocab_size": vocab_size, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": layers,
                "num_attention_heads": 2, "num_key_value_heads": 2, "max_position_embeddings": 64,
                "initializer_range": 0.5, "tie_word_embeddings": False, "pad_token_id": None, "bos_token_id": None,
                "eos_token_id": vocab_size}
    settings.update(config)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**settings)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    return model


def position_laws(target, prompt, positions, stack, **plain_kwargs):
    """Exact laws of generated positions 0 .. positions-1 under plain sampling with the warper `stack`.

    Position 0's law is the processed scores of a plain `generate()` call; position j + 1's is the mixture over
    the support of position j of the laws after each prefix (one batched plain call per position). The
    processors are the installed ones (history-dependent stacks only: no length-dependent processor)."""
    prefixes, weights, laws = prompt, torch.ones(1, dtype=torch.float64), []
    for _ in range(positions):
        with torch.no_grad():
            out = target.generate(prefixes, do_sample=True, max_new_tokens=1, output_scores=True,
                                  return_dict_in_generate=True, **stack, **plain_kwargs)
        rows = out.scores[0].double().softmax(-1)  # the law plain sampling draws each row's next token from
        laws.append((weights[:, None] * rows).sum(0).numpy())
        keep = (rows > 0).nonzero()
        prefixes = torch.cat([prefixes[keep[:, 0]], keep[:, 1:]], dim=1)
        weights = weights[keep[:, 0]] * rows[keep[:, 0], keep[:, 1]]
    return laws


def sample_size(vocab_size, alpha_per_position):
    """The smallest multiple of 50 at which the TV test detects TARGET_TV (every law over `vocab_size`)."""
    n = 50
    while detectable_tv(np.full(vocab_size, 1 / vocab_size), n, alpha_per_position) > TARGET_TV:
        n += 50
    return n


def detectable_tv(law, n, alpha):
    """The TV from `law` that the TV test rejects with probability >= 1 - MISS at n samples."""
    mean_bound = 0.5 * float(np.sqrt(law * (1 - law) / n).sum())
    return 2 * mean_bound + math.sqrt(math.log(2 / alpha) / (2 * n)) + math.sqrt(math.log(1 / MISS) / (2 * n))


def law_test(counts, law, alpha):
    """The two tests (and support) of "counts are iid from law" at level alpha; a dict of what they found."""
    counts, law = np.asarray(counts, dtype=np.float64), np.asarray(law, dtype=np.float64)
    n = counts.sum()
    outside = [int(x) for x in np.flatnonzero((counts > 0) & (law <= 0))]
    tv = 0.5 * float(np.abs(counts / n - law).sum())
    mean_bound = 0.5 * float(np.sqrt(law * (1 - law) / n).sum())
    tv_threshold = mean_bound + math.sqrt(math.log(2 / alpha) / (2 * n))
    log_e = math.inf
    if not outside:
        k = len(counts)
        log_mixture = gammaln(k / 2) - gammaln(n + k / 2) + float((gammaln(counts + 0.5) - gammaln(0.5)).sum())
        seen = counts > 0
        log_e = log_mixture - float((counts[seen] * np.log(law[seen])).sum())
    reject = bool(outside) or tv > tv_threshold or log_e >= math.log(2 / alpha)
    return {"n": int(n), "tv": tv, "tv_threshold": tv_threshold, "log_e": log_e, "outside": outside,
            "reject": reject, "detectable": detectable_tv(law, n, alpha)}


def where(function):
    """`file lines a-b` of an installed function or class, for failure messages."""
    try:
        lines, first = inspect.getsourcelines(function)
        return f"{inspect.getsourcefile(function).split('site-packages/')[-1]} lines {first}-{first + len(lines) - 1}"
    except (OSError, TypeError):
        return repr(function)


class BuiltGenerators:
    """Records the candidate generator each `generate()` call of `model` builds (the real one, unchanged)."""

    def __init__(self, model):
        self.built = []
        real = model._get_candidate_generator

        def recorded(*args, **kwargs):
            generator = real(*args, **kwargs)
            self.built.append(generator)
            return generator

        model._get_candidate_generator = recorded

    def names(self):
        return sorted({type(g).__name__ for g in self.built})


def check_sampling(target, prompt, stack, positions, speculative_kwargs, expected_generator, seed=0, **plain_kwargs):
    """Sample `generate(prompt, do_sample=True, **stack, **speculative_kwargs)` and test each position's law."""
    laws = position_laws(target, prompt, positions, stack, **plain_kwargs)
    alpha = TEST_ALPHA / positions
    n = sample_size(len(laws[0]), alpha)
    built = BuiltGenerators(target)
    counts = np.zeros((positions, len(laws[0])))
    torch.manual_seed(seed)
    for _ in range(n):
        out = target.generate(prompt, do_sample=True, max_new_tokens=positions + 1, **stack, **speculative_kwargs,
                              **plain_kwargs)
        for j in range(positions):
            counts[j, int(out[0, prompt.shape[1] + j])] += 1
    assert expected_generator in built.names(), f"generate() built {built.names()}, not {expected_generator}"
    generator = type(built.built[0])
    failures = []
    for j in range(positions):
        r = law_test(counts[j], laws[j], alpha)
        if r["reject"]:
            top = np.argsort(-np.abs(counts[j] / n - laws[j]))[:3]
            detail = ", ".join(f"token {t}: expected {laws[j][t]:.3f}, observed {counts[j][t] / n:.3f}" for t in top)
            failures.append(
                f"position {j} (generated token {j + 1}): "
                + (f"tokens {r['outside']} of target probability 0 emitted (exact); " if r["outside"] else "")
                + f"TV {r['tv']:.3f} vs threshold {r['tv_threshold']:.3f}, e-value e^{r['log_e']:.1f} vs "
                f"e^{math.log(2 / alpha):.1f} (n = {n}, alpha {alpha:.2g}; detects TV >= {r['detectable']:.2f}); "
                f"{detail}")
    assert not failures, (
        f"{generator.__name__} is not lossless under {stack or 'no warper'} "
        f"(get_candidates: {where(generator.get_candidates)}):\n  " + "\n  ".join(failures))


def check_greedy(target, prompts, speculative_kwargs, expected_generator, max_new_tokens=8, **config):
    """Greedy speculative decoding equals plain greedy decoding, token for token, on every prompt (exact)."""
    built = BuiltGenerators(target)
    for prompt in prompts:
        plain = target.generate(prompt, do_sample=False, max_new_tokens=max_new_tokens, **config)
        try:
            fast = target.generate(prompt, do_sample=False, max_new_tokens=max_new_tokens, **speculative_kwargs,
                                   **config)
        except Exception as error:
            raise AssertionError(
                f"greedy speculative generate() raised {type(error).__name__}: {str(error).splitlines()[0]} under "
                f"{config or 'no processor'} ({frame_of(error)}); plain greedy gives {plain[0].tolist()} "
                f"(generators built: {built.names()})") from error
        assert torch.equal(plain, fast), (
            f"greedy {built.names()} gives {fast[0].tolist()}, plain greedy {plain[0].tolist()} "
            f"under {config or 'no processor'}")
    assert expected_generator in built.names(), f"generate() built {built.names()}, not {expected_generator}"


def frame_of(error):
    """`file line N` where an exception was raised."""
    frame = error.__traceback__
    while frame.tb_next is not None:
        frame = frame.tb_next
    return f"{frame.tb_frame.f_code.co_filename.split('site-packages/')[-1]} line {frame.tb_lineno}"
