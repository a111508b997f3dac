"""Benchmark reports: a section between two marker lines of a markdown file, owned by one benchmark."""
from __future__ import annotations

from pathlib import Path


def replace_marked(path, start: str, end: str, text: str) -> None:
    """Write ``text`` (which begins with ``start`` and ends with ``end``) into ``path``, replacing
    the section between the markers if there is one, else appending it."""
    path = Path(path)
    old = path.read_text() if path.exists() else ""
    if start in old:
        new = old[: old.index(start)] + text + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(new)
