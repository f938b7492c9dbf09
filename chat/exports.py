"""Files people download (a comparison, the leaderboard, the votes): written as text, and cells a
spreadsheet will not run."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path


def spreadsheet_safe(value: object) -> object:
    """Text a spreadsheet will not run as a formula (a prompt or a reply can be written to be one):
    a leading =, +, @, tab, carriage return or a minus before anything but a space gets a quote.
    Numbers pass as they are."""
    if not isinstance(value, str):
        return value
    if value[:1] in ("=", "+", "@", "\t", "\r") or (value[:1] == "-" and value[1:2] not in (" ", "")):
        return "'" + value
    return value


def write_texts(directory: Path, stem: str, texts: Mapping[str, str]) -> dict[str, Path]:
    """Write each text as `stem.EXT` into `directory` (made if missing; a server temp dir); the
    paths by extension."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for ext, text in texts.items():
        path = directory / f"{stem}.{ext}"
        path.write_text(text, encoding="utf-8", newline="")
        paths[ext] = path
    return paths
