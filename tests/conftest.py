import os

import numpy as np
import pytest

# Two cores are shared by pytest-xdist workers: one torch thread each avoids oversubscription.
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture
def target_factory():
    from lossless_check.stubs import fixed_logits_lm
    from lossless_check.tables import FixedLogits

    def make(rows=None, prompt_length=2):
        rows = np.linspace(-1, 1, 6) if rows is None else rows
        return fixed_logits_lm(FixedLogits.iid(rows), prompt_length=prompt_length)

    return make


# Hypothesis profiles for the fuzzing tests (tests/test_fuzz.py). "ci" (the default): a bounded,
# derandomized example budget, so CI runs the same examples every time. "deep": many random
# examples, for fuzzing by hand: HYPOTHESIS_PROFILE=deep pytest tests/test_fuzz.py.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True)
settings.register_profile("deep", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
