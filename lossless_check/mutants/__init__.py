"""The negative controls the mutation self-test runs (``lossless-check mutants``): mutant candidate generators,
each a small subclass of a real transformers generator reproducing one known bug class, or an equivalent change
that must pass. They ship in the package, so the self-test runs from the wheel; test-only mutants stay in the
repository's ``fixtures/mutants``. :mod:`lossless_check.faces.mutant_catalog` names them with the bug each has.

Imports transformers and torch only (nothing of lossless_check): a mutant is what a user's generator would be.
"""
