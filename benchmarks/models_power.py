"""Power and false-failure rate of ``lossless-check models`` on a saved close pair (issue 49): the figures of
``docs/guides/own-model-pair.md``.

    python benchmarks/models_power.py [--part exact|mutants|null|power|all] [--seeds N] [--json PATH]

The pair is :func:`fixtures.model_pair.save_close_pair` (2-layer Llama, V = 1,024, the drafter the target
plus weight noise 0.0015: acceptance about 0.96 under top_k=50), saved once under a temporary folder;
``top_k=50`` throughout.

- ``exact``: for each drafter of :mod:`fixtures.mutants.untraceable_assisted`, the exact TV between the law a
  round's first emitted token follows and the target's, ``s min(1, p/q) + (1 - sum) norm(max(p - q, 0))``
  (``s`` the law it samples, ``q`` the one it returns: :func:`lossless_check.modes.models.sampling.raw_logits_law`),
  at the positions of 16 target samples of 24 tokens; and the expected acceptance ``sum s min(1, p/q)``.
- ``mutants``: ``lossless-check models`` at its defaults (64 calls of 32 tokens, alpha 1e-6) on each drafter,
  seeds 0 to N-1: verdict, exact check, tokens to rejection.
- ``null``: the false-failure rate at alpha 0.1 on built-in Assisted and prompt lookup, and on the correct
  Gumbel-max drafter, N seeds of 512 tokens each (16 calls of 32).
- ``power``: the power table of built-in Assisted's default row, pooled over N seeds (100 replicates each).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

torch.set_num_threads(1)

MUTANTS = "fixtures.mutants.untraceable_assisted"
DRAFTERS = ("GumbelMaxDrafter", "HalvedTemperature", "DoubledTemperature", "ReversedRank", "ShiftedRank",
            "SamplesRawLogits", "ReturnsRawLogits", "NumpyDoubledTemperature")


def exact_tvs(pair: tuple[str, str]) -> dict:
    import importlib

    from transformers import AutoModelForCausalLM, LogitsProcessorList, TopKLogitsWarper

    from lossless_check.modes.models.sampling import raw_logits_law

    target, assistant = (AutoModelForCausalLM.from_pretrained(p, local_files_only=True).eval() for p in pair)
    processors = LogitsProcessorList([TopKLogitsWarper(50)])
    vocab = target.config.vocab_size
    with torch.random.fork_rng():
        torch.manual_seed(5)
        prompts = torch.randint(0, vocab, (16, 8))
        with torch.no_grad():
            full = target.generate(prompts, do_sample=True, top_k=50, max_new_tokens=24, pad_token_id=0)
            p_logits = target(full).logits[:, 7:-1].reshape(-1, vocab).float()
            q_logits = assistant(full).logits[:, 7:-1].reshape(-1, vocab).float()
    module = importlib.import_module(MUTANTS)
    out = {}
    for name in DRAFTERS:
        drafter = getattr(module, name)
        tvs, acceptance = [], []
        for row in range(p_logits.shape[0]):
            p = torch.softmax(processors(None, p_logits[row:row + 1].clone()), -1)[0].double().numpy()
            raw = q_logits[row:row + 1]
            processed = processors(None, raw.clone())
            s = torch.softmax(drafter.sampling_logits(None, raw, processed).double(), -1)[0].numpy()
            q = torch.softmax(drafter.returned_logits(None, raw, processed).double(), -1)[0].numpy()
            tvs.append(0.5 * float(np.abs(raw_logits_law(p, s, q) - p).sum()))
            acceptance.append(float((s * np.minimum(1.0, p / np.maximum(q, 1e-300))).sum()))
        out[name] = {"tv_median": float(np.median(tvs)), "tv_p95": float(np.quantile(tvs, 0.95)),
                     "acceptance": float(np.mean(acceptance)), "positions": len(tvs)}
        print(f"{name:26s} emitted TV median {out[name]['tv_median']:.3f} p95 {out[name]['tv_p95']:.3f} "
              f"acceptance {out[name]['acceptance']:.3f}", flush=True)
    return out


def _row(pair, generator: str, seed: int, **kwargs):
    import lossless_check as lc

    started = time.perf_counter()
    row = lc.check_models(pair[0], pair[1], [generator], warpers="top_k=50", seed=seed, **kwargs).rows[0]
    return row, time.perf_counter() - started


def mutants(pair, seeds: int) -> dict:
    out = {}
    for name in DRAFTERS:
        runs = []
        for seed in range(seeds):
            row, seconds = _row(pair, f"{MUTANTS}:{name}", seed)
            runs.append({"seed": seed, "verdict": row.verdict, "exact": row.exact["verdict"],
                         "rejected_at_token": row.statistical["rejected_at_token"],
                         "tokens": row.statistical["tokens"], "seconds": round(seconds, 1)})
            print(name, runs[-1], flush=True)
        out[name] = runs
    return out


def null(pair, seeds: int) -> dict:
    out = {}
    for generator in ("AssistedCandidateGenerator", "PromptLookupCandidateGenerator", f"{MUTANTS}:GumbelMaxDrafter"):
        rejected, largest = 0, -np.inf
        for seed in range(seeds):
            row, _ = _row(pair, generator, seed, samples=16, alpha=0.1)
            rejected += row.statistical["rejected_at_token"] is not None
            largest = max(largest, row.statistical["max_log_evalue"])
        out[generator] = {"seeds": seeds, "tokens_each": 512, "alpha": 0.1, "rejected": rejected,
                          "largest_max_log_evalue": float(largest)}
        print(generator, out[generator], flush=True)
    return out


def power(pair, seeds: int) -> dict:
    pooled: dict = {}
    for seed in range(seeds):
        row, _ = _row(pair, "AssistedCandidateGenerator", seed)
        for r in row.statistical["power"]["rows"]:
            entry = pooled.setdefault((r["direction"], r["tv"]), {"hits": 0, "replicates": 0, "tv": []})
            entry["hits"] += round(r["power"] * row.statistical["power"]["replicates"])
            entry["replicates"] += row.statistical["power"]["replicates"]
            entry["tv"].append(r["mean_tv_simulated"])
    table = [{"direction": d, "tv": tv, "power": e["hits"] / e["replicates"], "replicates": e["replicates"],
              "mean_tv_simulated": float(np.mean(e["tv"]))} for (d, tv), e in pooled.items()]
    for r in table:
        print(r, flush=True)
    return {"seeds": seeds, "rows": table}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("exact", "mutants", "null", "power", "all"), default="all")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    from fixtures.model_pair import save_close_pair

    results = {"transformers": __import__("transformers").__version__, "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as folder:
        pair = save_close_pair(Path(folder))
        for part, run in (("exact", lambda: exact_tvs(pair)), ("mutants", lambda: mutants(pair, args.seeds)),
                          ("null", lambda: null(pair, args.seeds)), ("power", lambda: power(pair, args.seeds))):
            if args.part in (part, "all"):
                results[part] = run()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
