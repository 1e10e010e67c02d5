"""Users' own generators through the factory protocol (``--generator module:function``)."""

from fixtures.releases import assisted_samples
from lossless_check.subjects.adapters import FactoryAdapter, resolve_generator
from lossless_check.faces.api import run_cases as run
from lossless_check.evidence.results import Case
from lossless_check.laws.scenarios import IID


def test_factory_specs_resolve_to_the_factory_adapter():
    resolved = resolve_generator("fixtures.factories:assisted")
    assert isinstance(resolved.adapter, FactoryAdapter) and resolved.display_name == "assisted"


@assisted_samples()
def test_an_honest_factory_is_lossless_and_a_greedy_one_is_not():
    cases = [Case(resolve_generator(f"fixtures.factories:{name}"), {"top_k": 3}, scenario=IID)
             for name in ("assisted", "greedy_with_softmax_q")]
    honest, greedy = run(cases, 1000, 1e-6, seed=0, sequential=True).cases
    assert honest.verdict == "lossless", honest.reason
    assert greedy.verdict == "not_lossless" and "e_value" in greedy.failed_checks, greedy.reason


def test_a_factory_returning_something_else_is_an_error():
    case = Case(resolve_generator("fixtures.factories:not_a_generator"), {}, scenario=IID)
    result = run([case], 10, 1e-6, seed=0, sequential=False).cases[0]
    assert result.verdict == "error" and "not a CandidateGenerator" in result.reason
