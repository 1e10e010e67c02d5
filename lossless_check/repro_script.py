#!/usr/bin/env python
"""__TITLE__

Standalone reproduction: imports only torch and transformers (and `tokenizers`, which transformers
depends on). Nothing is downloaded: the target and the drafter are fixed-logits models built here
from the tables below (`TableLM`: a real `PreTrainedModel` + `GenerationMixin` whose next-token
logits come from a table, with a real `DynamicCache` holding its token history), and the tokenizers,
where the generator needs two, are built in memory with the `tokenizers` library.

What runs: `target.generate(prompt, do_sample=True, max_new_tokens=K, **warpers, **route)` __SAMPLES__
times, where `route` is what makes the installed `generate()` build the generator under test itself
(an `assistant_model`, `prompt_lookup_num_tokens`, two tokenizers, `speculation_type="dflash"` with a
block drafter over the drafter table). Nothing of transformers is
patched.

Reference: plain sampling with the same warpers (greedy decoding where the generator is built for
`do_sample=False` only), computed by the real `generate()` without a drafter: for every prefix the
runs emitted, a plain `generate()` call forced along that prefix returns its processed scores
(`output_scores=True`), whose softmax is the exact law of the next token.

Checks: every emitted token has probability > 0 given its prefix; the length and EOS rules of plain
sampling hold; and at every position, the tokens that follow each prefix follow that prefix's law
(a Krichevsky-Trofimov mixture likelihood ratio per prefix, multiplied over prefixes: an e-value,
valid at any sample size; the positions' e-values are averaged). The run stops at the first
rejection. A lossless generator exits 1 with probability at most --alpha.

Exit code: 1 the bug reproduces (a check fails) or generate() raises (verdict ERROR, as the
harness's `error`: the crash is a finding, but says nothing about the output law; a release may
also refuse the configuration), 0 consistent with lossless, 2 bad usage.

__DETAILS__
"""

import argparse
import inspect
import math
import sys
import time

import torch
import transformers
from torch import nn
from transformers import GenerationMixin, LogitsProcessor, LogitsProcessorList, PretrainedConfig, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

#: The case (written by lossless-check; edit freely).
CASE = __CASE__

# ----------------------------------------------------------------------------------------------
# Fixed-logits models
# ----------------------------------------------------------------------------------------------


class TableConfig(PretrainedConfig):
    model_type = "repro_table_lm"

    def __init__(self, vocab_size=8, kind="iid", rows=None, prompt_length=1, table_dtype="float32", **kwargs):
        self.vocab_size, self.kind, self.prompt_length, self.table_dtype = vocab_size, kind, prompt_length, table_dtype
        self.rows = rows if rows is not None else [[0.0] * vocab_size]
        # Shape facts generate() and the cache classes read.
        self.hidden_size, self.num_hidden_layers, self.num_attention_heads = vocab_size, 1, 1
        self.num_key_value_heads, self.head_dim = 1, 1
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)


class OneHot(nn.Module):
    """The identity embedding of a large vocabulary, without its V x V weight."""

    def __init__(self, vocab, dtype):
        super().__init__()
        self.vocab, self.weight = vocab, nn.Parameter(torch.zeros(0, dtype=dtype), requires_grad=False)

    def forward(self, input_ids):
        return nn.functional.one_hot(input_ids, self.vocab).to(self.weight.dtype)


class TableLM(PreTrainedModel, GenerationMixin):
    """Logits for the token at absolute position ``t + 1``: row ``0`` (iid), ``t + 1 - prompt_length``
    (per_position) or ``input_ids[t]`` (markov) of the table, in the table's dtype. Tokens are read
    through the input embedding (one-hot rows) and logits written through the output embedding
    (identity), so a generator that swaps in a re-indexing embedding or a pruned head acts as on a
    real model. Above 4096 tokens both maps hold no weights (a dense one would take gigabytes)."""

    config_class = TableConfig
    base_model_prefix = "model"
    _supports_cache_class = True

    def __init__(self, config):
        super().__init__(config)
        vocab, dtype = config.vocab_size, getattr(torch, config.table_dtype)
        self.register_buffer("rows", torch.tensor(config.rows, dtype=torch.float64).to(dtype), persistent=False)
        if vocab > 4096:
            self.embed_tokens, self.lm_head = OneHot(vocab, dtype), nn.Identity()
        else:
            self.embed_tokens = nn.Embedding(vocab, vocab, dtype=dtype)
            self.lm_head = nn.Linear(vocab, vocab, bias=False, dtype=dtype)
            with torch.no_grad():
                self.embed_tokens.weight.copy_(torch.eye(vocab))
                self.lm_head.weight.copy_(torch.eye(vocab))
        self.post_init()

    def _init_weights(self, module):  # fixed by construction
        pass

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, cache=None,
                use_cache=None, logits_to_keep=0, **kwargs):
        cache = past_key_values if past_key_values is not None else cache  # named `cache` from 5.24
        if cache is None and use_cache:
            cache = DynamicCache()
        tokens = self.get_input_embeddings()(input_ids).max(dim=-1).indices
        batch, new = tokens.shape
        past = cache.get_seq_length() if cache is not None else 0
        history = tokens
        if cache is not None:  # the cache's "keys" are the token ids: the history the model attends to
            states = tokens.to(torch.float32)[:, None, :, None]
            keys, _ = cache.update(states, states, 0)
            history = keys[:, 0, :, 0].round().long()
        predicted = torch.arange(past + 1, past + new + 1).expand(batch, new)
        if self.config.kind == "iid":
            index = torch.zeros_like(predicted)
        elif self.config.kind == "per_position":
            index = (predicted - self.config.prompt_length).clamp(0, self.rows.shape[0] - 1)
        else:
            index = history[:, past: past + new]
        full = self.get_output_embeddings()(self.rows[index])
        logits = full[:, -logits_to_keep:] if logits_to_keep else full
        # DFlash hands the target's hidden states, at every position, to its drafter (any values do: the table drafts).
        hidden = (full, full) if kwargs.get("output_hidden_states") else None
        return CausalLMOutputWithPast(logits=logits, hidden_states=hidden,
                                      **cache_field(CausalLMOutputWithPast, cache if use_cache is not False else None))


def cache_field(output_class, cache):
    """``{name: cache}`` under the name ``output_class`` gives its cache (``cache`` from 5.24)."""
    return {"cache" if "cache" in output_class.__dataclass_fields__ else "past_key_values": cache}


class TableDFlashDrafter(PreTrainedModel):
    """DFlash block drafter over an iid or per_position table: the hidden state at noise position ``a + i``
    is the table row for the token at ``a + i``, which the target's identity lm_head turns into logits."""

    config_class = TableConfig

    def __init__(self, config):
        super().__init__(config)
        dtype = getattr(torch, config.table_dtype)
        self.register_buffer("rows", torch.tensor(config.rows, dtype=torch.float64).to(dtype), persistent=False)
        self.anchor = nn.Parameter(torch.zeros(1, dtype=dtype), requires_grad=False)  # device and dtype
        self.post_init()

    def _init_weights(self, module):  # fixed by construction
        pass

    def forward(self, noise_embeds, context_hidden_states, position_ids, attention_mask=None, past_key_values=None,
                cache=None, **kwargs):
        cache = past_key_values if past_key_values is not None else cache
        batch, block = noise_embeds.shape[:2]
        if cache is not None:  # a real drafter caches the context and the block; the generator crops the block
            states = torch.zeros(batch, 1, context_hidden_states.shape[1] + block, 1)
            cache.update(states, states, 0)
        index = (position_ids[:, -block:] - self.config.prompt_length).clamp(0, self.rows.shape[0] - 1)
        hidden = self.rows[index].expand(batch, -1, -1).clone()
        return BaseModelOutputWithPast(last_hidden_state=hidden, **cache_field(BaseModelOutputWithPast, cache))


def table_lm(table, prompt_length, rows=None, **generation):
    rows = table["rows"] if rows is None else rows
    model = TableLM(TableConfig(len(rows[0]), table["kind"], rows, prompt_length, table.get("dtype", "float32"))).eval()
    model.generation_config.pad_token_id = None
    for key, value in generation.items():
        setattr(model.generation_config, key, value)
    return model


# ----------------------------------------------------------------------------------------------
# Two vocabularies (generators that translate between tokenizers)
# ----------------------------------------------------------------------------------------------


def target_words(vocab):
    return [f"w{i}" for i in range(vocab)]


def assistant_words(vocab):
    """The target's words reversed, with two words the target does not know."""
    words = target_words(vocab)[::-1]
    words.insert(1, "zz0")
    words.insert(len(words) // 2, "zz1")
    return words


def word_level_tokenizer(words, vocab_order):
    """A fast tokenizer whose token ``i`` is ``words[i]``. ``vocab_order``: ``fast`` (nothing overridden:
    `get_vocab()` iterates the library's hash map), ``id-ordered`` or ``stub`` (alphabetical)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0]))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if vocab_order == "fast":
        return PreTrainedTokenizerFast(tokenizer_object=backend)
    key = (lambda item: item[1]) if vocab_order == "id-ordered" else (lambda item: item[0])

    class OrderedVocabTokenizer(PreTrainedTokenizerFast):
        def get_vocab(self):
            return dict(sorted(super().get_vocab().items(), key=key))

    return OrderedVocabTokenizer(tokenizer_object=backend)


def assistant_table(kind, rows, vocab):
    """The drafter table (over target ids) re-expressed over the assistant's ids."""
    words = assistant_words(vocab)
    column_of = [int(w[1:]) if w.startswith("w") else None for w in words]
    columns = [[row[c] if c is not None else 0.0 for c in column_of] for row in rows]
    if kind != "markov":
        return columns
    return [columns[c if c is not None else 0] for c in column_of]


# ----------------------------------------------------------------------------------------------
# The case's models and the generate() arguments that route it
# ----------------------------------------------------------------------------------------------

CONSTANT_DRAFTS = {"num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0}


def build(case):
    """``(target, spec_kwargs, greedy)``: ``target.generate(prompt, **spec_kwargs)`` runs the generator."""
    prompt_length, gamma = len(case["prompt"]), case["gamma"]
    target = table_lm(case["target"], prompt_length)
    drafter = case["drafter"]
    drafts = dict(CONSTANT_DRAFTS, num_assistant_tokens=gamma)
    family = case["family"]
    if family == "AssistedCandidateGenerator":
        return target, {"assistant_model": table_lm(drafter, prompt_length, **drafts)}, False
    if family == "PromptLookupCandidateGenerator":
        return target, {"prompt_lookup_num_tokens": gamma}, False
    if family in ("UniversalSpeculativeDecodingGenerator", "AssistedCandidateGeneratorDifferentTokenizers"):
        vocab = len(case["target"]["rows"][0])
        assistant = table_lm(drafter, prompt_length, assistant_table(drafter["kind"], drafter["rows"], vocab), **drafts)
        order = case["tokenizers"]
        kwargs = {"assistant_model": assistant, "tokenizer": word_level_tokenizer(target_words(vocab), order),
                  "assistant_tokenizer": word_level_tokenizer(assistant_words(vocab), order)}
        # generate() builds the Universal generator for do_sample=True, the other for greedy decoding.
        greedy = family == "AssistedCandidateGeneratorDifferentTokenizers"
        return target, kwargs, greedy
    if family == "DFlashTokenCandidateGenerator":
        config = TableConfig(len(drafter["rows"][0]), drafter["kind"], drafter["rows"], prompt_length,
                             drafter.get("dtype", "float32"))
        config.target_layer_ids, config.block_size, config.mask_token_id = [0], gamma + 1, 0
        return target, {"assistant_model": TableDFlashDrafter(config).eval(), "speculation_type": "dflash"}, False
    raise SystemExit(f"no builder for {family}")


# ----------------------------------------------------------------------------------------------
# Reference: plain sampling, by the real generate()
# ----------------------------------------------------------------------------------------------


class ForcePrefix(LogitsProcessor):
    """Forces the first tokens of a plain generate() call along ``prefix``; then does nothing."""

    def __init__(self, prompt_length, prefix):
        self.prompt_length, self.prefix = prompt_length, prefix

    def __call__(self, input_ids, scores):
        k = input_ids.shape[1] - self.prompt_length
        if k >= len(self.prefix):
            return scores
        forced = torch.full_like(scores, -math.inf)
        forced[:, self.prefix[k]] = 0.0
        return forced


class PlainLaws:
    """``law(prefix)``: the law plain sampling (greedy: a point mass) gives the next token after ``prompt + prefix``."""

    def __init__(self, target, prompt, warpers, greedy):
        self.target, self.prompt, self.warpers, self.greedy = target, prompt, warpers, greedy
        self.known = {}

    def __call__(self, prefix):
        if prefix not in self.known:
            out = self.target.generate(
                self.prompt, do_sample=not self.greedy, max_new_tokens=len(prefix) + 1,
                output_scores=True, return_dict_in_generate=True,
                logits_processor=LogitsProcessorList([ForcePrefix(self.prompt.shape[1], prefix)]),
                **self.warpers)
            scores = out.scores[len(prefix)][0].double()
            if self.greedy:
                law = torch.zeros_like(scores)
                law[scores.argmax()] = 1.0
            else:
                law = torch.softmax(scores, dim=-1)
            self.known[prefix] = law.tolist()
        return self.known[prefix]


# ----------------------------------------------------------------------------------------------
# Statistics (no numpy/scipy)
# ----------------------------------------------------------------------------------------------

#: Above this vocabulary a law is tested on cells fixed by the exact law alone: each of the 64 most
#: likely tokens, then 16 buckets of the tail by mass quantile (valid: the partition never sees the data).
COARSEN_ABOVE = 4096


def cells(law):
    """``cell_of(token)`` and the law of the cells (identity below COARSEN_ABOVE)."""
    if len(law) <= COARSEN_ABOVE:
        return (lambda t: t), law
    order = sorted(range(len(law)), key=lambda t: -law[t])
    support = [t for t in order if law[t] > 0]
    cell = {t: i for i, t in enumerate(support[:64])}
    tail = support[64:]
    total = sum(law[t] for t in tail) or 1.0
    start = 0.0
    for t in tail:
        cell[t] = 64 + min(int(start / total * 16), 15)
        start += law[t]
    cell_law = [0.0] * 81
    for t, c in cell.items():
        cell_law[c] += law[t]
    return (lambda t: cell.get(t, 80)), cell_law


class KTEvalue:
    """Krichevsky-Trofimov mixture over laws on the support's cells vs the exact law:
    ``prod_i KT(x_i) / p(x_i)`` is an e-value (its expectation is 1 under the exact law at every n),
    so ``P(E >= 1/alpha) <= alpha``. A token outside the support makes it infinite (an exact failure)."""

    def __init__(self, law):
        self.cell_of, self.law = cells(law)
        self.counts = [0] * len(self.law)
        self.support = sum(1 for p in self.law if p > 0)
        self.n, self.log_e = 0, 0.0

    def add(self, token):
        c = self.cell_of(token)
        if self.law[c] <= 0:
            self.log_e = math.inf
        if math.isinf(self.log_e):
            return
        self.log_e += math.log((self.counts[c] + 0.5) / (self.n + self.support / 2)) - math.log(self.law[c])
        self.counts[c] += 1
        self.n += 1


def run(case, samples, alpha, seed, plain=False):
    torch.manual_seed(seed)
    prompt = torch.tensor([case["prompt"]])
    target, spec, greedy = build(case)
    if plain:
        spec = {}
    warpers, k_max = case["warpers"], case["max_new_tokens"]
    eos = set(case["eos"])
    law = PlainLaws(target, prompt, warpers, greedy)
    tests = [dict() for _ in range(k_max)]  # per position: prefix -> KTEvalue
    log_e = [0.0] * k_max  # per position: the product of its prefixes' e-values, in logs
    first = [0] * len(law(()))
    failures, error, started = [], None, time.time()
    log_threshold, mean_log_e = math.log(1 / alpha), 0.0
    n = 0
    for n in range(1, samples + 1):
        try:
            out = target.generate(prompt, do_sample=not greedy, max_new_tokens=k_max, **warpers, **spec)
        except Exception as exc:  # the generator under test, the loop, or the release refusing the configuration
            error = f"generate() raised {type(exc).__name__}: {exc}".splitlines()[0]
            break
        tokens = out[0, prompt.shape[1]:].tolist()
        if len(tokens) > k_max or any(t in eos for t in tokens[:-1]) or (
                len(tokens) < k_max and (not tokens or tokens[-1] not in eos)):
            failures.append(f"call {n} emitted {tokens}: plain sampling stops after max_new_tokens={k_max} "
                            f"tokens or at an EOS {sorted(eos)}")
            break
        first[tokens[0]] += 1
        for k, token in enumerate(tokens):
            prefix = tuple(tokens[:k])
            p = law(prefix)
            if p[token] <= 0:
                failures.append(f"call {n} emitted token {token} after {list(prefix)}, which plain sampling "
                                f"gives probability 0")
                break
            test = tests[k].setdefault(prefix, KTEvalue(p))
            before = test.log_e
            test.add(token)
            log_e[k] += test.log_e - before
        mean_log_e = max(log_e) + math.log(sum(math.exp(v - max(log_e)) for v in log_e) / len(log_e))
        if failures or mean_log_e >= log_threshold:
            break
    seconds = time.time() - started
    report(case, law(()), first, n, tests, failures, alpha, seconds, plain)
    versions = f"(transformers {transformers.__version__}, torch {torch.__version__})"
    if error:  # an error is no evidence about the output law, either way
        print(f"verdict: ERROR: {error}: no verdict on the output law {versions}")
        return 1
    reproduced = bool(failures) or mean_log_e >= log_threshold
    print(f"verdict: {'NOT LOSSLESS: the bug reproduces' if reproduced else 'consistent with lossless'} {versions}")
    return 1 if reproduced else 0


def report(case, expected, first, n, tests, failures, alpha, seconds, plain):
    total = sum(first)
    what = "plain sampling (control)" if plain else case["family"]
    print(f"{what} with {case['warpers'] or 'no warpers'}: {n} generate() calls in {seconds:.1f} s")
    if total:
        print("token 1     expected  observed")
        shown = sorted(range(len(expected)), key=lambda t: -expected[t] - first[t] / total)[:12]
        for t in sorted(shown):
            print(f"  {t:>6}  {expected[t]:9.4f} {first[t] / total:9.4f}")
        tv = 0.5 * sum(abs(first[t] / total - expected[t]) for t in range(len(expected)))
        print(f"TV of token 1 from plain sampling: {tv:.4f} (n={total})")
    for k, position in enumerate(tests, 1):
        log_e = sum(t.log_e for t in position.values())
        p = "0" if math.isinf(log_e) else f"{math.exp(-max(log_e, 0.0)):.2g}"  # min(1, 1/E), no overflow
        print(f"position {k}: {len(position)} prefixes, e-value e^{log_e:.1f}, p <= 1/E = {p}")
    for failure in failures:
        print("exact check failed:", failure)
    print(f"alpha {alpha:g}: reject when the mean of the positions' e-values reaches {1 / alpha:g}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=CASE["samples"], help="most generate() calls")
    parser.add_argument("--alpha", type=float, default=1e-6, help="false-rejection rate of a lossless generator")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plain", action="store_true",
                        help="control: plain sampling, no drafter (checks the reference and the test); exits 0")
    parser.add_argument("--tokenizers", choices=("fast", "id-ordered", "stub"), default=CASE["tokenizers"],
                        help="generators with two tokenizers: how get_vocab() iterates (fast: the library's hash "
                             "order, nothing overridden; id-ordered; stub: alphabetical)")
    args = parser.parse_args(argv)
    if "NotImplementedError" in inspect.getsource(GenerationMixin.prepare_inputs_for_generation):
        parser.exit(2, f"this script needs transformers >= 4.45 (its table model relies on the generic "
                       f"prepare_inputs_for_generation); installed: {transformers.__version__}\n")
    if args.samples < 1 or not 0 < args.alpha < 1:
        parser.error("--samples must be >= 1 and --alpha in (0, 1)")
    case = dict(CASE, tokenizers=args.tokenizers)
    return run(case, args.samples, args.alpha, args.seed, args.plain)


if __name__ == "__main__":
    sys.exit(main())
