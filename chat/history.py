"""Turn the chat as Gradio holds it into the messages the model reads.

Gradio 6 gives each message as a dict whose `content` is a string or a list of parts
(`{"type": "text", "text": ...}`, files, components). Messages with a `metadata` title are the
app's own annotations (stats, progress, errors) and are never sent to the model.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from chat.errors import EmptyMessage, InputError

Message = dict[str, str]
MAX_MESSAGE_CHARS = 100_000  # far beyond any context window here; stops megabyte pastes early


def is_annotation(message: Mapping[str, Any]) -> bool:
    """True for the stats, progress and error lines the app adds beneath replies."""
    metadata = message.get("metadata")
    return isinstance(metadata, Mapping) and bool(metadata.get("title"))


def clean_text(text: str) -> str:
    """Text the tokenizer can take: lone surrogates (not valid Unicode) become U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def text_of(content: Any) -> str:
    """The text of a message's content, whichever shape Gradio gave it."""
    if content is None:
        return ""
    if isinstance(content, str):
        return clean_text(content)
    if isinstance(content, Mapping):
        if content.get("type") == "text":
            return str(content.get("text", ""))
        return ""  # files and components carry no text for the model
    if isinstance(content, Iterable):
        return "".join(text_of(part) for part in content)
    return ""


def to_model_messages(
    history: Iterable[Mapping[str, Any]], message: str, system_prompt: str = ""
) -> list[Message]:
    """The conversation for the chat template: system, then alternating user/assistant turns.

    A user message whose reply has no text (it was refused, failed, or stopped before the first
    word) is left out: the model never answered it. Consecutive messages of one role are joined
    (Gradio sends a reply and its annotations, or a file and its caption, as separate messages;
    many chat templates require strict alternation).
    """
    items = list(history)
    kept: list[tuple[str, str]] = []
    for index, item in enumerate(items):
        role = item.get("role")
        if role not in ("user", "assistant") or is_annotation(item):
            continue
        if role == "user" and _unanswered(items, index):
            continue
        kept.append((role, text_of(item.get("content"))))
    kept.append(("user", clean_text(message)))

    messages: list[Message] = []
    if system_prompt.strip():
        messages.append({"role": "system", "content": clean_text(system_prompt.strip())})
    for role, text in kept:
        if not text.strip():
            continue
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"] += "\n\n" + text
        else:
            messages.append({"role": role, "content": text})
    return messages


def _unanswered(items: list[Mapping[str, Any]], index: int) -> bool:
    """True when the user message at `index` is followed by a reply made only of annotations."""
    reply = []
    for item in items[index + 1 :]:
        if item.get("role") != "assistant":
            break
        reply.append(item)
    return bool(reply) and all(is_annotation(item) or not text_of(item.get("content")).strip() for item in reply)


def check_text(text: object, what: str, *, new_message: bool = False) -> str:
    """The text as it will be sent, or InputError saying what to change."""
    if not isinstance(text, str):
        raise InputError(f"{what} must be text.")
    if new_message and not text.strip():
        raise EmptyMessage("Type a message first.")
    if len(text) > MAX_MESSAGE_CHARS:
        again = "send it again" if new_message else "send your message again"
        raise InputError(f"{what} is {len(text):,} characters; the limit is {MAX_MESSAGE_CHARS:,}. Shorten it and {again}.")
    return text
