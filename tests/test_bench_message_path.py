"""How bench/message_path.py counts a traced message's modules and places (the README's path table)."""

from __future__ import annotations

from bench.message_path import report


def test_places_are_functions_of_other_modules_and_background_work_is_left_out():
    calls = [
        ("ui/chat_tab", "typed_turn.<locals>.turn", "ui/live", "live_reply", "ui/chat_tab.typed_turn.<locals>.turn"),
        ("ui/live", "live_reply", "reply_log", "LiveText.write", "ui/chat_tab.typed_turn.<locals>.turn"),
        ("ui/live", "live_reply", "reply_log", "LiveText.end", "ui/chat_tab.typed_turn.<locals>.turn"),  # same place
        ("ui/live", "live_reply.<locals>.<listcomp>", "reply_log", "LiveText.redraw_due", "ui/chat_tab.turn"),  # same
        ("api", "Connection.watch", "reply_log", "ReplyLog.follow", "api.routes.<locals>.chat_socket"),  # another
        ("ui/live", "live_reply", "ui/messages", "event_messages", "ui/chat_tab.typed_turn.<locals>.turn"),  # a helper
        ("monitor", "Monitor.run", "registry", "EngineRegistry.overview", "monitor.Monitor.run"),  # background
    ]
    counted = report("a message", calls)
    assert counted["path"] == ["api", "reply_log", "ui/chat_tab", "ui/live"]
    assert counted["entered_again"] == {"reply_log": 2}
    assert counted["helpers"] == ["ui/messages"]
