"""Sphinx helpers for the two API pages (book/api.md, the library; book/api_lab.md, the lab).

* The docstrings of ``hsm`` write their parameters as ``name: what it is`` under a numpy-style
  ``Parameters`` heading; napoleon reads ``name : type``, so this rewrites each such line as
  ``name`` followed by its description before napoleon runs.
* Summaries in autosummary tables do not end at the full stop of "eq." or "Alg.".
* Every object is documented once, in the module that defines it; a reference to the name a
  package re-exports it under (``hsm.Tree``, ``hsm_lab.data.load_ptb``,
  ``hsm.HierarchicalSoftmax.predict``) resolves to that entry.
"""
from __future__ import annotations

import importlib
import os
import re
from typing import Any

_FIELD = re.compile(r"^(?P<indent>\s*)(?P<names>[A-Za-z_*][\w*]*(?:, [A-Za-z_*][\w*]*)*):(?:\s+(?P<rest>.*))?$")
_SECTIONS = ("Parameters", "Other Parameters", "Keyword Arguments")


def numpy_parameters(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """``name: description`` -> ``name`` + the description indented, inside parameter sections.

    An attribute's docstring is prose here, never ``type: description`` as napoleon reads its
    first line: an empty comment first keeps napoleon from taking the words before a colon for a
    type."""
    if what in ("attribute", "data", "property") and lines and lines[0].strip():
        lines[:0] = ["..", ""]
        return
    out: list[str] = []
    in_section = False
    for i, line in enumerate(lines):
        stripped = line.strip()
        underline = i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"}
        if underline:
            in_section = stripped in _SECTIONS
        elif in_section and not stripped and out and set(out[-1].strip()) != {"-"}:
            # the fields end at the first blank line: two blank lines end napoleon's section,
            # so the paragraphs after it stay prose
            in_section = False
            out.append("")
        elif in_section and stripped and not line[:1].isspace():
            match = _FIELD.match(line)
            if match and " : " not in line:
                out.append(match["names"])
                if match["rest"]:
                    out.append("    " + match["rest"])
                continue
        out.append(line)
    lines[:] = out


def _canonical(target: str) -> str | None:
    """The name under which the object ``target`` names is documented, or None."""
    parts = target.split(".")
    if parts[0] not in ("hsm", "hsm_lab"):
        return None
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        break
    else:
        return None
    owner = None
    for i, attr in enumerate(parts[cut:], start=cut):
        owner, obj = obj, getattr(obj, attr, None)
        if obj is None:
            if i == len(parts) - 1 and isinstance(owner, type):  # an instance attribute
                return f"{owner.__module__}.{owner.__qualname__}.{attr}"
            return None
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(obj, type(importlib)):
        return obj.__name__
    if module and qualname and module.startswith("hsm"):
        return f"{module}.{qualname}"
    if isinstance(owner, type):  # an attribute or property
        return f"{owner.__module__}.{owner.__qualname__}.{parts[-1]}"
    if isinstance(owner, type(importlib)):  # module-level data
        return f"{owner.__name__}.{parts[-1]}"
    return None


_IDENTIFIER = re.compile(r"^~?[A-Za-z_][\w.]*$")


def resolve_reexport(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """Resolve ``hsm.Tree`` (and names relative to the current module or class) to the entry of
    the module that defines the object. A name of ``hsm`` that exists but is not documented (not
    in its module's ``__all__``), and napoleon's reading of prose as a type, stay unlinked text."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    if not _IDENTIFIER.match(target):
        return contnode if node["reftype"] in ("class", "obj") else None  # prose read as a type
    module, cls = node.get("py:module"), node.get("py:class")
    candidates = [target]
    if module:
        if cls:
            candidates.append(f"{module}.{cls}.{target}")
        candidates.append(f"{module}.{target}")
    domain = env.get_domain("py")
    found_in_code = False
    for candidate in candidates:
        canonical = _canonical(candidate)
        if canonical is None:
            continue
        found_in_code = True
        resolved = domain.resolve_xref(env, node.get("refdoc"), app.builder, node["reftype"], canonical, node,
                                       contnode)
        if resolved is not None:
            return resolved
    if not found_in_code:
        # no module context (e.g. a summary table): a unique documented object of that name
        matches = domain.find_obj(env, None, None, target, node["reftype"] if node["reftype"] != "obj" else None, 1)
        if len(matches) > 1 and module:  # the one nearest the referring module
            def shared(name: str) -> int:
                return len(os.path.commonprefix([name.split("."), module.split(".")]))
            best = max(shared(name) for name, _ in matches)
            matches = [match for match in matches if shared(match[0]) == best]
        if len(matches) == 1:
            return domain.resolve_xref(env, node.get("refdoc"), app.builder, node["reftype"], matches[0][0], node,
                                       contnode)
    return contnode if found_in_code else None


#: abbreviations the docstrings use before a number ("eq. 5", "Alg. 2"): autosummary must not end a
#: summary's first sentence at their full stop ("... labels (eq.")
_ABBREVIATIONS = ("eq.", "Eq.", "eqs.", "Eqs.", "Alg.", "Algs.", "cf.", "vs.", "approx.", "resp.", "No.", "Fig.",
                  "Sec.", "§.")


def setup(app: Any) -> dict[str, Any]:
    from sphinx.ext import autosummary

    # a module-level tuple that extract_summary reads on every call
    autosummary.WELL_KNOWN_ABBREVIATIONS = tuple(dict.fromkeys(autosummary.WELL_KNOWN_ABBREVIATIONS + _ABBREVIATIONS))
    app.connect("autodoc-process-docstring", numpy_parameters, priority=400)  # before napoleon (500)
    app.connect("missing-reference", resolve_reexport)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
