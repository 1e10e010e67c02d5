"""Benchmarks for lossless-check, measured side by side in one run (ratios, not absolute timings).

    python benchmarks/run_benchmarks.py [--quick] [--json PATH]

1. overhead: harness step-mode samples/s vs a bare loop of the same real calls (get_candidates,
   target logits, processors, _speculative_sampling) with nothing else; arms interleaved in blocks
   so machine noise hits both alike.
2. scaling: the same cases with --workers 1 and 2 (identical results asserted).
3. samples to verdict for negative controls: fixed-N vs group-sequential vs the information bound
   log(1/alpha) / KL(law under the bug || target law) at position 1.
4. matrix wall time: --matrix default over every sampling generator, step mode, measured at a
   reduced sample count and scaled to the default one (both printed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()

from lossless_check.adapters import ADAPTERS, resolve_generator  # noqa: E402
from lossless_check.cli import DEFAULT_SAMPLES  # noqa: E402
from lossless_check.expected import ExactLaws, first_token_law  # noqa: E402
from lossless_check.matrix import matrix  # noqa: E402
from lossless_check.runner import Case, StepCase, execute, run  # noqa: E402
from lossless_check.scenarios import DEFAULT, IID  # noqa: E402

ALPHA = 1e-6
MUTANT = "fixtures.mutants.dflash_raw_logits:DFlashReturnsRawLogits"


def bare_loop(step: StepCase, trials: int) -> float:
    """Seconds for ``trials`` rounds of the real calls and nothing else."""
    session = step.case.generator.adapter.session(step.context())
    prompt, length = step.prompt_ids, step.prompt_ids.shape[1]
    started = time.perf_counter()
    with torch.no_grad():
        for _ in range(trials):
            candidate_ids, candidate_logits = session.draft(prompt)
            gamma = candidate_ids.shape[1] - length
            new_logits = step.target(candidate_ids).logits[:, -gamma - 1 :].to(torch.float32)
            for i in range(gamma + 1):
                new_logits[:, i, :] = step.processors(candidate_ids[:, : length + i], new_logits[:, i, :])
            step.verify(candidate_ids, candidate_logits, gamma, new_logits)
    return time.perf_counter() - started


def overhead(generator: str, trials: int, blocks: int = 4) -> dict:
    step = StepCase(Case(resolve_generator(generator), {"top_k": 3}, scenario=IID))
    bare = harness = 0.0
    per_block = trials // blocks
    for block in range(blocks):
        bare += bare_loop(step, per_block)
        harness += step.collect(per_block, seed=block).seconds
    return {"generator": generator, "trials": per_block * blocks, "bare_samples_per_s": per_block * blocks / bare,
            "harness_samples_per_s": per_block * blocks / harness, "overhead_ratio": harness / bare}


def scaling(samples: int) -> dict:
    stacks = ({}, {"top_k": 3}, {"temperature": 0.6}, {"top_p": 0.7})
    cases = [Case(resolve_generator("DFlashTokenCandidateGenerator"), w, scenario=IID) for w in stacks]
    timings, outputs = {}, {}
    for workers in (1, 2):
        started = time.perf_counter()
        results = execute(cases, samples, 0, ALPHA, workers)
        timings[workers] = time.perf_counter() - started
        outputs[workers] = [(r.verdict, r.tv, r.p_value, r.acceptance_rate) for r in results]
    assert outputs[1] == outputs[2], "results depend on the worker count"
    return {"cases": len(cases), "samples": samples, "seconds_1": timings[1], "seconds_2": timings[2],
            "speedup": timings[1] / timings[2], "cores": os.cpu_count(), "identical_results": True}


def information_bound(warpers: dict) -> float:
    """log(1/alpha) / KL(first-token law under the raw-logits bug || target law)."""
    target = StepCase(Case(resolve_generator("DFlashTokenCandidateGenerator"), warpers, scenario=IID))
    laws = ExactLaws(IID, target.processors)
    raw = torch.softmax(torch.tensor(IID.drafter.rows[0]), -1).numpy()
    bug = first_token_law(laws.target(), laws.drafter(), raw)
    p = laws.target()
    keep = bug > 0
    kl = float(np.sum(bug[keep] * np.log(bug[keep] / p[keep])))
    return math.log(1 / ALPHA) / kl


def samples_to_verdict(max_samples: int) -> list[dict]:
    rows = []
    for warpers in ({"top_k": 3}, {"temperature": 0.6}):
        case = Case(resolve_generator(MUTANT), warpers, scenario=IID)
        fixed = run([case], max_samples, ALPHA, 0).cases[0]
        sequential = run([case], max_samples, ALPHA, 0, sequential=True).cases[0]
        bound = information_bound(warpers)
        rows.append({"mutant": "DFlashReturnsRawLogits", "warpers": case.warper_spec, "fixed_n": fixed.samples,
                     "fixed_verdict": fixed.verdict, "sequential_n": sequential.samples,
                     "sequential_verdict": sequential.verdict, "information_bound_n": bound,
                     "sequential_over_bound": sequential.samples / bound})
    return rows


def matrix_wall_time(samples: int, workers: int) -> dict:
    cases = [Case(resolve_generator(g), w, scenario=DEFAULT) for g in ADAPTERS for w in matrix("default")]
    started = time.perf_counter()
    results = execute(cases, samples, 0, ALPHA / len(cases), workers)
    seconds = time.perf_counter() - started
    ran = [r for r in results if r.verdict not in ("skipped", "error")]
    return {"cases": len(cases), "ran": len(ran), "samples": samples, "workers": workers, "seconds": seconds,
            "scaled_to_default_samples_minutes": seconds * DEFAULT_SAMPLES / samples / 60,
            "default_samples": DEFAULT_SAMPLES}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run of the benchmark itself)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    size = 200 if args.quick else 1000
    report = {
        "overhead": [overhead(g, size) for g in ("DFlashTokenCandidateGenerator", "AssistedCandidateGenerator")],
        "scaling": scaling(size * 4),
        "samples_to_verdict": samples_to_verdict(4000 if args.quick else 16000),
        "matrix": matrix_wall_time(50 if args.quick else 200, 2),
    }
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="overhead: harness vs bare loop (same real calls)")
    for col in ("generator", "bare samples/s", "harness samples/s", "ratio"):
        table.add_column(col)
    for row in report["overhead"]:
        table.add_row(row["generator"], f"{row['bare_samples_per_s']:.0f}", f"{row['harness_samples_per_s']:.0f}",
                      f"{row['overhead_ratio']:.3f}")
    console.print(table)
    s = report["scaling"]
    console.print(f"scaling: workers 1 -> 2 speedup {s['speedup']:.2f}x on {s['cores']} cores "
                  f"({s['seconds_1']:.1f}s vs {s['seconds_2']:.1f}s), identical results")
    table = Table(title=f"samples to verdict at family alpha {ALPHA:g}")
    for col in ("mutant", "warpers", "fixed N", "sequential N", "information bound", "sequential / bound"):
        table.add_column(col)
    for row in report["samples_to_verdict"]:
        table.add_row(row["mutant"], row["warpers"], f"{row['fixed_n']} ({row['fixed_verdict']})",
                      f"{row['sequential_n']} ({row['sequential_verdict']})", f"{row['information_bound_n']:.0f}",
                      f"{row['sequential_over_bound']:.2f}")
    console.print(table)
    m = report["matrix"]
    console.print(f"default matrix: {m['cases']} cases ({m['ran']} ran) x {m['samples']} samples, {m['workers']} "
                  f"workers: {m['seconds']:.0f}s; scaled to {m['default_samples']} samples: "
                  f"{m['scaled_to_default_samples_minutes']:.1f} min")
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
