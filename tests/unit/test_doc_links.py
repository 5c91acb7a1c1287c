"""Every relative Markdown link in the README, docs/ and bench/README.md names a file or folder that exists: moving
text between documents, or a file in the tree, must not leave a link pointing nowhere. Anchors are not checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted([ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").glob("*.md")])
FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)[^)]*\)")
EXTERNAL = ("http://", "https://", "mailto:")


def relative_links(text: str) -> list[str]:
    """The targets of `[text](target)` links outside code, less their anchors; external and anchor-only skipped."""
    prose = INLINE_CODE.sub("", FENCED.sub("", text))
    targets = (match.group(1) for match in LINK.finditer(prose))
    return [target.split("#", 1)[0] for target in targets if not target.startswith(("#", *EXTERNAL))]


def test_links_are_found() -> None:
    assert relative_links("[a](docs/x.md#top) [b](#top) [c](https://e.org) `[d](no.md)` [e](y.md \"title\")") == [
        "docs/x.md", "y.md"]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_resolve(document: Path) -> None:
    broken = [target for target in relative_links(document.read_text())
              if not (document.parent / target).exists()]
    assert not broken, f"{document.relative_to(ROOT)} links to missing paths: {broken}"
