"""MkDocs hook: the CLI reference, rendered at build time from the argparse parser the command runs.

``docs/reference/cli.md`` holds the line ``<!-- cli-reference -->``; it is replaced by every
subcommand's help, usage and options, so that the page cannot drift from the parser.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

#: The parser the ``lossless-check`` command runs: the one line to change when the CLI module moves.
PARSER = "lossless_check.faces.cli:build_parser"
MARKER = "<!-- cli-reference -->"
#: Usage lines wrap here, whatever the terminal the build runs in.
WIDTH = 100

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout being documented


def build_parser() -> argparse.ArgumentParser:
    module, attr = PARSER.split(":")
    return getattr(importlib.import_module(module), attr)()


def on_page_markdown(markdown, page, config, files):
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render(build_parser()))


def render(parser: argparse.ArgumentParser) -> str:
    """Markdown for every subcommand of ``parser``: its help line, usage and options."""
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help for choice in commands._choices_actions}
    out = []
    for name, sub in commands.choices.items():
        out += [f"## `{sub.prog}`", "", _text(helps.get(name) or sub.description or ""), "",
                "```text", _usage(sub).rstrip(), "```", ""]
        for group in sub._action_groups:
            actions = [a for a in group._group_actions if a.help is not argparse.SUPPRESS]
            if not actions:
                continue
            out += [f"**{group.title}**", ""]
            formatter = argparse.HelpFormatter(prog=sub.prog, width=WIDTH)
            for action in actions:
                invocation = formatter._format_action_invocation(action)
                out.append(f"- `{invocation}`: {_text(formatter._expand_help(action) if action.help else '')}")
            out.append("")
    return "\n".join(out)


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(prog=parser.prog, width=WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help()


def _text(help_text: str) -> str:
    """Help text as Markdown text: nothing in it may read as markup."""
    for char in "\\`*_[]>":
        help_text = help_text.replace(char, "\\" + char)
    return help_text.replace("<", "&lt;")
