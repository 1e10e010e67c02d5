"""``lossless-check export-tests``: pytest modules that transformers can adopt, for the installed release.

The modules are the templates in ``export_templates/`` (real, lint-clean Python; never imported by this package):
a shared helper, ``_speculative_laws.py`` (tiny seeded models, the exact laws read from the installed
processors, the law tests and their error rates), and one test module per generator family. The exporter copies
the helper and the modules of the families the installed ``transformers`` has, writes the number of law tests
it exported into the helper (each gets ``FILE_ALPHA / LAW_TESTS``: Bonferroni over the exported files) and puts
a line above each module saying what it was exported for. The modules import only torch, transformers, pytest,
numpy and scipy; they call the installed ``generate()`` and ``_speculative_sampling``, never a copy.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lossless_check.core.errors import UsageError

TEMPLATES = Path(__file__).with_name("export_templates")
HELPER = "_speculative_laws.py"


@dataclass(frozen=True)
class ExportedModule:
    """A template test module, the generator classes it tests (any one present exports it) and its law tests."""

    template: str
    #: generator class name -> law tests (do_sample=True comparisons) the module runs for that class.
    law_tests: dict[str, int]


MODULES = (
    ExportedModule("test_speculative_verifier.py", {}),
    ExportedModule("test_speculative_assisted.py", {"AssistedCandidateGenerator": 3}),
    ExportedModule("test_speculative_prompt_lookup.py",
                   {"PromptLookupCandidateGenerator": 1, "EarlyExitCandidateGenerator": 1}),
    ExportedModule("test_speculative_two_tokenizers.py",
                   {"UniversalSpeculativeDecodingGenerator": 1, "AssistedCandidateGeneratorDifferentTokenizers": 0}),
    ExportedModule("test_speculative_single_position.py", {"SinglePositionMultiTokenCandidateGenerator": 1}),
    ExportedModule("test_speculative_dflash.py", {"DFlashTokenCandidateGenerator": 1}),
)


@dataclass(frozen=True)
class Export:
    """What :func:`export_tests` wrote: the files, the generator classes tested and the law tests' count."""

    files: list[Path]
    generators: list[str]
    law_tests: int


def installed_generators() -> set[str]:
    """The candidate generator classes (and the verifier) of the installed transformers."""
    from transformers.generation import candidate_generator, utils

    names = {name for module in MODULES for name in module.law_tests if hasattr(candidate_generator, name)}
    return names | ({"_speculative_sampling"} if hasattr(utils, "_speculative_sampling") else set())


def export_tests(out_dir: str | Path) -> Export:
    """Write the helper and the test modules of the installed release's families into ``out_dir``."""
    import transformers

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a directory")
    present = installed_generators()
    if "_speculative_sampling" not in present:
        raise UsageError(f"transformers {transformers.__version__} has no _speculative_sampling (added in 4.37.0): "
                         "nothing to export")
    chosen = [m for m in MODULES if not m.law_tests or set(m.law_tests) & present]
    law_tests = sum(n for m in chosen for name, n in m.law_tests.items() if name in present)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create --out {out}: {exc.strerror}") from exc
    helper = (TEMPLATES / HELPER).read_text()
    target_tv = re.search(r"^TARGET_TV = (\S+)$", helper, flags=re.MULTILINE).group(1)
    stamp = (f"# Exported by `lossless-check export-tests` for transformers {transformers.__version__}. All {law_tests}"
             " law tests of these files\n# together fail a lossless release with probability <= 1e-6 (Bonferroni; "
             "where the verifier accepts at\n# r <= p/q, 4.37-5.24, plus 2^-24 per draft of probability 0); each "
             f"detects TV >= {target_tv} with probability\n# >= 1 - 1e-3 (_speculative_laws.py). Exact tests "
             "(greedy, verifier, max_length) never fail a lossless release.\n")
    helper, replaced = re.subn(r"^LAW_TESTS = \d+$", f"LAW_TESTS = {max(law_tests, 1)}", helper, flags=re.MULTILINE)
    if replaced != 1:
        raise RuntimeError(f"{HELPER} must assign LAW_TESTS once (the exporter writes the count there)")
    files = [out / HELPER]
    files[0].write_text(stamp + helper)
    for module in MODULES:
        path = out / module.template
        if module in chosen:
            path.write_text(stamp + (TEMPLATES / module.template).read_text())
            files.append(path)
        else:  # a module an earlier export (of another release) left here would not be counted in LAW_TESTS
            path.unlink(missing_ok=True)
    tested = sorted(name for m in chosen for name in m.law_tests if name in present)
    return Export(files=files, generators=tested, law_tests=law_tests)
