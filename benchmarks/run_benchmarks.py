"""Benchmarks for lossless-check, measured side by side in one run (ratios, not absolute timings).

    python benchmarks/run_benchmarks.py [--quick] [--json PATH]

1. throughput: harness step-mode samples/s (batched trials through the real generator and the real
   verifier) against the bare-verifier loop on the same scenario and warpers in the same process:
   drafts drawn from the processed drafter law with ``torch.multinomial``, the cached processed
   target logits, the installed ``_speculative_sampling``, nothing else. Arms interleaved in blocks
   so machine noise hits both alike; the harness at batch 1 (what it did before batching) beside.
   The same at V = 32,000 (``zipf32k``, ``top_p=0.9``) and 49,152 (``lm49k``, ``top_k=50``), where the
   bare loop's laws are one tensor per position (:func:`bare_verifier_loop_large`), beside a bare loop
   drawing as the harness does there (by inverse CDF: its drafts and the verifier's one draw).
   Generate mode: the harness's collection (hooks, the verifier watch, the bookkeeping) against a bare
   loop of the same ``generate()`` call with the same stubs and config (:func:`bare_generate_loop`).
2. scaling: the same cases with --workers 1 and 2 (identical results asserted).
3. samples to verdict for every negative control of the mutation catalog at family alpha 1e-6:
   the fixed-N test (the planned N at which it has power 0.99) vs the sequential test (trials to
   its verdict, mean over seeds) vs the information bound log(1/alpha) / KL(law under the bug ||
   target law) at the position the bug first reaches; and a clean pass under --detect-tv.
4. matrix wall time: --matrix default over every generator, each mode, at the default sample
   count, 2 workers (the README's main job is the step row).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import nullcontext

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.set_verbosity_error()

from lossless_check.subjects.adapters import ADAPTERS, resolve_generator  # noqa: E402
from lossless_check.faces.api import run_cases  # noqa: E402
from lossless_check.faces.cli import DEFAULT_SAMPLES
from lossless_check.modes.sample_size import samples_to_detect  # noqa: E402
from lossless_check.laws.matrix import matrix  # noqa: E402
from lossless_check.modes.generate import _setup as generate_setup, collect as collect_generations  # noqa: E402
from lossless_check.modes.interception import VerifierDraws, inverse_cdf_tokens  # noqa: E402
from lossless_check.modes.loop_round import one_round  # noqa: E402
from subject_time import SubjectTime  # noqa: E402
from lossless_check.modes.randomness import FRESH_CALLS  # noqa: E402
from lossless_check.modes.replay import total_replays  # noqa: E402
from lossless_check.modes.step import StepCase  # noqa: E402
from lossless_check.faces.mutant_catalog import MUTANTS
from lossless_check.faces.mutation import information_bound, installed, samples_needed  # noqa: E402
from lossless_check.evidence.results import Case  # noqa: E402
from lossless_check.laws.scenarios import DEFAULT, SCENARIOS  # noqa: E402

ALPHA = 1e-6
#: Generators the throughput goal covers (the ones that draft with a model and return q).
THROUGHPUT_GENERATORS = ("AssistedCandidateGenerator", "DFlashTokenCandidateGenerator", "MTPCandidateGenerator",
                         "EarlyExitCandidateGenerator", "SinglePositionMultiTokenCandidateGenerator")


def bare_verifier_loop(step: StepCase, trials: int) -> float:
    """Seconds for ``trials`` rounds of the bare verifier: drafts drawn from the processed drafter law
    (``torch.multinomial``; the law of each drafted prefix computed once, outside the timing), the
    cached processed target logits, ``_speculative_sampling``."""
    gamma, prompt = step.positions - 1, step.prompt_ids
    q_of: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def q(prefix: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        if prefix not in q_of:
            probs = torch.tensor(step.laws.drafter(prefix), dtype=torch.float32)
            q_of[prefix] = probs, torch.log(probs)
        return q_of[prefix]

    for tokens in np.ndindex(*(step.case.scenario.vocab_size,) * (gamma - 1)):  # every prefix, untimed
        for j in range(gamma):
            q(tuple(int(t) for t in tokens[:j]))
    started = time.perf_counter()
    with torch.no_grad():
        for _ in range(trials):
            drafts, rows = (), []
            for _ in range(gamma):
                probs, log_probs = q_of[drafts]
                drafts += (int(torch.multinomial(probs, 1)),)
                rows.append(log_probs)
            candidate_ids = torch.cat([prompt, torch.tensor([drafts])], dim=1)
            step.verify(candidate_ids, torch.stack(rows)[None], gamma, step.target_logits(candidate_ids))
    return time.perf_counter() - started


def throughput(generator: str, trials: int, blocks: int = 4) -> dict:
    """Markov scenario, ``top_k=3``: harness (batched, and at batch 1) vs the bare-verifier loop."""
    case = Case(resolve_generator(generator), {"top_k": 3}, scenario=DEFAULT)
    batched, single = StepCase(case), StepCase(case, batch_size=1)
    bare = harness = harness_1 = 0.0
    per_block = trials // blocks
    for block in range(blocks):
        bare += bare_verifier_loop(batched, per_block)
        harness += batched.collect(per_block, seed=block).seconds
        harness_1 += single.collect(per_block // 4, seed=block).seconds * 4
    n = per_block * blocks
    return {"generator": generator, "trials": n, "bare_samples_per_s": n / bare,
            "harness_samples_per_s": n / harness, "ratio": bare / harness,
            "batch1_samples_per_s": n / harness_1, "batching_speedup": harness_1 / harness,
            "batch_note": batched.batching[1]}


#: Large-vocabulary throughput cases: ``(scenario, warpers)`` at V = 32,000 and 49,152.
LARGE_VOCABULARY_CASES = (("zipf32k", {"top_p": 0.9}), ("lm49k", {"top_k": 50}))


def bare_verifier_loop_large(step: StepCase, trials: int, same_draws: bool = False) -> float:
    """:func:`bare_verifier_loop` at a large vocabulary, where drafted prefixes cannot be enumerated:
    with a drafter and target table that do not read the previous token (``iid``, ``per_position``)
    and a history-free stack, each position's processed laws are one tensor, computed once, untimed.

    ``same_draws``: its drafts and the verifier's draw by inverse CDF, as the harness makes them
    (:func:`~lossless_check.modes.interception.inverse_cdf_tokens`,
    :class:`~lossless_check.modes.interception.VerifierDraws`); by default torch's kernel."""
    scenario = step.case.scenario
    assert "markov" not in (scenario.target.kind, scenario.drafter.kind), "the laws must not depend on the tokens"
    gamma, prompt = step.positions - 1, step.prompt_ids
    laws = [torch.tensor(step.laws.drafter((0,) * j), dtype=torch.float32)[None] for j in range(gamma)]
    log_laws = torch.cat([torch.log(q) for q in laws])[None]
    target = step.target_side.computed(torch.cat([prompt, torch.zeros(1, gamma, dtype=torch.long)], dim=1))
    draws = VerifierDraws(scenario.vocab_size) if same_draws else nullcontext()
    draft = inverse_cdf_tokens if same_draws else (lambda q: torch.multinomial(q, 1))
    started = time.perf_counter()
    with torch.no_grad(), draws:
        for _ in range(trials):
            drafts = torch.cat([draft(q) for q in laws], dim=1)
            step.verify(torch.cat([prompt, drafts], dim=1), log_laws, gamma, target.clone())
    return time.perf_counter() - started


def throughput_large(generator: str, scenario: str, warpers: dict, trials: int, blocks: int = 2) -> dict:
    """The harness (batched) against :func:`bare_verifier_loop_large` on a large-vocabulary scenario.

    The harness makes the batch-1 calls of a case of :data:`DEFAULT_SAMPLES` trials in proportion: its
    replays (:func:`~lossless_check.modes.replay.total_replays`) and its fresh-draw calls
    (:data:`~lossless_check.modes.randomness.FRESH_CALLS`), per trial."""
    case = Case(resolve_generator(generator), warpers, scenario=SCENARIOS[scenario])
    step = StepCase(case)
    bare = bare_same = harness = 0.0
    per_block = trials // blocks
    replays = round(per_block * total_replays(DEFAULT_SAMPLES) / DEFAULT_SAMPLES)
    fresh = round(per_block * FRESH_CALLS / DEFAULT_SAMPLES)
    subject = SubjectTime()
    for block in range(blocks):
        bare += bare_verifier_loop_large(step, per_block)
        bare_same += bare_verifier_loop_large(step, per_block, same_draws=True)
        with subject:
            harness += step.collect(per_block, seed=block, replays=replays, fresh=fresh).seconds
    n = per_block * blocks
    return {"generator": generator, "scenario": scenario, "vocab": case.scenario.vocab_size, "trials": n,
            "bare_samples_per_s": n / bare, "harness_samples_per_s": n / harness, "ratio": bare / harness,
            # The subject's own get_candidates: a harness costing nothing else would reach bare / subject.
            "subject_share": subject.seconds / harness, "ratio_ceiling": bare / subject.seconds,
            "bare_same_draws_samples_per_s": n / bare_same, "ratio_same_draws": bare_same / harness,
            "batch_note": step.batching[1]}


def print_large_throughput(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="step-mode throughput at large vocabularies: harness vs the bare-verifier loop (one process)")
    for col in ("generator", "scenario", "bare verifier samples/s", "harness samples/s", "harness / bare",
                "get_candidates' share", "ceiling", "bare, the harness's draws", "harness / that"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["generator"], f"{row['scenario']} (V={row['vocab']:,})", f"{row['bare_samples_per_s']:.0f}",
                      f"{row['harness_samples_per_s']:.0f}", f"{row['ratio']:.2f}x", f"{row['subject_share']:.0%}",
                      f"{row['ratio_ceiling']:.2f}x",
                      f"{row['bare_same_draws_samples_per_s']:.0f}", f"{row['ratio_same_draws']:.2f}x")
    Console().print(table)


#: Generate-mode throughput cases: the markov8 scenario under ``top_k=3``, ``max_new_tokens`` 4.
GENERATE_GENERATORS = ("AssistedCandidateGenerator", "DFlashTokenCandidateGenerator", "PromptLookupCandidateGenerator")


def bare_generate_loop(setup, trials: int) -> float:
    """Seconds for ``trials`` unmodified ``generate()`` calls with the case's stubs and config, nothing else."""
    started = time.perf_counter()
    with torch.no_grad():
        for _ in range(trials):
            setup.target.generate(setup.prompt_ids, generation_config=setup.generation_config, **setup.generate_kwargs)
    return time.perf_counter() - started


def generate_throughput(generator: str, trials: int, blocks: int = 4, max_new_tokens: int = 4) -> dict:
    """Generate mode's collection (the harness) against :func:`bare_generate_loop`, arms interleaved."""
    case = Case(resolve_generator(generator), {"top_k": 3}, "generate", DEFAULT, max_new_tokens=max_new_tokens)
    setup = generate_setup(case, max_new_tokens)
    bare = harness = 0.0
    per_block = trials // blocks
    for block in range(blocks):
        bare += bare_generate_loop(setup, per_block)
        harness += collect_generations(setup, per_block, max_new_tokens, block).seconds
    n = per_block * blocks
    return {"generator": generator, "trials": n, "bare_samples_per_s": n / bare, "harness_samples_per_s": n / harness,
            "ratio": bare / harness}


def bare_round_loop(rounds, trials: int) -> float:
    """Seconds for ``trials`` first rounds of ``generate()`` as a no-q step case calls it (the same stubs,
    config and one-round stop), on the target's own class: without the harness's watch of each
    ``get_candidates`` call (its randomness watch, the candidate checks, the bookkeeping). Releases up to
    5.17 also ask the stop of the candidate: there the bare round keeps one token less."""
    target = rounds.models.target
    watched, target.__class__ = type(target), type(target).__mro__[1]
    started = time.perf_counter()
    try:
        with torch.no_grad():
            for _ in range(trials):
                target.generate(rounds.prompt_ids, generation_config=rounds.config,
                                stopping_criteria=one_round([]), **rounds.models.generate_kwargs)
    finally:
        target.__class__ = watched
    return time.perf_counter() - started


#: Title of :func:`round_throughput`'s table.
ROUND_TITLE = "a no-q generator's step rounds: harness vs the same generate() calls unwatched (markov8, top_k=3, one process)"


def round_throughput(generator: str, trials: int, blocks: int = 4) -> dict:
    """A no-q generator's step rows (each trial one real ``generate()`` round, :mod:`~lossless_check.modes.loop_round`)
    against :func:`bare_round_loop`, arms interleaved (markov8, ``top_k=3``)."""
    step = StepCase(Case(resolve_generator(generator), {"top_k": 3}, scenario=DEFAULT))
    rounds = step.loop_rounds
    bare = harness = 0.0
    per_block = trials // blocks
    for block in range(blocks):
        bare += bare_round_loop(rounds, per_block)
        harness += rounds.collect(per_block, seed=block, width=step.positions).seconds
    n = per_block * blocks
    return {"generator": generator, "trials": n, "bare_samples_per_s": n / bare, "harness_samples_per_s": n / harness,
            "ratio": bare / harness}


def print_generate_throughput(rows: list[dict], title: str = "generate-mode throughput: harness vs a bare generate() "
                                                               "loop (markov8, top_k=3, K=4, one process)") -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("generator", "bare generate() samples/s", "harness samples/s", "harness / bare"):
        table.add_column(col)
    for row in rows:
        table.add_row(row["generator"], f"{row['bare_samples_per_s']:.0f}", f"{row['harness_samples_per_s']:.0f}",
                      f"{row['ratio']:.2f}x")
    Console().print(table)


def scaling(samples: int) -> dict:
    stacks = ({}, {"top_k": 3}, {"temperature": 0.6}, {"top_p": 0.7})
    cases = [Case(resolve_generator(g), w, scenario=SCENARIOS["iid8"]) for g in ("DFlashTokenCandidateGenerator",
                                                                   "AssistedCandidateGenerator") for w in stacks]
    timings, outputs = {}, {}
    for workers in (1, 2):
        started = time.perf_counter()
        results = run_cases(cases, samples, ALPHA, 0, workers, sequential=False).cases
        timings[workers] = time.perf_counter() - started
        outputs[workers] = [(r.verdict, r.tv, r.p_value, r.acceptance_rate) for r in results]
    assert outputs[1] == outputs[2], "results depend on the worker count"
    return {"cases": len(cases), "samples": samples, "seconds_1": timings[1], "seconds_2": timings[2],
            "speedup": timings[1] / timings[2], "cores": os.cpu_count(), "identical_results": True}


def samples_to_verdict(seeds: int, max_samples: int) -> list[dict]:
    """Every bug of the mutation catalog: fixed-N planned size, sequential trials to verdict, bound."""
    rows = []
    for mutant in MUTANTS:
        bound = information_bound(mutant, ALPHA) if installed(mutant) else None
        if bound is None:
            continue
        case = Case(resolve_generator(mutant.spec), mutant.warpers, scenario=SCENARIOS[mutant.scenario])
        results = [run_cases([case], max_samples, ALPHA, seed).cases[0] for seed in range(seeds)]
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
    result = run_cases([case], planned, ALPHA, 0).cases[0]
    return {"detect_tv": tv, "planned_samples": planned, "samples": result.samples, "verdict": result.verdict,
            "tv_detectable": result.tv_detectable}


def matrix_wall_time(samples: int, workers: int) -> list[dict]:
    """``--matrix default`` over every generator in each mode at ``samples`` per case (sequential, the default)."""
    rows = []
    for mode in ("step", "provenance", "generate"):
        cases = [Case(resolve_generator(g), w, mode, DEFAULT) for g in ADAPTERS for w in matrix("default")]
        started = time.perf_counter()
        results = run_cases(cases, samples, ALPHA, 0, workers).cases
        seconds = time.perf_counter() - started
        rows.append({"mode": mode, "cases": len(cases), "ran": sum(r.verdict not in ("skipped", "error") for r in results),
                     "verdicts": {v: sum(r.verdict == v for r in results) for v in ("lossless", "not_lossless",
                                                                                     "error", "vacuous", "skipped")},
                     "samples": samples, "workers": workers, "seconds": seconds})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run of the benchmark itself)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--large-only", action="store_true", help="only the large-vocabulary throughput table")
    parser.add_argument("--generate-only", action="store_true",
                        help="only the generate-mode throughput tables (generate mode; a no-q generator's step rounds)")
    args = parser.parse_args()
    size = 400 if args.quick else 2000
    generate = [generate_throughput(g, 200 if args.quick else 1000) for g in GENERATE_GENERATORS]
    rounds = [round_throughput("PromptLookupCandidateGenerator", 400 if args.quick else 2000)]
    if args.generate_only:
        print_generate_throughput(generate)
        print_generate_throughput(rounds, ROUND_TITLE)
        print(json.dumps(generate + rounds, indent=2))
        return
    large = [throughput_large(g, name, w, 500 if args.quick else 2000)
             for name, w in LARGE_VOCABULARY_CASES for g in THROUGHPUT_GENERATORS]
    if args.large_only:
        print_large_throughput(large)
        print(json.dumps(large, indent=2))
        return
    report = {
        # Blocks of 2,000 trials: full 512-row calls (blocks of 500 measure a batched call's fixed cost).
        "throughput": [throughput(g, 400 if args.quick else 8000) for g in THROUGHPUT_GENERATORS],
        "throughput_large": large,
        "generate_throughput": generate,
        "round_throughput": rounds,
        "scaling": scaling(size * 2),
        "samples_to_verdict": samples_to_verdict(2 if args.quick else 8, 5000),
        "clean_pass": clean_pass(0.2 if args.quick else 0.1),
        "matrix": matrix_wall_time(200 if args.quick else DEFAULT_SAMPLES, 2),
    }
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="step-mode throughput: harness vs the bare-verifier loop (markov8, top_k=3, one process)")
    for col in ("generator", "bare verifier samples/s", "harness samples/s", "harness / bare", "batch-1 samples/s",
                "batching speedup"):
        table.add_column(col)
    for row in report["throughput"]:
        table.add_row(row["generator"], f"{row['bare_samples_per_s']:.0f}", f"{row['harness_samples_per_s']:.0f}",
                      f"{row['ratio']:.2f}x", f"{row['batch1_samples_per_s']:.0f}", f"{row['batching_speedup']:.1f}x")
    console.print(table)
    print_large_throughput(report["throughput_large"])
    print_generate_throughput(report["generate_throughput"])
    print_generate_throughput(report["round_throughput"], ROUND_TITLE)
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
                      f"{m['workers']} workers: {m['seconds']:.0f} s; {m['verdicts']}")
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)


if __name__ == "__main__":
    main()
