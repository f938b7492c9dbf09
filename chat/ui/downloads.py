"""Files the page offers for download, kept only while a visitor may still click them.

Every export (a conversation, a comparison, the leaderboard with every visitor's prompts, a
capacity test) is written to a new folder under one folder of this process. Folders older than an
hour are removed whenever a new one is made, and the whole folder when the process exits. Gradio
copies what it serves into its own cache, which `launch(delete_cache=...)` empties likewise
(chat/server.py).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import time
from pathlib import Path

KEEP_S = 3600.0
_root: Path | None = None


def new_folder(kind: str) -> Path:
    """A new empty folder for one export of `kind` (its name's prefix)."""
    global _root
    if _root is None:
        _root = Path(tempfile.mkdtemp(prefix="vllm-chat-downloads-"))
        atexit.register(shutil.rmtree, _root, True)
    cutoff = time.time() - KEEP_S
    for old in _root.iterdir():
        try:
            if old.stat().st_mtime < cutoff:
                shutil.rmtree(old, ignore_errors=True)
        except FileNotFoundError:  # another export removed it just now
            pass
    return Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=_root))
