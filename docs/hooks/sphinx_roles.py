"""MkDocs hook: the docstrings' Sphinx roles (``:func:`~lossless_check.faces.api.check```) as plain code.

The package's docstrings cross-reference in Sphinx's notation, which mkdocstrings renders literally
(``:class:`` before the code); on the API page they become the code alone, the last dotted name where
the role's target starts with ``~``, as Sphinx shows it.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc|obj):<code>(~?)([\w.]+)</code>")


def on_page_content(html, page, config, files):
    return _ROLE.sub(lambda m: f"<code>{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}</code>", html)
