"""Plain text for ``--help`` from reStructuredText docstrings.

The command line modules use their docstrings as argparse descriptions, so that the help and the
API pages say the same thing; the docstrings are written for Sphinx, whose markup (``literals``,
roles such as ``:func:``, directives) would otherwise show in a terminal as typed.
"""
from __future__ import annotations

import re

# :func:`x`, :class:`~a.b.C`, :mod:`text <target>`: the role's text, as Sphinx would render it
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`([^`]+)`")
# ``literal`` and `default role`
_LITERAL = re.compile(r"``(.+?)``|`([^`\n]+)`", re.S)
# a directive line (.. code-block:: python, .. note::) with its options (:linenos:)
_DIRECTIVE = re.compile(r"^([ \t]*)\.\. [\w-]+::.*\n(?:\1[ \t]+:[\w-]+:.*\n)*", re.M)


def _role_text(match: re.Match) -> str:
    text = match.group(1)
    shown = re.fullmatch(r"(.*?)\s*<[^>]+>", text, flags=re.S)
    if shown:  # :func:`the writer <hsm.tree_io.save_tree>` shows "the writer"
        return shown.group(1)
    if text.startswith("~"):  # :class:`~hsm.tree.Tree` shows "Tree"
        return text[1:].rsplit(".", 1)[-1]
    return text


def plain(text: str | None) -> str:
    """``text`` with the reStructuredText markup a terminal cannot render removed: roles become
    their text, literals lose their backquotes, directive lines go, and a paragraph's closing
    ``::`` (the literal block marker) becomes ``:``."""
    if not text:
        return ""
    text = _DIRECTIVE.sub("", text.strip("\n") + "\n")
    text = _ROLE.sub(_role_text, text)
    text = _LITERAL.sub(lambda match: match.group(1) if match.group(1) is not None else match.group(2), text)
    text = re.sub(r"(?<=\S)::$", ":", text, flags=re.M)
    text = re.sub(r"^[ \t]*::\n", "", text, flags=re.M)
    return text.rstrip("\n")
