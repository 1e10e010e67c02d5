"""The real loop's guarantee: a batched case's verdict and ``tv_detectable`` hold for batch-1 calls.

The mutants are built-in classes patched to be wrong only when they draft one row, installed under
the built-in's own name (``fixtures/mutants/batch_1_only.py``): their batched rows are lossless,
so only the batch-1 replay (``lossless_check/modes/replay.py``) can see them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import binomtest

import lossless_check as lc
from fixtures.mutants.batch_1_only import TRANSFORMS, batch_1_only, substituted
from fixtures.releases import DFLASH, lossless_builtins, needs
from lossless_check.evidence.results import Case
from lossless_check.faces.api import cases_for, run_cases
from lossless_check.laws.expected import first_token_law
from lossless_check.laws.scenarios import IID
from lossless_check.modes import replay, step, step_run
from lossless_check.modes.batching import STAGE_POWER
from lossless_check.modes.step import StepCase
from lossless_check.subjects.adapters import resolve_generator

WARPERS = "top_k=3"


def installed(name: str) -> type:
    from transformers.generation import candidate_generator

    return getattr(candidate_generator, name)


def position_1_effect(name: str, transform: str, scenario: str = "markov8") -> float:
    """Exact TV at position 1 of a batch-1 call of the mutant (``first_token_law``): drafts from the
    processed drafter law, the transformed q returned."""
    [case] = cases_for([name], [WARPERS], None, "step", scenario, 4)
    laws = StepCase(case).laws
    p, drafted = laws.target(()), laws.drafter(())
    if transform == "raw":
        raw = torch.tensor(case.scenario.drafter.rows[0], dtype=torch.float32)
    else:
        raw = torch.log(torch.tensor(drafted, dtype=torch.float32))
    returned = TRANSFORMS[transform](type("Generator", (), {"raw_logits": lambda self, like: raw})(), raw)
    q = torch.softmax(returned, dim=-1).double().numpy()
    return 0.5 * float(np.abs(first_token_law(p, drafted, q) - p).sum())


BUGS = [("AssistedCandidateGenerator", "uniform"), ("AssistedCandidateGenerator", "scaled_3"),
        pytest.param(DFLASH, "raw", marks=needs(DFLASH)), pytest.param(DFLASH, "uniform", marks=needs(DFLASH))]


@pytest.mark.parametrize("name,transform", BUGS)
def test_a_bug_at_batch_1_only_moves_the_case_to_batch_1_and_is_flagged(name, transform):
    """Default run (markov8, 5000 trials, sequential): the replay sees the first mutant row, the case
    runs at batch 1 and says why, and the bug is flagged there (a sequential case stops at its first
    rejection, so its ``tv_detectable`` is the figure of the trials it ran, not a claim to compare with)."""
    with substituted(name, batch_1_only(installed(name), transform)):
        result = lc.check(name, warpers=WARPERS)
    note = result.batch["note"]
    assert result.batch["batch_size"] == 1 and note.startswith("batch 1: row ") and "softmax(q)" in note, note
    assert result.verdict == "not_lossless", (position_1_effect(name, transform), result.reason)


@needs(DFLASH)
def test_a_small_bug_at_batch_1_only_runs_at_batch_1_with_its_own_guarantee():
    """q logits x1.15 at batch 1 (position-1 TV below what 1000 trials detect): never passed on batched
    evidence; the reported ``tv_detectable`` is the batch-1 run's own."""
    name = "DFlashTokenCandidateGenerator"
    with substituted(name, batch_1_only(installed(name), "scaled_1.15")):
        result = lc.check(name, warpers=WARPERS, samples=1000)
    assert result.batch["batch_size"] == 1 and result.batch["batched_trials"] == 0, result.batch
    assert "replays" not in result.batch and result.batch["note"].startswith("batch 1: row ")


@pytest.mark.parametrize("name", lossless_builtins("AssistedCandidateGenerator", DFLASH))
def test_an_equivalent_q_at_batch_1_stays_batched_and_passes(name):
    """A constant added to q's logits at batch 1 is the same softmax: batched, replays match, lossless."""
    with substituted(name, batch_1_only(installed(name), "shift")):
        result = lc.check(name, warpers=WARPERS)
    assert result.verdict == "lossless", result.reason
    assert result.batch["batch_size"] > 1 and result.batch["replays"] == replay.total_replays(5000)
    assert result.tv_detectable == pytest.approx(result.batch["tv_detectable_batched"] + result.batch["replay_tv"])


@needs(DFLASH)
def test_greedy_drafts_at_batch_1_only_are_caught():
    """Greedy drafts with a softmax q at batch 1 only (``dflash_greedy_at_batch_1``): the replay draws
    no token from the row's law, so the case runs at batch 1, where the bug shows."""
    mutant = resolve_generator("fixtures.mutants.dflash_greedy_at_batch_1:DFlashGreedyAtBatch1")
    result = run_cases([Case(mutant, {"temperature": 1.5}, scenario=IID)], 2000, 1e-6, 0).cases[0]
    assert result.batch["batch_size"] == 1 and "replay" in result.batch["note"], result.batch
    assert result.verdict == "not_lossless", result.reason


@needs(DFLASH)
def test_a_gumbel_max_sampler_stays_batched_its_noise_forced_row_by_row():
    """Gumbel-max drafts (``fixtures/samplers.py``): each replay forces its noise to the row's, so an
    honest sampler keeps batched speed and passes, and one wrong at batch 1 only (its negative
    control) is seen by the replays, runs at batch 1 and is flagged."""
    def check(name: str):
        case = Case(resolve_generator(f"fixtures.samplers:{name}"), {"top_k": 3}, scenario=IID)
        return run_cases([case], 2000, 1e-6, 0).cases[0]

    honest = check("GumbelDFlash")
    assert honest.verdict == "lossless" and honest.batch["batch_size"] > 1, (honest.reason, honest.batch)
    assert honest.batch["replays"] == replay.total_replays(2000)
    bug = check("GumbelDFlashBatch1Bug")
    assert bug.batch["batch_size"] == 1 and bug.batch["note"].startswith("batch 1: row "), bug.batch
    assert bug.verdict == "not_lossless", bug.reason
    same = check("GumbelDFlashReseeded")  # the same noise in every call: the unforced calls see it repeat
    assert same.batch["batch_size"] == 1 and "same vocabulary-wide noise" in same.batch["note"], same.batch
    assert same.verdict == "not_lossless", same.reason


#: Seeded runs of the power check, and the misses it allows: if the power at the reported
#: ``tv_detectable`` were only 0.99, P(misses > 2 of 30) = 0.0033, this check's false-failure rate;
#: against a power of 0.5 (the overclaiming variant below), it fails with probability 1 - 5e-7.
POWER_RUNS, ALLOWED_MISSES = 30, 2
#: Misses that decide the negative control: 4 of 30 (26 flagged at most) has P = 2.1e-4 < 1e-3 at power 0.99.
DECIDING_MISSES = 4


def detection_count(name: str, runs: int, stop_at_misses: int, samples: int = 1000) -> tuple[int, int, float]:
    """Seeded runs of a mutant wrong at batch 1 in a random share ``f`` of its calls (uniform q), with
    ``f`` chosen so that its batch-1 position-1 TV equals the ``tv_detectable`` the harness reports for
    the real generator: (runs made, misses, that TV). The runs stop at ``stop_at_misses`` misses (a
    curtailed count: misses only grow, so the assertions below, monotone in the misses of all ``runs``,
    already hold or fail there as they would after every run; the error rates are those stated above)."""
    clean = lc.check(name, warpers=WARPERS, samples=samples)
    claim = clean.tv_detectable
    share = claim / position_1_effect(name, "uniform")
    assert clean.verdict == "lossless" and 0 < share < 1, (clean.reason, share)
    mutant = batch_1_only(installed(name), "uniform", probability=share)
    made = misses = 0
    with substituted(name, mutant):
        [case] = cases_for([name], [WARPERS], None, "step", "markov8", 4)
        while made < runs and misses < stop_at_misses:
            misses += run_cases([case], samples, 1e-6, made).cases[0].verdict != "not_lossless"
            made += 1
    return made, misses, claim


# heavy (.ci/run's first step; issue 41): 20 s or more in the suite (29 s on 2 cores).
@needs(DFLASH)
@pytest.mark.heavy
def test_power_at_the_reported_tv_detectable_holds_for_batch_1_only_bugs():
    made, misses, claim = detection_count("DFlashTokenCandidateGenerator", POWER_RUNS, ALLOWED_MISSES + 1)
    assert misses <= ALLOWED_MISSES, (made, misses, claim)


@needs(DFLASH)
def test_the_power_check_fails_when_replays_shrink_but_the_claim_does_not(monkeypatch):
    """Negative control: one replay a case, while ``tv_detectable`` still claims what the full share
    of replays proves (the batch-1 arm shrunk back, the claim kept)."""
    claimed = replay.replay_detectable_tv(replay.total_replays(1000), STAGE_POWER)
    for module in (step, step_run):  # StepRun takes the replays of a chunk, StepCase.collect those of a call
        monkeypatch.setattr(module, "replays_per_chunk", lambda samples: [1] + [0] * 8)
    monkeypatch.setattr(step, "replay_detectable_tv", lambda replays, power: claimed)
    made, misses, _ = detection_count("DFlashTokenCandidateGenerator", POWER_RUNS, DECIDING_MISSES)
    assert misses > ALLOWED_MISSES, (made, misses)
    # The most that all 30 runs could flag: the runs not made counted as flagged.
    assert binomtest(POWER_RUNS - misses, POWER_RUNS, 0.99, alternative="less").pvalue < 1e-3
