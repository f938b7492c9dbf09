"""How replies, stats, progress and problems look in the chat.

Each reply is two messages in one bubble: the model's text, then an annotation whose title is the
stats line (visible without clicking; the details open beneath it). Annotations carry a metadata
title, which is how `chat.history` knows never to send them back to the model.
"""

from __future__ import annotations

import html
import re
import time
from typing import Any

import gradio as gr

from chat.errors import Stopped
from chat.history import text_of
from chat.service import Finished, ReplyEvent, Waiting, Writing
from chat.stats import ReplyStats
from chat.stream import Reply
from chat.ui.downloads import new_folder

STATS = "📊"
WAITING = "⏳"
STOPPED = "⏹"
PROBLEM = "⚠️"


def annotation(title: str, body: str = "", pending: bool = False) -> gr.ChatMessage:
    return gr.ChatMessage(
        role="assistant",
        content=body,
        metadata={"title": title, "status": "pending" if pending else "done"},
    )


_IMAGE = re.compile(r"!\[([^\]]*)\]\(")


def shown_text(text: str) -> str:
    """Model text as displayed: markdown images become plain links, so a reply can never make the
    reader's browser fetch an address by itself (Gradio already sanitises HTML)."""
    return _IMAGE.sub(r"[\1](", text)


def reply_messages(reply: Reply | None, annotation_msg: gr.ChatMessage) -> list[gr.ChatMessage]:
    messages = []
    if reply is not None and reply.text:
        messages.append(gr.ChatMessage(role="assistant", content=shown_text(reply.text)))
    messages.append(annotation_msg)
    return messages


# The box the page renders a reply's live text into, as it appears in the reply's Markdown: in class
# names, because Gradio's HTML sanitiser keeps classes and drops data- attributes; a blank line after
# it, so the text is Markdown again. Before the reply has any text, words for screen readers stand
# in for it (a message without text is a nameless element to them; style.py hides the words).
# Gradio drops the blank line where nothing follows the box (an app before those words).
NO_TEXT_YET = '<span class="live-pending">Writing…</span>'
PLACEHOLDER = re.compile(r'<div class="live-reply stream-([\w-]+)"></div>(?:\n\n)?(?:' + re.escape(NO_TEXT_YET) + ")?")


# A last line, not yet ended, that may still turn into other Markdown: a fence, a heading's or list
# item's marker, a quote, a table row. live.js holds it back from the page's box with this pattern
# (chat/ui/live_script.py puts it there).
MAY_BECOME = re.compile(r"^ {0,3}(`{1,}[^`\s]*|~{1,}\S*|#{1,6}|[-*+=_]+|[0-9]{1,9}[.)]?|>|\|.*)\s*$")
_FENCES = re.compile(r"\n {0,3}(?:`{3,}|~{3,})")  # a line (after a newline) that opens or closes a code block
_MAY_CLOSE_FENCE = re.compile(r"^ {0,3}(`{1,}|~{1,})\s*$")
_TABLE_DELIMITER = re.compile(r"^ {0,3}\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
_UNFINISHED = re.compile(r"\[[^\]\n]*(\]\([^)\s]*)?$")  # a [link](address not yet closed
_HALF_MARKER = re.compile(r"[*_`~]+$")
_CODE_SPAN = re.compile(r"(`+)[^`]*?\1")


def settled_copy(text: str) -> str:
    """`text` as the page's box draws it while it is written (live.js `settled`, the same steps; a
    browser test compares the two on every prefix of a reply): less a last line that may still
    become other Markdown, a table not yet followed by its delimiter row, an unfinished link and a
    half-typed marker, with an open ` or ** closed for now. Gradio draws its copy of a reply as it
    stands, and that copy shows while the page's box is empty (between the redraw that makes the box
    and the box's first text, and in a Compare column until the socket's replay has caught up): there
    a fence whose line has not ended was a paragraph with the fence in it as text, and an open ** was
    two stars."""
    lines = text.split("\n")
    last = len(lines) - 1
    head = "\n" + text.rpartition("\n")[0]  # every line but the last, each after a newline
    # Once per redraw of every reply being written: most replies have no fence to look for.
    if ("```" in head or "~~~" in head) and len(_FENCES.findall(head)) % 2:  # in a code block: only a line that may close it is held back
        if _MAY_CLOSE_FENCE.match(lines[last]):
            lines[last] = ""
        return "\n".join(lines)
    if MAY_BECOME.match(lines[last]):
        lines[last] = ""
    end = last if lines[last] == "" else last + 1
    start = end
    while start > 0 and lines[start - 1].lstrip().startswith("|"):
        start -= 1
    if start < end and (end - start < 2 or not _TABLE_DELIMITER.match(lines[start + 1])):
        del lines[start:end]
    tail = lines.pop() if lines else ""
    tail = _HALF_MARKER.sub("", _UNFINISHED.sub("", tail))
    if opened := _open_code(tail):
        tail += opened
    elif _CODE_SPAN.sub("", tail).count("**") % 2:
        tail = tail.rstrip() + "**"
    lines.append(tail)
    return "\n".join(lines)


def _open_code(line: str) -> str:
    """The backticks that would close a code span left open in `line` ("" when none is open)."""
    opened = ""
    for run in re.findall(r"`+", line):
        if not opened:
            opened = run
        elif run == opened:
            opened = ""
    return opened


def live_body(live_id: str, shown: str) -> str:
    """A reply's message while it is written: the box the page renders the live text of the log
    `live_id` into, then `shown` (the reply so far, as displayed), which the page hides while the box
    has text (less a last line that may still change form: `settled_copy`)."""
    return f'<div class="live-reply stream-{html.escape(live_id)}"></div>\n\n{settled_copy(shown) or NO_TEXT_YET}'


def live_line(live_id: str, line: str) -> str:
    """The line beneath a reply while it is written, in a box the page keeps current with the text."""
    return f'<span class="live-line stream-{html.escape(live_id)}">{html.escape(line)}</span>'


def event_messages(event: ReplyEvent, live_id: str | None = None) -> list[gr.ChatMessage]:
    """A reply as it stands after one event of the pipeline: its text, and the line beneath it.
    With `live_id` (a LiveText's log), the page's script renders the text as it arrives (chat/ui/live_script.py)."""
    if isinstance(event, Waiting):
        return [annotation(f"{WAITING} {event.status}", pending=True)]
    if isinstance(event, Writing) and live_id is not None:
        return live_messages(live_id, event.reply.text, event.line)
    if isinstance(event, Writing):
        return reply_messages(event.reply, annotation(f"{WAITING} {event.line}", pending=True))
    if isinstance(event, Finished):
        assert event.reply.stats is not None
        return reply_messages(event.reply, stats_annotation(event.reply.stats, event.reply.notice))
    mark = STOPPED if isinstance(event.error, Stopped) else PROBLEM
    return reply_messages(event.reply, annotation(f"{mark} {event.error.message}"))


def live_messages(live_id: str, text: str, line: str) -> list[gr.ChatMessage]:
    """A reply being written, for a page: the box its text is rendered into (with the text so far
    after it, for a page whose script failed), and the line beneath it."""
    return [gr.ChatMessage(role="assistant", content=live_body(live_id, shown_text(text))),
            annotation(f"{WAITING} {live_line(live_id, line)}", pending=True)]


def stats_annotation(stats: ReplyStats, notice: str | None = None) -> gr.ChatMessage:
    title = f"{STATS} {stats.summary()}"
    if notice:
        title = f"{PROBLEM} {notice} · {stats.summary()}"
    return annotation(title, stats.details())


def conversation_markdown(history: list[dict[str, Any]]) -> str:
    """The chat as Markdown: each turn, and each reply's stats with its preset and settings."""
    lines = ["# Conversation", ""]
    for message in history or []:
        metadata = message.get("metadata") or {}
        text = text_of(message.get("content"))
        if metadata.get("title"):
            lines += [f"*{metadata['title']}*", ""]
            if text.strip():
                lines += [text, ""]
        elif message.get("role") == "user":
            lines += ["**You:**", "", text, ""]
        else:
            lines += ["**Assistant:**", "", text, ""]
    return "\n".join(lines)


def conversation_file(history: list[dict[str, Any]]) -> str:
    """Write the conversation to a new temporary file (never a path the browser chose)."""
    folder = new_folder("conversation")
    path = folder / f"conversation-{time.strftime('%Y%m%d-%H%M%S')}.md"
    path.write_text(conversation_markdown(history), encoding="utf-8")
    return str(path)
