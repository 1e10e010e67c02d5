"""lossless-check: statistical proof that speculative decoding in transformers is lossless.

Importing this package is cheap; torch and transformers load when a check runs.
"""

__version__ = "0.1.0"
