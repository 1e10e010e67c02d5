"""``lossless-check models`` on saved pairs whose target keeps recurrent state (:mod:`fixtures.stateful_pair`).

A tiny Mamba2 pair (SSM layers only) and a tiny Qwen3-Next pair (a linear-attention and a full-attention
layer), seeded, saved with ``save_pretrained``. Releases before 5.25.0 refuse speculative decoding on such
targets (the test says so and skips); on 5.25.0 a rejected full draft restores the recurrent state one token
too early (findings/stateful_rollback_one_state_short), which the greedy rows see exactly.
"""

import json

import pytest

from fixtures.releases import INSTALLED, STATEFUL_ROLLBACK_ONE_STATE_SHORT, STATEFUL_TARGETS_REFUSED, within
from fixtures.stateful_pair import KINDS, save_stateful_pair
from lossless_check.faces.cli import main

pytestmark = [
    pytest.mark.heavy,  # the SSM layers' pure-PyTorch kernels: about 1-2 min a pair on 2 cores
    pytest.mark.skipif(within(STATEFUL_TARGETS_REFUSED), reason=f"transformers {INSTALLED} refuses speculative "
                                                                 f"decoding on stateful targets (from 5.25.0 it runs)"),
]


@pytest.mark.parametrize("kind", KINDS)
def test_models_mode_on_a_stateful_pair(kind, tmp_path):
    """Sampling and greedy rows for Assisted and prompt lookup: where the rollback is one state short, the
    greedy comparisons differ from plain greedy decoding (exact) and the run exits 1; elsewhere every row is
    lossless."""
    target, assistant = save_stateful_pair(tmp_path, kind)
    out = tmp_path / "report.json"
    code = main(["models", "--target", target, "--assistant", assistant, "--json", str(out), "--samples", "4",
                 "--max-new-tokens", "16"])
    rows = {r["generator"]: r for r in json.loads(out.read_text())["cases"]}
    assert set(rows) == {"AssistedCandidateGenerator", "PromptLookupCandidateGenerator"}
    for row in rows.values():
        assert row["statistical"]["tokens"] > 0 and row["greedy"]["comparisons"] == 4, row["reason"]
    if within(STATEFUL_ROLLBACK_ONE_STATE_SHORT):
        assert code == 1
        assert any(row["greedy"]["differ"] > 0 for row in rows.values()), [r["reason"] for r in rows.values()]
    else:
        assert code == 0 and all(row["verdict"] == "lossless" for row in rows.values())
