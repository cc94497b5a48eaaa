"""The fenced blocks of the user-facing pages, and the shell commands inside them.

The doc-check reads README.md, docs/*.md and benchmarks/README.md as a user would: every
fenced block is a command to run, an example to send, a file to read or output to compare.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PAGES = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").glob("*.md")])
_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced block of `page`, indented ones (inside a list item) included."""
    out: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, lang, start = match.group(1), match.group(2), i
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
            i += 1
        out.append(Block(page, start + 1, lang, "\n".join(body)))
        i += 1
    return out


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


def shell_commands(text: str) -> list[str]:
    """The commands of a shell block: lines joined until their quotes balance (a continuation
    or a multi-line JSON body), comment and blank lines dropped."""
    commands: list[str] = []
    buffer = ""
    continued = False  # the last line ended with a backslash: the next one joins with a space
    for line in text.splitlines():
        if not buffer and (not line.strip() or line.strip().startswith("#")):
            continue
        buffer = (f"{buffer} {line.strip()}" if continued else f"{buffer}\n{line}") if buffer else line
        continued = buffer.endswith("\\")
        if continued:
            buffer = buffer[:-1].rstrip()
            continue
        try:
            shlex.split(buffer, comments=True)
        except ValueError:  # an open quote: the command goes on
            continue
        commands.append(buffer.strip())
        buffer = ""
    if buffer:
        commands.append(buffer.strip())
    return commands


def pipeline(command: str) -> list[list[str]]:
    """`command` as the word lists of its parts (split at |, &&, ; and a trailing &)."""
    parts: list[list[str]] = [[]]
    for word in shlex.split(command, comments=True):
        if word in {"|", "&&", ";", "&", "||"}:
            parts.append([])
        else:
            parts[-1].append(word)
    return [strip_assignments(part) for part in parts if part]


def strip_assignments(words: list[str]) -> list[str]:
    """`words` without leading VAR=value assignments."""
    words = list(words)
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
        words.pop(0)
    return words


def flags(words: list[str]) -> list[str]:
    """The long options a command passes (`--name` of `--name=value` too)."""
    return [word.split("=", 1)[0] for word in words if word.startswith("--") and len(word) > 2]
