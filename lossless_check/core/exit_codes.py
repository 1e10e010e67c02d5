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
#: No answer. ``run``, ``gate``, ``fuzz``, ``models``: no subject failed, but one was not checked (every case of it
#: skipped, vacuous or unfinished) or a case is ``inconclusive`` (it could not have seen a departure of the stated
#: size): pytest's "no tests collected" is the model. ``sweep``/``bisect``: runs they aggregate failed, so they
#: give no answer for them (never a verdict).
EXIT_NO_ANSWER = 5

#: Verdicts that fail a subject.
FAILING = ("not_lossless", "error")
#: Verdicts that checked a subject: one with none of these among its cases was not checked.
CHECKED = FAILING + ("lossless",)


def exit_code_for(verdicts: dict[str, list[str]]) -> int:
    """The exit code of a run whose subjects (a name each) got ``verdicts``: 1 if any failed; else 5 if
    there is no subject, a subject none of whose cases was checked, or an ``inconclusive`` case; else 0."""
    every = [v for vs in verdicts.values() for v in vs]
    if any(v in FAILING for v in every):
        return EXIT_NOT_LOSSLESS
    if not verdicts or "inconclusive" in every or any(not set(vs) & set(CHECKED) for vs in verdicts.values()):
        return EXIT_NO_ANSWER
    return EXIT_OK
