"""Every relative link in README.md, docs/*.md and deploy/*.md resolves to a file inside the repository (and an
anchor to a heading or `<a id>` of its target), so the docs stand alone in a clone with no sibling folders."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools.gendocs.markdown import slug

REPO_ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.M)
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def doc_files(root: Path = REPO_ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "deploy").glob("*.md"))]


def links(text: str) -> list[str]:
    """Link targets outside code: a link inside a fence or inline code is an example, not a link."""
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    return LINK.findall(prose)


def anchors(text: str) -> set[str]:
    """GitHub's heading anchors (repeats get -1, -2, ...) and explicit `<a id>`s."""
    seen: dict[str, int] = {}
    out = set(HTML_ANCHOR.findall(text))
    for heading in HEADING.findall(FENCE.sub("", text)):
        base = slug(re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(doc: Path, root: Path = REPO_ROOT) -> list[str]:
    out = []
    text = doc.read_text()
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if not dest.is_relative_to(root.resolve()):
            out.append(f"{target}: outside the repository")
        elif not dest.exists():
            out.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            out.append(f"{target}: no heading #{anchor} in {dest.relative_to(root.resolve())}")
    return out


@pytest.mark.parametrize("doc", doc_files(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_relative_links_resolve_inside_the_repo(doc: Path) -> None:
    assert broken_links(doc) == []


def test_docs_say_nothing_of_folders_beside_the_repo() -> None:
    sibling = "/".join(("..", "shared"))  # spelt in two parts: a scan of tracked files for the literal must not see it
    for doc in doc_files():
        assert sibling not in doc.read_text(), f"{doc.relative_to(REPO_ROOT)} points outside the repository"


def test_checker_finds_what_is_broken(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# Title\n## A `code` heading\n## Title\n<a id=\"x-y\"></a>\n")
    doc = tmp_path / "README.md"
    doc.write_text(
        "[ok](docs/b.md) [ok](docs/b.md#a-code-heading) [ok](docs/b.md#title-1) [ok](docs/b.md#x-y) [ok](#top)\n"
        "# Top\n[web](https://example.com) `[not a link](missing.md)`\n```\n[nor](gone.md)\n```\n"
        "[bad](docs/c.md) [bad](docs/b.md#nope) [bad](../outside.md) ![img](docs/none.png)\n")
    assert broken_links(doc, tmp_path) == [
        "docs/c.md: no such file", "docs/b.md#nope: no heading #nope in docs/b.md",
        "../outside.md: outside the repository", "docs/none.png: no such file"]


def test_the_docs_index_lists_every_page() -> None:
    index = REPO_ROOT / "docs" / "README.md"
    linked = {(index.parent / target.partition("#")[0]).resolve() for target in links(index.read_text())}
    pages = {p.resolve() for p in (REPO_ROOT / "docs").glob("*.md") if p != index}
    assert sorted(p.name for p in pages - linked) == []
