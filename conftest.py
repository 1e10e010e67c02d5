# The repository root on sys.path, so tests import the negative controls as ``fixtures.mutants...``.
