"""``--coverage`` on ``run``, ``gate`` and ``models``: the subject's code a command executed, measured with coverage.py.

:func:`measured` wraps a command's work: it starts measuring the files of
:func:`~lossless_check.subjects.code_scope.subject_files` here and in every task the run's engine sends to a
worker process or Ray (:mod:`lossless_check.running.code_coverage`), and :meth:`Measurement.report` builds the
report (:mod:`lossless_check.outputs.coverage_report`) once the work is done.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

from lossless_check.outputs.coverage_report import CoverageReport, build_report, write_coverage_reports
from lossless_check.running.code_coverage import collecting
from lossless_check.subjects.code_scope import subject_files


def add_coverage_option(parser, default: bool) -> None:
    """``--coverage`` / ``--no-coverage`` (``default``: on or off)."""
    import argparse

    parser.add_argument("--coverage", action=argparse.BooleanOptionalAction, default=default,
                        help="measure which of the installed transformers' speculative-decoding code (candidate "
                             "generators, _assisted_decoding, _speculative_sampling, _get_candidate_generator, the "
                             "caches' crop) and of a module:attr generator's module the command executed, in every "
                             "process (coverage.py, statements and branches); the report says per function what "
                             f"never ran (default: {'on' if default else 'off'})")


class Measurement:
    """The coverage of one command: the files measured, then the merged data."""

    def __init__(self, generator_specs):
        self.files = subject_files(generator_specs)
        self.coverage = None
        self.processes = 1

    def report(self, focus: list[str] | None = None) -> CoverageReport:
        """The report, once the measured block has finished."""
        return build_report(self.coverage, self.files, self.processes, focus)

    def write(self, report: CoverageReport, out_dir: str | Path) -> list[Path]:
        """``coverage.json``, ``.md``, ``.html`` (and coverage.py's annotated sources) in ``out_dir``."""
        return write_coverage_reports(report, self.coverage, out_dir)


@contextmanager
def measured(generator_specs, enabled: bool = True):
    """Measure the block's work (``None`` is yielded when not ``enabled``); the yielded :class:`Measurement`
    holds the data once the block ends without an exception."""
    if not enabled:
        yield None
        return
    measurement = Measurement(generator_specs)
    files = measurement.files
    with collecting(tuple(f.path for f in files), tuple(f.module for f in files)) as session:
        yield measurement
        measurement.coverage = session.finish()
        measurement.processes = session.processes


#: Where ``run`` and ``models`` write the coverage reports without ``--coverage-dir``.
DEFAULT_COVERAGE_DIR = "lossless-coverage"


def add_coverage_dir_option(parser) -> None:
    parser.add_argument("--coverage-dir", default=DEFAULT_COVERAGE_DIR, metavar="DIR",
                        help=f"with --coverage: where the coverage reports go (default {DEFAULT_COVERAGE_DIR})")


def report_coverage(measurement: Measurement | None, out_dir: str | Path, focus: list[str] | None = None):
    """Build and write a command's coverage report and print its headline and where it is (``None``: not measured)."""
    if measurement is None:
        return None
    report = measurement.report(focus)
    paths = measurement.write(report, out_dir)
    print(f"{report.headline()} (report: {paths[2]})")
    return report


__all__ = ["DEFAULT_COVERAGE_DIR", "Measurement", "add_coverage_dir_option", "add_coverage_option", "measured",
           "report_coverage"]
