"""MkDocs hook: the repository's own write-ups as pages, read at build time so that they cannot drift.

The findings' write-ups (``findings/README.md`` and ``findings/<finding>/README.md``, beside each
finding's ``repro.py`` and ``fix.patch``) and the benchmarks' notes live next to what they describe. This
hook adds them to the site under the same paths, so that their relative links keep working, and
appends a nav entry for every finding folder present: a new finding appears without a docs edit.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
MOUNTED = ("findings/README.md", "findings/*/README.md", "benchmarks/README.md", "benchmarks/compat_table.md")
#: The nav section the findings' pages are appended to (mkdocs.yml names it).
FINDINGS_SECTION = "Findings"


def mounted() -> list[str]:
    """The repository paths mounted as pages, in nav order."""
    return [path.relative_to(ROOT).as_posix() for pattern in MOUNTED for path in sorted(ROOT.glob(pattern))]


def on_config(config):
    section = next(item[FINDINGS_SECTION] for item in config.nav
                   if isinstance(item, dict) and FINDINGS_SECTION in item)
    for path in mounted():
        if path == "findings/README.md":
            section.append({"Standalone reproductions": path})
        elif path.startswith("findings/") and path not in section:
            section.append(path)  # titled by the write-up's own heading
    return config


def on_files(files, config):
    for path in mounted():
        files.append(File.generated(config, path, abs_src_path=str(ROOT / path)))
    return files
