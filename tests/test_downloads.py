"""Exports are kept an hour, then removed (chat/ui/downloads.py)."""

from __future__ import annotations

import os
import time

import pytest

from chat.ui import downloads

pytestmark = pytest.mark.unit


def test_exports_older_than_an_hour_are_removed_when_a_new_one_is_made():
    old = downloads.new_folder("capacity")
    (old / "capacity.csv").write_text("users\n1\n")
    recent = downloads.new_folder("compare")
    hour_ago = time.time() - downloads.KEEP_S - 1
    os.utime(old, (hour_ago, hour_ago))
    fresh = downloads.new_folder("conversation")
    assert not old.exists() and recent.exists() and fresh.exists()
    assert fresh.parent == old.parent and fresh.name.startswith("conversation-")
