"""How bench/message_path.py counts a traced message's modules and places (the path table in docs/architecture.md)."""

from __future__ import annotations

from bench.message_path import report


def test_places_are_functions_of_other_modules_and_background_work_is_left_out():
    calls = [
        ("ui/chat_tab", "typed_turn.<locals>.turn", "live", "live_reply", "ui/chat_tab.typed_turn.<locals>.turn"),
        ("live", "live_reply", "service", "ChatService.reply", "ui/chat_tab.typed_turn.<locals>.turn"),
        ("live", "live_reply", "service", "ChatService.stop", "ui/chat_tab.typed_turn.<locals>.turn"),  # same place
        ("live", "live_reply.<locals>.<listcomp>", "service", "ChatService.reply", "ui/chat_tab.turn"),  # same
        ("live", "EarlyReply._run", "service", "ChatService.reply", "api.Connection.begin"),  # another
        ("api", "Connection.watch", "live", "ReplyLog.follow", "api.routes.<locals>.chat_socket"),  # another module
        ("live", "live_reply", "ui/messages", "event_messages", "ui/chat_tab.typed_turn.<locals>.turn"),  # a helper
        ("monitor", "Monitor.run", "registry", "EngineRegistry.overview", "monitor.Monitor.run"),  # background
    ]
    counted = report("a message", calls)
    assert counted["path"] == ["api", "live", "service", "ui/chat_tab"]
    assert counted["entered_again"] == {"live": 2, "service": 2}
    assert counted["entered_from_modules"] == {"live": ["api", "ui/chat_tab"]}
    assert counted["helpers"] == ["ui/messages"]
