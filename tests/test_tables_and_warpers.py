import numpy as np
import pytest

from lossless_check.core.errors import UsageError
from lossless_check.laws.tables import FixedLogits
from lossless_check.laws.warpers import format_warpers, parse_warpers


@pytest.mark.parametrize(
    "rows, message",
    [
        ([[0.0, float("nan")]], "NaN"),
        ([[0.0, float("inf")]], r"\+inf"),
        ([[-np.inf, -np.inf]], "every entry is -inf"),
        ([[1.0]], "at least 2 tokens"),
        ([], "non-empty"),
    ],
)
def test_bad_tables_give_one_line_errors(rows, message):
    with pytest.raises(UsageError, match=message):
        FixedLogits("per_position", np.asarray(rows, dtype=np.float64))


def test_table_shapes_are_checked_per_kind():
    with pytest.raises(UsageError, match="exactly one row"):
        FixedLogits("iid", np.zeros((2, 4)))
    with pytest.raises(UsageError, match="one row per token"):
        FixedLogits("markov", np.zeros((3, 4)))


def test_table_lookup_by_kind():
    rows = np.arange(12, dtype=float).reshape(3, 4)
    assert FixedLogits.per_position(rows).logits(7, 0).tolist() == rows[2].tolist()  # clamped to the last row
    markov = FixedLogits.markov(np.arange(16, dtype=float).reshape(4, 4))
    assert markov.logits(0, 2).tolist() == [8, 9, 10, 11]


def test_parse_and_format_round_trip():
    spec = parse_warpers("top_k=3, temperature=0.7,bad_words_ids=[[1],[2, 3]]")
    assert spec == {"top_k": 3, "temperature": 0.7, "bad_words_ids": [[1], [2, 3]]}
    assert parse_warpers(format_warpers(spec)) == spec
    assert parse_warpers("none") == {} and format_warpers({}) == "none"


@pytest.mark.parametrize(
    "spec, message",
    [
        ("top_k=banana", "not a number"),
        ("topk=3", "not a GenerationConfig option"),
        ("top_k", "expected key=value"),
        ("top_k=3,top_k=4", "given twice"),
        ("top_p=2", "must be a number in"),
        ("temperature=-1", "must be a number > 0"),
        ("top_k=2.5", "must be an integer"),
    ],
)
def test_bad_warper_specs(spec, message):
    with pytest.raises(UsageError, match=message):
        parse_warpers(spec)


def test_processors_are_captured_from_generate(target_factory):
    import torch

    from lossless_check.laws.warpers import capture_processors

    model = target_factory()
    processors, config = capture_processors(model, torch.tensor([[1, 2]]), {"top_k": 3, "temperature": 0.5}, 8)
    names = [type(p).__name__ for p in processors]
    assert "TemperatureLogitsWarper" in names and "TopKLogitsWarper" in names
    assert config.do_sample and config.max_length == 10


def test_values_generate_refuses_are_usage_errors(target_factory):
    import torch

    from lossless_check.laws.warpers import capture_processors

    with pytest.raises(UsageError, match="refused"):
        capture_processors(target_factory(), torch.tensor([[1, 2]]), {"bad_words_ids": [[-3]]}, 8)


def test_history_free_processors_ignore_the_history_on_this_release(target_factory):
    """Each catalog option whose processors :func:`history_free` calls free gives the same scores after
    any history (the row caches of the exact laws and of step mode's target rest on it); the history-
    dependent options are not called free, and their scores do move with the history (the check can fail)."""
    import torch

    from lossless_check.laws.expected import history_free
    from lossless_check.laws.matrix import available_catalog
    from lossless_check.laws.warpers import capture_processors

    model = target_factory(np.linspace(-2, 2, 6))
    histories = torch.tensor([[1, 2, 3, 4], [4, 4, 4, 4], [0, 5, 1, 2], [3, 1, 2, 0]])
    scores = torch.linspace(-2, 2, 6).expand(len(histories), 6)
    free_options, moved = [], []
    for entry in available_catalog():
        processors, _ = capture_processors(model, torch.tensor([[1, 2]]), entry.kwargs, 8)
        out = torch.cat([processors(h[None], scores[:1].clone()) for h in histories])
        same = all(torch.equal(out[0], row) for row in out[1:])
        if history_free(processors):
            assert same, entry.option
            free_options.append(entry.option)
        elif not same:
            moved.append(entry.option)
    here = {e.option for e in available_catalog()}
    assert {"temperature", "top_k", "top_p", "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff"} & here <= set(free_options)
    assert not {"repetition_penalty", "no_repeat_ngram_size", "min_new_tokens"} & set(free_options)
    assert "repetition_penalty" in moved and "no_repeat_ngram_size" in moved
