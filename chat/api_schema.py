"""The WebSocket API's wire format: requests as pydantic models, and errors as codes plus sentences.

chat/api.py serves it; the docstring there shows a conversation. Every refusal carries a `code`
for programs and a `message` for people. `GRACE_S` is the contract's one time: how long a client
whose connection dropped has to resume its replies (`--resume-grace-s` changes it).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from chat.errors import (
    ChatError,
    EmptyMessage,
    EngineBusy,
    EngineError,
    InputError,
    PresetError,
    SettingsError,
    VisitorBusy,
)

GRACE_S = 30.0  # a dropped connection's replies keep running this long, waiting to be resumed


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChatMessage(_Strict):
    role: Literal["user", "assistant", "system"]
    content: str


class ChatRequest(_Strict):
    type: Literal["chat"]
    id: Annotated[str, Field(min_length=1, max_length=128)] | None = None
    preset: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    sampling: dict[str, Any] = {}  # checked against the preset's ranges by SamplingRules.resolve


class CancelRequest(_Strict):
    type: Literal["cancel"]
    id: Annotated[str, Field(min_length=1, max_length=128)]


class ResumeRequest(_Strict):
    type: Literal["resume"]
    id: Annotated[str, Field(min_length=1, max_length=128)]
    after: Annotated[int, Field(ge=-1)] = -1  # index of the last delta received


class WatchRequest(_Strict):
    """Follow a reply without owning it: closing this socket leaves it running (the page's live text)."""

    type: Literal["watch"]
    id: Annotated[str, Field(min_length=1, max_length=128)]
    after: Annotated[int, Field(ge=-1)] = -1  # index of the last delta already shown


PAGE_ID = re.compile(r"live-[0-9a-f]{32}")  # the ids a page picks for the replies it starts (chat/ui/live.js)


class BeginRequest(_Strict):
    """The page's Chat tab: start the reply to a typed message now, under the id the page picked, for
    the Gradio turn sent with it to follow (chat/live.py); where that turn came first and started it,
    follow it. The fields are the turn's own inputs."""

    type: Literal["begin"]
    id: Annotated[str, Field(pattern=f"^{PAGE_ID.pattern}$")]
    message: str
    history: list[dict[str, Any]] = []  # the chat as the page holds it (Gradio's messages)
    preset: str | None = None
    system_prompt: str | None = None
    sampling: dict[str, Any] = {}


Request = Annotated[ChatRequest | CancelRequest | ResumeRequest | WatchRequest | BeginRequest, Field(discriminator="type")]
REQUEST = TypeAdapter(Request)


class ApiError(ChatError):
    """A request the API refuses before any engine work; `code` is for programs."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def error_code(exc: ChatError) -> str:
    if isinstance(exc, ApiError):
        return exc.code
    if isinstance(exc, PresetError):
        return "unknown_preset"
    if isinstance(exc, SettingsError):
        return "invalid_settings"
    if isinstance(exc, EmptyMessage):
        return "empty_message"
    if isinstance(exc, InputError):
        return "input_too_long"  # empty messages are told apart where they are checked
    if isinstance(exc, VisitorBusy):
        return "too_many_replies"
    if isinstance(exc, EngineBusy):
        return "busy"
    if isinstance(exc, EngineError):
        return "engine_failed"
    return "error"


def plain_validation_error(exc: ValidationError) -> str:
    """Pydantic's first complaint about the request's shape, as one sentence."""
    error = exc.errors()[0]
    loc = [str(part) for part in error["loc"]]
    if loc and loc[0] in ("chat", "cancel", "resume", "watch"):
        loc = loc[1:]  # the union's tag, not part of the JSON
    where = ".".join(loc)
    kind = error["type"]
    if kind == "union_tag_invalid":
        return f"Unknown request type {error['input'].get('type')!r}; the types are chat, cancel, resume and watch."
    if kind in ("union_tag_not_found", "model_attributes_type", "model_type") and not loc:
        return 'Send a JSON object with a "type" of chat, cancel, resume or watch.'
    if kind == "missing":
        return f'The request is missing "{where}".'
    if kind == "extra_forbidden":
        return f'"{where}" is not part of this request; remove it.'
    return f'"{where}": {error["msg"]}.'
