"""Errors a person can cause or meet, each with one plain sentence that says what to do.

    ChatError                    .message is shown to the user exactly as written
    ├── InputError               the message or conversation cannot be sent as it is
    │   └── EmptyMessage         there is no message to send
    ├── SettingsError            a sampling value is out of range or of the wrong type
    ├── PresetError              a preset file is invalid (names the file, the key, the fix)
    ├── ModelUnavailable         the model cannot be found, downloaded or converted
    ├── Stopped                  the reader pressed Stop before the engine took the request
    └── EngineError              the engine cannot take or finish this request
        ├── EngineBusy           too many requests are waiting
        │   └── VisitorBusy      this visitor has as many replies on their way as one may
        └── EngineFailed         the engine stopped working (it is restarted)

`callers_fault` says whose mistake it is: the caller's (what they sent cannot be served as it is;
an HTTP answer says 4xx) or not (the server's state or the engine's; 5xx).

Third-party errors (vLLM's, huggingface_hub's, YAML's) are translated into these at the module
that calls them; anything else is a bug: it is logged with its traceback and the user sees
UNEXPECTED_ERROR.
"""

from __future__ import annotations

from typing import ClassVar

UNEXPECTED_ERROR = "Something went wrong on the server while writing this reply; please try again."


class ChatError(Exception):
    """Base class; the message is for the person using the demo."""

    callers_fault: ClassVar[bool] = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InputError(ChatError):
    callers_fault = True


class EmptyMessage(InputError):
    pass


class SettingsError(ChatError):
    callers_fault = True


class PresetError(ChatError):
    callers_fault = True


class ModelUnavailable(ChatError):
    pass


class Stopped(ChatError):
    pass


class EngineError(ChatError):
    pass


class EngineBusy(EngineError):
    pass


class VisitorBusy(EngineBusy):
    pass


class EngineFailed(EngineError):
    pass


def first_line(exc: BaseException) -> str:
    """An exception's first line of text (its type's name when it has none), for a one-line log or status."""
    return next(iter(str(exc).strip().splitlines()), type(exc).__name__)
