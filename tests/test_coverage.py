"""--coverage: which of the subject's code a run executed, measured in every process and reported per function."""

import json
from pathlib import Path

import pytest

import fixtures.coverage_user as user
from lossless_check.faces.cli import build_parser
from lossless_check.outputs.coverage_report import build_report, line_ranges
from lossless_check.running.code_coverage import collecting
from lossless_check.running.engine import Engine
from lossless_check.subjects.code_scope import CodeFile, out_of_reach, subject_files

USER_FILE = str(Path(user.__file__).resolve())


def _line(marker: str) -> int:
    """The line of fixtures/coverage_user.py that carries ``# coverage: marker``."""
    lines = Path(USER_FILE).read_text().splitlines()
    return next(n for n, text in enumerate(lines, start=1) if text.rstrip().endswith(f"# coverage: {marker}"))


def _measure(workers: int, arguments: list[tuple]):
    with collecting((USER_FILE,)) as session:  # no import-time lines wanted: no fresh interpreter importing it
        with Engine(workers) as engine:
            outcomes = []
            for args in arguments:  # one map per task: a raising task ends its map
                try:
                    outcomes += engine.map(user.sign, [args, args])
                except ValueError as exc:
                    outcomes.append(str(exc))
        cov = session.finish()
    return outcomes, session, build_report(cov, [CodeFile("fixtures.coverage_user", USER_FILE)])


@pytest.mark.heavy  # two spawned workers importing torch: 40 s on 2 busy cores
def test_worker_processes_measure_and_the_driver_merges():
    outcomes, session, report = _measure(2, [(1,), (0,)])
    assert outcomes == [1, 1, "zero has no sign"]  # results and exceptions come through unchanged
    assert session.processes >= 2  # this process and at least one worker
    [sign] = report.functions("sign")
    # Only workers ran sign(): its lines are known here only if their data was merged.
    assert _line("positive") not in sign.never_run and _line("zero") not in sign.never_run
    # Negative control: the branch no task took is reported as never run.
    assert sign.never_run == [_line("negative")]
    assert sign.run == sign.statements - 1


def test_the_driver_measures_in_process_runs_too():
    _, session, report = _measure(1, [(-1,)])
    [sign] = report.functions("sign")
    assert session.processes == 1
    assert _line("negative") not in sign.never_run and _line("positive") in sign.never_run


@pytest.mark.heavy  # three generate cases and the gate's reports under coverage: 100 s on 2 busy cores
def test_unreached_branch_of_a_user_generator_shows_in_the_gate_report(tmp_path):
    from lossless_check.faces.gate import gate

    spec = "fixtures.coverage_user:BranchyPromptLookup"
    # On markov8 alone: prompt lookup's markov8-static rows meet static_cache_drafts_past_max_length (5.24-5.25).
    code = gate(spec, tmp_path, matrix_name="smoke", modes=("generate",), samples=40, generate_samples=40,
                verifier=False, coverage=True, scenario="markov8")
    assert code in (0, 5)  # 40 samples: lossless or inconclusive, never failing
    doc = json.loads((tmp_path / "coverage.json").read_text())
    functions = {f["function"]: f for file in doc["files"] for f in file["functions"]}
    mine = functions["BranchyPromptLookup.get_candidates"]
    assert mine["never_run"] == [_line("never reached")]  # the branch no case reached, and nothing else
    assert "BranchyPromptLookup" in doc["headline"] and f"line {_line('never reached')}" in doc["headline"]
    # The installed code is reported beside it: the loop ran, and its raises are out of reach with a reason.
    loop = functions["GenerationMixin._assisted_decoding"]
    assert loop["run"] > 0 and all(r["reason"] for r in loop["out_of_reach"])
    assert functions["PromptLookupCandidateGenerator.get_candidates"]["run"] > 0
    headline = json.loads((tmp_path / "report.json").read_text())["coverage"]["headline"]
    assert headline == doc["headline"] and headline in (tmp_path / "report.md").read_text()
    assert (tmp_path / "coverage-html" / "index.html").is_file() and (tmp_path / "coverage.html").is_file()


def test_scope_finds_the_installed_files_and_a_user_module_without_importing():
    files = subject_files(["PromptLookupCandidateGenerator", "fixtures.coverage_user:BranchyPromptLookup"])
    assert [f.module for f in files] == ["transformers.generation.candidate_generator",
                                         "transformers.generation.utils", "transformers.cache_utils",
                                         "fixtures.coverage_user"]
    assert all(Path(f.path).is_file() for f in files)
    loop, cache = files[1], files[2]
    assert loop.selects("GenerationMixin._assisted_decoding") and not loop.selects("GenerationMixin.generate")
    assert cache.selects("DynamicSlidingWindowLayer.crop") and not cache.selects("DynamicLayer.update")


@pytest.mark.parametrize("function, source, expected", [
    ("CandidateGenerator.get_candidates", 'raise NotImplementedError(f"{self.__class__}")', "abstract"),
    ("DynamicLayer.crop", 'raise ValueError("Calling `crop` with a positive value")', "raises ValueError"),
    ("GenerationMixin._assisted_decoding", "scores += tuple(new_logits[:, i, :] for i in range(n))", None),
    ("DynamicLayer.crop", "continue", None),  # a loop's continue is a gap unless a guard says otherwise
    ("AssistantVocabTranslatorCache.cleanup", "del cls._cache[key]", "never calls it"),
])
def test_lines_out_of_reach_say_why(function, source, expected):
    reason = out_of_reach(function, source)
    assert (reason is None) if expected is None else (expected in reason)


def test_guarded_blocks_are_out_of_reach_with_their_reason():
    from lossless_check.subjects.code_scope import guarded_lines

    source = "\n".join([
        "def f(x, synced_gpus, model_kwargs):",                   # 1
        "    if synced_gpus and x:",                              # 2
        "        return 1",                                       # 3
        "    if 'mm_encoder_outputs' in model_kwargs:",           # 4
        "        y = 2",                                          # 5
        "        return y",                                       # 6
        "    if x > 3:",                                          # 7
        "        return 3",                                       # 8 (a gap: nothing guards it)
        "    return 0",                                           # 9
    ])
    guarded = guarded_lines(source)
    assert set(guarded) == {3, 5, 6}
    assert "synced_gpus" in guarded[3] and "multimodal" in guarded[5]


def test_an_else_whose_if_generate_always_takes_is_out_of_reach_and_its_if_body_is_not():
    from lossless_check.subjects.code_scope import guarded_lines

    source = "\n".join([
        "def get_candidates(self, ids):",                         # 1
        "    if self.logits_processor is not None:",              # 2
        "        ids = self.logits_processor(ids)",               # 3 (a gap if never run)
        "    else:",                                              # 4
        "        ids = ids.argmax(-1)",                           # 5
        "    return ids",                                         # 6
    ])
    guarded = guarded_lines(source)
    assert set(guarded) == {5} and "LogitsProcessorList" in guarded[5]


def test_line_ranges():
    assert line_ranges([9, 3, 4, 5]) == [[3, 5], [9, 9]]


def test_coverage_is_asked_for():
    # Off by default: it costs more than 15% of a gate's time (docs/reference/coverage.md).
    parser = build_parser()
    assert parser.parse_args(["gate", "--generator", "X"]).coverage is False
    assert parser.parse_args(["gate", "--generator", "X", "--coverage"]).coverage is True
    assert parser.parse_args(["run"]).coverage is False
    assert parser.parse_args(["run", "--coverage"]).coverage is True


@pytest.mark.heavy  # greedy rows of the assistant model on every stateful kind, under coverage: about 60 s
def test_the_stateful_kinds_run_every_crop_the_release_rolls_back():
    """Every ``crop`` of the release's cache-layer kinds runs (or is out of reach with a reason) in the greedy rows
    of the assistant model on the stateful kinds alone: the kinds are there for it (docs/reference/coverage.md
    measures the whole gate). Negative control: without the ``indexed`` kind, ``DynamicIndexedLayer.crop`` never runs."""
    from lossless_check.faces.case_lists import stateful_cases
    from lossless_check.faces.coverage_option import measured
    from lossless_check.laws.stateful import refusal
    from lossless_check.modes.greedy import run_greedy_case
    from lossless_check.subjects.adapters import resolve_generator

    if refusal("linear") is not None:
        pytest.skip(f"the release refuses stateful targets: {refusal('linear')}")
    rows = stateful_cases([resolve_generator("AssistedCandidateGenerator")], [{}], mode="greedy")

    def crops(cases):
        with measured(["AssistedCandidateGenerator"]) as measurement:
            for case in cases:
                run_greedy_case(case)
        return {f.function: f for f in measurement.report().functions() if f.function.endswith(".crop")}

    every = crops(rows)
    # The layer kinds only these targets hold (the gate's other cases run the rest: a sliding window's crop before
    # the window fills, the encoder-decoder cache's, the static sliding layer's).
    theirs = [f"{layer}.crop" for layer in ("DynamicLayer", "StaticLayer", "DynamicIndexedLayer", "StaticIndexedLayer",
                                            "LinearAttentionCacheLayerMixin", "LinearAttentionAndFullAttentionLayer",
                                            "LinearAttentionAndSlidingWindowAttentionLayer")]
    assert set(theirs) <= set(every)
    assert all(every[name].never_run == [] for name in theirs), {name: every[name].never_run for name in theirs}
    without = crops([c for c in rows if c.scenario.target_kind != "indexed"])  # control
    assert without["DynamicIndexedLayer.crop"].never_run
