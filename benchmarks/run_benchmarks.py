"""Benchmarks for lossless-check, measured side by side in one run (ratios, not absolute timings).

    python benchmarks/run_benchmarks.py [--quick] [--json PATH]

1. overhead: harness step-mode samples/s vs a bare loop of the same real calls (get_candidates,
   the target's processed logits, _speculative_sampling) with nothing else; arms interleaved in
   blocks so machine noise hits both alike. A third arm recomputes the target's logits and
   processors every trial (what the harness did before it cached them): the cache's speedup.
2. scaling: the same cases with --workers 1 and 2 (identical results asserted).
3. samples to verdict for every negative control of the mutation catalog at family alpha 1e-6:
   the fixed-N test (the planned N at which it has power 0.99) vs the sequential test (trials to
   its verdict, mean over seeds) vs the information bound log(1/alpha) / KL(law under the bug ||
   target law) at the position the bug first reaches; and a clean pass under --detect-tv.
4. matrix wall time: --matrix default over every sampling generator, step mode, measured at a
   reduced sample count and scaled to the default one (both printed). The full-size run is the
   README's main command; its measured time is in the closing notes.
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
from lossless_check.cli import samples_to_detect  # noqa: E402
from lossless_check.mutation import MUTANTS, information_bound, samples_needed  # noqa: E402
from lossless_check.matrix import matrix  # noqa: E402
from lossless_check.modes import run_modes  # noqa: E402
from lossless_check.runner import Case, StepCase, execute, run  # noqa: E402
from lossless_check.scenarios import DEFAULT, IID, SCENARIOS  # noqa: E402

ALPHA = 1e-6


def bare_loop(step: StepCase, trials: int, cached: bool = True) -> float:
    """Seconds for ``trials`` rounds of the real calls and nothing else; ``cached=False`` recomputes
    the target's logits and processors every round."""
    session = step.case.generator.adapter.session(step.context())
    prompt, length = step.prompt_ids, step.prompt_ids.shape[1]
    started = time.perf_counter()
    with torch.no_grad():
        for _ in range(trials):
            candidate_ids, candidate_logits = session.draft(prompt)
            gamma = candidate_ids.shape[1] - length
            new_logits = step.target_logits(candidate_ids) if cached else step.processed_target_logits(candidate_ids)
            step.verify(candidate_ids, candidate_logits, gamma, new_logits)
    return time.perf_counter() - started


def overhead(generator: str, trials: int, blocks: int = 4) -> dict:
    """Markov scenario, the default matrix's first history-dependent stack."""
    step = StepCase(Case(resolve_generator(generator), {"top_k": 3, "repetition_penalty": 2.0}, scenario=DEFAULT))
    bare = uncached = harness = 0.0
    per_block = trials // blocks
    for block in range(blocks):
        uncached += bare_loop(step, per_block, cached=False)
        bare += bare_loop(step, per_block)
        harness += step.collect(per_block, seed=block).seconds
    n = per_block * blocks
    return {"generator": generator, "trials": n, "bare_samples_per_s": n / bare,
            "harness_samples_per_s": n / harness, "overhead_ratio": harness / bare,
            "uncached_samples_per_s": n / uncached, "cache_speedup": uncached / bare}


def scaling(samples: int) -> dict:
    stacks = ({}, {"top_k": 3}, {"temperature": 0.6}, {"top_p": 0.7})
    cases = [Case(resolve_generator(g), w, scenario=IID) for g in ("DFlashTokenCandidateGenerator",
                                                                   "AssistedCandidateGenerator") for w in stacks]
    timings, outputs = {}, {}
    for workers in (1, 2):
        started = time.perf_counter()
        results = execute(cases, samples, 0, ALPHA, workers)
        timings[workers] = time.perf_counter() - started
        outputs[workers] = [(r.verdict, r.tv, r.p_value, r.acceptance_rate) for r in results]
    assert outputs[1] == outputs[2], "results depend on the worker count"
    return {"cases": len(cases), "samples": samples, "seconds_1": timings[1], "seconds_2": timings[2],
            "speedup": timings[1] / timings[2], "cores": os.cpu_count(), "identical_results": True}


def samples_to_verdict(seeds: int, max_samples: int) -> list[dict]:
    """Every bug of the mutation catalog: fixed-N planned size, sequential trials to verdict, bound."""
    rows = []
    for mutant in MUTANTS:
        bound = information_bound(mutant, ALPHA)
        if bound is None:
            continue
        case = Case(resolve_generator(mutant.spec), mutant.warpers, scenario=SCENARIOS[mutant.scenario])
        results = [run([case], max_samples, ALPHA, seed, sequential=True).cases[0] for seed in range(seeds)]
        caught = [r.samples for r in results if r.verdict == "not_lossless"]
        mean = float(np.mean(caught)) if caught else None
        rows.append({"mutant": results[0].generator, "warpers": case.warper_spec, "scenario": mutant.scenario,
                     "position": mutant.position, "fixed_n": samples_needed(mutant, ALPHA),
                     "sequential_n_mean": mean, "sequential_n": [r.samples for r in results],
                     "caught": f"{len(caught)}/{seeds}", "information_bound_n": bound,
                     "sequential_over_bound": mean / bound if mean and bound else None})
    return rows


def clean_pass(tv: float) -> dict:
    """A lossless case under ``--sequential --detect-tv``: it stops exactly where the TV is reached."""
    case = Case(resolve_generator("DFlashTokenCandidateGenerator"), {"top_k": 3}, scenario=DEFAULT)
    planned = samples_to_detect([case], tv, ALPHA, sequential=True)
    result = run([case], planned, ALPHA, 0, sequential=True).cases[0]
    return {"detect_tv": tv, "planned_samples": planned, "samples": result.samples, "verdict": result.verdict,
            "tv_detectable": result.tv_detectable}


def matrix_wall_time(samples: int, workers: int) -> list[dict]:
    """``--matrix default`` over every generator in each mode, at ``samples`` per case, scaled to the
    default sample count (provenance does not sample: its time is not scaled)."""
    rows = []
    for mode in ("step", "provenance", "generate"):
        cases = [Case(resolve_generator(g), w, mode, DEFAULT) for g in ADAPTERS for w in matrix("default")]
        started = time.perf_counter()
        results = run_modes(cases, samples, ALPHA, 0, workers).cases
        seconds = time.perf_counter() - started
        scale = 1 if mode == "provenance" else DEFAULT_SAMPLES / samples
        rows.append({"mode": mode, "cases": len(cases), "ran": sum(r.verdict not in ("skipped", "error") for r in results),
                     "samples": samples, "workers": workers, "seconds": seconds,
                     "scaled_to_default_samples_minutes": seconds * scale / 60, "default_samples": DEFAULT_SAMPLES})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run of the benchmark itself)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    size = 200 if args.quick else 1000
    report = {
        "overhead": [overhead(g, size) for g in ("DFlashTokenCandidateGenerator", "AssistedCandidateGenerator")],
        "scaling": scaling(size * 2),
        "samples_to_verdict": samples_to_verdict(2 if args.quick else 8, 5000),
        "clean_pass": clean_pass(0.2 if args.quick else 0.1),
        "matrix": matrix_wall_time(50 if args.quick else 200, 2),
    }
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="overhead: harness vs bare loop (same real calls)")
    for col in ("generator", "bare samples/s", "harness samples/s", "ratio", "uncached bare samples/s",
                "cache speedup"):
        table.add_column(col)
    for row in report["overhead"]:
        table.add_row(row["generator"], f"{row['bare_samples_per_s']:.0f}", f"{row['harness_samples_per_s']:.0f}",
                      f"{row['overhead_ratio']:.3f}", f"{row['uncached_samples_per_s']:.0f}",
                      f"{row['cache_speedup']:.2f}x")
    console.print(table)
    s = report["scaling"]
    console.print(f"scaling: workers 1 -> 2 speedup {s['speedup']:.2f}x on {s['cores']} cores "
                  f"({s['seconds_1']:.1f}s vs {s['seconds_2']:.1f}s), identical results")
    table = Table(title=f"samples to verdict at family alpha {ALPHA:g}")
    for col in ("mutant", "warpers", "pos", "fixed N (power 0.99)", "sequential N (mean)", "caught",
                "information bound", "sequential / bound"):
        table.add_column(col)

    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    for row in report["samples_to_verdict"]:
        table.add_row(row["mutant"], row["warpers"], str(row["position"]), fmt(row["fixed_n"], "d"),
                      fmt(row["sequential_n_mean"], ".0f"), row["caught"], fmt(row["information_bound_n"], ".0f"),
                      fmt(row["sequential_over_bound"], ".2f"))
    console.print(table)
    c = report["clean_pass"]
    console.print(f"clean pass, --sequential --detect-tv {c['detect_tv']}: planned {c['planned_samples']}, stopped at "
                  f"{c['samples']} ({c['verdict']}, tv_detectable {c['tv_detectable']:.4f})")
    for m in report["matrix"]:
        console.print(f"default matrix, {m['mode']} mode: {m['cases']} cases ({m['ran']} ran) x {m['samples']} samples, "
                      f"{m['workers']} workers: {m['seconds']:.0f}s; at {m['default_samples']} samples: "
                      f"{m['scaled_to_default_samples_minutes']:.1f} min")
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
