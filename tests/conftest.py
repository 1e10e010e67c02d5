import numpy as np
import pytest


@pytest.fixture
def target_factory():
    from lossless_check.stubs import fixed_logits_lm
    from lossless_check.tables import FixedLogits

    def make(rows=None, prompt_length=2):
        rows = np.linspace(-1, 1, 6) if rows is None else rows
        return fixed_logits_lm(FixedLogits.iid(rows), prompt_length=prompt_length)

    return make
