# The repository root on sys.path, so tests import the test-only fixtures as ``fixtures...`` (the negative
# controls `lossless-check mutants` runs ship in the package: lossless_check/mutants).
