"""Exceptions that carry a one-line message meant for a person."""


class UsageError(Exception):
    """Bad input from the user: a warper spec, a table, an option. The CLI exits 2."""


class GeneratorFailure(Exception):
    """The generator under test raised or returned malformed output. The case's verdict is ``error``."""


class NotApplicable(Exception):
    """The mode cannot test this generator (e.g. step mode and a generator that returns no q)."""


class Timeout(GeneratorFailure):
    """A chunk ran past its deadline: the generator hangs (never a reason to try another batch size)."""


class PlainSamplingFails(NotApplicable):
    """The installed processors raise on a prefix the case reaches: plain sampling itself fails there
    (``generate()`` raises with or without a drafter), so there is no output law to compare with."""
