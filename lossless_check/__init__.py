"""lossless-check: statistical proof that speculative decoding in transformers is lossless.

The public API (everything else is internal)::

    import lossless_check as lc

    result = lc.check("DFlashTokenCandidateGenerator", warpers="top_k=3")   # -> CaseResult
    run = lc.run(["AssistedCandidateGenerator"], matrix="smoke")           # -> RunResult
    lc.fuzz("DFlashTokenCandidateGenerator")                               # -> FuzzResult
    lc.check_sampler("my_engine.sampling:rejection_sample")                # -> SamplerReport
    lc.strategies.warper_stacks()                                          # hypothesis strategies

Importing this package is cheap; torch and transformers load when a check runs.

The package is in layers, each a sub-package that imports only the ones below it (bottom to top):
``core``, ``stats``, ``laws``, ``subjects``, ``evidence``, ``running``, ``modes``, ``outputs``, ``history``,
``faces``; ``strategies`` (public hypothesis strategies) and the pytest entry point sit on top.
tests/test_layers.py keeps it so.
"""

__version__ = "0.1.0"
__all__ = ["CaseResult", "FuzzResult", "ModelsResult", "RunResult", "SamplerReport", "check", "check_models",
           "check_sampler", "fuzz", "run", "strategies"]

_EXPORTS = {"check": ("faces.api", "check"), "run": ("faces.api", "run"),
            "CaseResult": ("evidence.results", "CaseResult"), "RunResult": ("evidence.results", "RunResult"),
            "fuzz": ("faces.fuzzing", "fuzz"), "FuzzResult": ("faces.fuzzing", "FuzzResult"),
            "check_models": ("faces.models", "check_models"), "ModelsResult": ("faces.models", "ModelsResult"),
            "check_sampler": ("faces.api", "check_sampler"),
            "SamplerReport": ("subjects.sampler_check", "SamplerReport")}


def __getattr__(name: str):
    # Lazy: the pytest plugin imports this package in every pytest run, which must stay cheap.
    import importlib

    if name == "strategies":
        return importlib.import_module(".strategies", __name__)
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        return getattr(importlib.import_module(f".{module}", __name__), attr)
    raise AttributeError(f"module 'lossless_check' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
