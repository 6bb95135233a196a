"""The fenced code blocks of a Markdown page, as tests/test_docs_code.py and
tests/test_readme.py read them.

A line parser, not a Markdown renderer: it knows what the project's pages use.
Fences open with three or more backticks or tildes (at any indentation, so blocks
inside admonitions and collapsible blocks count) and close with a line of the
same character, at least as long, carrying nothing else. A block's text is
dedented by its opening fence's indentation. Each block records the container it
sits in: a pymdownx admonition or collapsible block (``!!! note "Title"``,
``??? note "Title"``, ``???+ note "Title"``: the indented lines after it) or an
HTML ``<details>`` element (``<summary>Title</summary>``), the form a code host
that does not know ``???`` renders. An HTML comment of its own on the line
before a fence (blank lines between allowed) is the block's ``note``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_ADMONITION = re.compile(
    r'^(?P<indent>[ ]*)(?P<kind>!!!|\?\?\?\+?)[ ]+[\w-]+(?:[ ]+"(?P<title>[^"]*)")?'
)
_SUMMARY = re.compile(r"<summary>(?P<title>.*?)</summary>")
_COMMENT = re.compile(r"^[ ]*<!--(?P<note>.*)-->[ ]*$")


@dataclass(frozen=True)
class Container:
    syntax: str  # "!!!", "???", "???+" or "<details>"
    title: str
    collapsed: bool


@dataclass(frozen=True)
class Block:
    language: str  # the fence's first word; "" for a bare fence
    line: int  # 1-based line of the block's first line of code (after the opening fence)
    source: str
    container: Container | None
    note: str | None


def fenced_blocks(text: str) -> list[Block]:
    """Every fenced block of a page, in order (python or not, tagged or not)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    admonitions: list[tuple[int, Container]] = []  # (indentation, container), innermost last
    details: list[Container] = []
    note: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip():
            indent = len(line) - len(line.lstrip(" "))
            while admonitions and indent <= admonitions[-1][0]:
                admonitions.pop()
        opened = _FENCE.match(line)
        if opened is None:
            admonition = _ADMONITION.match(line)
            if admonition:
                kind = admonition["kind"]
                title = admonition["title"] if admonition["title"] is not None else ""
                admonitions.append(
                    (len(admonition["indent"]), Container(kind, title, kind == "???"))
                )
            for tag in re.finditer(r"<details(?P<attrs>[^>]*)>|</details>", line):
                if tag.group().startswith("</"):
                    if details:
                        details.pop()
                else:
                    summary = _SUMMARY.search(line[tag.end() :])
                    collapsed = not re.search(r"\bopen\b", tag["attrs"])
                    details.append(
                        Container("<details>", summary["title"] if summary else "", collapsed)
                    )
            if details and details[-1].title == "" and (summary := _SUMMARY.search(line)):
                details[-1] = Container("<details>", summary["title"], details[-1].collapsed)
            comment = _COMMENT.match(line)
            if comment:
                note = comment["note"].strip()
            elif line.strip():
                note = None
            i += 1
            continue
        indent, fence = len(opened["indent"]), opened["fence"]
        language = opened["info"].strip().split(" ")[0].strip("{}.")
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = lines[j].strip()
            if closing.startswith(fence) and set(closing) == {fence[0]}:
                break
            body.append(_dedent(lines[j], indent))
            j += 1
        else:
            raise ValueError(f"line {i + 1}: fence {fence} is never closed")
        inner = admonitions[-1][1] if admonitions else (details[-1] if details else None)
        source = "\n".join(body) + ("\n" if body else "")
        blocks.append(Block(language, i + 2, source, inner, note))
        note = None
        i = j + 1
    return blocks


def python_blocks(text: str) -> list[Block]:
    return [block for block in fenced_blocks(text) if block.language == "python"]


def _dedent(line: str, indent: int) -> str:
    stripped = len(line) - len(line.lstrip(" "))
    return line[min(stripped, indent) :]
