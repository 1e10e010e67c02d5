"""The exit codes of every ``lossless-check`` command (a public contract: CI reads them)."""

#: Every subject lossless (``sweep``/``bisect``: every run looked at gave a verdict).
EXIT_OK = 0
#: At least one subject not lossless, or an error verdict.
EXIT_NOT_LOSSLESS = 1
#: Bad usage or input: a one-line message, before any work.
EXIT_USAGE = 2
#: An internal error: a harness bug, never a missing package.
EXIT_INTERNAL = 3
#: Interrupted: what finished is kept; ``--resume`` continues.
EXIT_INTERRUPTED = 4
#: ``sweep``/``bisect``: runs they aggregate failed, so they give no answer for them (never a verdict).
EXIT_NO_ANSWER = 5
