"""Every message hfcache prints that sends the user to a document points at one that exists.

A hint such as ``see README 'Pinning'`` or ``shared caches: README`` costs a newcomer a search when README has no
such section. This test reads every string constant in ``hfcache/`` that is not a docstring (hints, error
messages, warnings, help texts: what reaches a terminal) with ``ast``, finds the documents each one names and
checks them:

- ``docs/NAME.md`` must be a file of the repository; a section after it (``docs/warm.md, 'Pinning'``) or an anchor
  (``docs/offline.md#layers``) must be a heading of that page;
- ``README`` must name a section (``README "Try it here"``) that is a heading of README.md: README is the front
  page, "see README" alone is no direction;
- ``see 'Section'`` without a page is refused: the user cannot tell which page has it.

A section matches a heading when it equals the heading's text (markdown code marks removed, case-insensitive) or
the part of it before the first colon (``'Pinning'`` matches ``## Pinning: `hfcache lock` and ...``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_QUOTED = r"""\s*,?\s*(?:'([^']+)'|"([^"]+)")"""
DOC_REF = re.compile(r"\b(docs/[\w.-]+\.md)(?:#([\w-]+))?(?:" + _QUOTED + ")?")
README_REF = re.compile(r"\bREADME(?:\.md)?(?:#([\w-]+))?(?:" + _QUOTED + ")?")
BARE_SEE = re.compile(r"\bsee\s+(?:'[A-Z][^']*'|\"[A-Z][^\"]*\")")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def headings(page: Path) -> list[str]:
    """The text of every markdown heading of ``page`` (outside code blocks), code marks and links removed."""
    found, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line.lstrip("#").strip())
            found.append(text.replace("`", "").strip())
    return found


def _has_section(page: Path, section: str | None, anchor: str | None) -> bool:
    titles = headings(page)
    if anchor and anchor not in {_slug(title) for title in titles}:
        return False
    if section:
        wanted = section.replace("`", "").strip().lower()
        return any(wanted in (title.lower(), title.split(":")[0].strip().lower()) for title in titles)
    return True


def problems(text: str, root: Path = REPO) -> list[str]:
    """What is wrong with the document references in one message ``text``: a list of reasons, empty when all
    resolve under ``root`` (the repository)."""
    found = []
    for match in DOC_REF.finditer(text):
        name, anchor, section = match.group(1), match.group(2), match.group(3) or match.group(4)
        page = root / name
        if not page.is_file():
            found.append(f"names {name}, which does not exist")
        elif not _has_section(page, section, anchor):
            found.append(f"names {name} section {section or '#' + anchor!r}, which is not a heading there")
    for match in README_REF.finditer(text):
        anchor, section = match.group(1), match.group(2) or match.group(3)
        if not (section or anchor):
            found.append("names README without a section: name the docs/ page (or README's heading) instead")
        elif not _has_section(root / "README.md", section, anchor):
            found.append(f"names README section {section or '#' + anchor!r}, which is not a heading of README.md")
    if BARE_SEE.search(text) and not (DOC_REF.search(text) or README_REF.search(text)):
        found.append("says see 'SECTION' without naming the page it is on")
    return found


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, nodes) and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}


def messages() -> list[tuple[str, str]]:
    """Every non-docstring string constant of hfcache/ (f-strings' literal parts included): (where, text)."""
    found = []
    for path in sorted((REPO / "hfcache").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                found.append((f"{path.relative_to(REPO)}:{node.lineno}", node.value))
    return found


def test_the_scan_sees_the_hints():
    """Not vacuous: the scan reads hints that name documents (the one of hub/answers.py names a page section)."""
    texts = [text for _, text in messages()]
    assert len(texts) > 500
    assert any("docs/cache-layout.md, 'The Hub protocol'" in text for text in texts)
    assert any("docs/warm.md, 'Pinning'" in text for text in texts)


def test_every_document_a_message_names_exists():
    found = [f"{where}: {reason}: {text[:90]!r}" for where, text in messages() for reason in problems(text)]
    assert not found, "messages that point at no document:\n" + "\n".join(found)


@pytest.mark.parametrize("planted", [
    "write one (see README 'Pinning') or pass --manifest FILE",            # README has no such heading
    "fix its permissions (shared caches: README)",                         # README without a section
    "see docs/sharing.md",                                                 # no such page
    "the endpoint must publish sizes (docs/cache-layout.md, 'The Hub API')",  # no such heading there
    "see docs/offline.md#no-such-anchor",
    "see 'Pinning' for the lock",                                          # which page?
])
def test_the_check_finds_a_planted_broken_reference(planted):
    assert problems(planted)


@pytest.mark.parametrize("fine", [
    "write one (see docs/warm.md, 'Pinning') or pass --manifest FILE",
    "the endpoint must publish sizes like the Hub (docs/cache-layout.md, 'The Hub protocol')",
    "shared caches: docs/shared-caches.md",
    "run `hfcache check` on the cache to see what the load is missing",
    "NOT met (see the warning)",
])
def test_the_check_accepts_what_resolves(fine):
    assert problems(fine) == []
