"""The subjects under test: an adapter per candidate-generator family (real generators built around the stubs),
the candidate contract, and the white-box checks of the installed verifier.

May import laws, stats and core.
"""
