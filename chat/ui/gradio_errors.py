"""What a caller gets wrong in Gradio's own machinery, answered with one sentence instead of the
traceback Gradio would log (items 4-5 of chat/ui/gradio_internals.py, which installs them): an
event's inputs that do not fit it, an unknown event, a request body that does not fit Gradio's
models, an event stream for a session or event the queue does not hold, and what a caller's inputs
break inside Gradio's own event functions. Tested with the Gradio versions gradio_internals checks."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import gradio
import orjson
from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from gradio import route_utils
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from chat.errors import ChatError

log = logging.getLogger(__name__)


BAD_INPUTS = ("This request's inputs do not fit the endpoint it called (wrong number, type or shape); nothing was "
              "run. The page's API view (?view=api) lists what each endpoint takes.")

# Whose mistake a direct call's error was: Gradio answers every error of `run/predict` with 500, so the
# steps below note a caller's mistake here and PlainGradioErrors answers 422 for it. A list, set per
# request by the middleware, so that it is shared by the contexts Gradio copies (tasks, threads).
_CALLERS_FAULT: ContextVar[list[str] | None] = ContextVar("callers_fault", default=None)


def _callers_fault(sentence: str) -> gradio.Error:
    """The error a caller's mistake is answered with, noted as theirs."""
    if (noted := _CALLERS_FAULT.get()) is not None:
        noted.append(sentence)
    return gradio.Error(sentence, print_exception=False)


def _with_plain_input_errors(preprocess: Callable[..., Any]) -> Callable[..., Any]:
    """Gradio's checking of an event's inputs (their number, each component's own checks), with
    what a caller got wrong answered in one sentence: Gradio would log a traceback for it, and a
    stranger could fill the log with them."""
    if getattr(preprocess, "plain_input_errors", False):
        return preprocess

    async def preprocess_data(self: Any, block_fn: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            _refuse_unlisted_choices(block_fn, inputs)
            return await preprocess(self, block_fn, inputs, *args, **kwargs)
        except gradio.Error as exc:  # a component's own check ("Value: … is not in the list of choices: …")
            log.info("Refused an event's inputs: %s", str(exc.message)[:200])
            raise _callers_fault(BAD_INPUTS) from exc
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:  # pydantic's are ValueErrors
            log.info("Refused an event's inputs: %s", str(exc).splitlines()[0][:200])
            raise _callers_fault(BAD_INPUTS) from exc

    preprocess_data.plain_input_errors = True  # type: ignore[attr-defined]
    return preprocess_data


def _refuse_unlisted_choices(block_fn: Any, inputs: Any) -> None:
    """A CheckboxGroup's value must be a list: Gradio checks each item it iterates, so a dict of its
    choices (`{}` too) would reach the event's function, which slices what it gets."""
    if not isinstance(inputs, list):
        return  # Gradio's own check says what is wrong
    props = getattr(block_fn, "component_prop_inputs", ()) or ()
    for i, (block, value) in enumerate(zip(getattr(block_fn, "inputs", ()), inputs, strict=False)):
        if isinstance(block, gradio.CheckboxGroup) and i not in props and not isinstance(value, list):
            raise TypeError(f"a {type(value).__name__} for a CheckboxGroup, which takes a list")


NO_SUCH_EVENT = "There is no event {} on this page; the page's API view (?view=api) lists the endpoints."


def _with_plain_unknown_events(get_fn: Callable[..., Any]) -> Callable[..., Any]:
    """Gradio's lookup of the event a request names (by fn_index or API name), with a name that
    is not there answered as a 404 with a sentence; Gradio would answer a 500 and log a traceback."""
    if getattr(get_fn, "plain_unknown_events", False):
        return get_fn

    def find_event(blocks: Any, api_name: str | None, body: Any) -> Any:
        try:
            return get_fn(blocks, api_name, body)
        except (KeyError, route_utils.FnIndexInferError):
            which = f"with fn_index {body.fn_index}" if body.fn_index is not None else f"named {api_name!r}"
            raise HTTPException(status_code=404, detail=NO_SUCH_EVENT.format(which)) from None

    find_event.plain_unknown_events = True  # type: ignore[attr-defined]
    return find_event


async def plain_request_errors(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's answer to a body that does not fit a route's model, as one sentence (launch's
    exception handler for RequestValidationError): without the body echoed back, however large."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    error = errors[0] if errors else {}
    where = ".".join(str(part) for part in error.get("loc", ()) if part not in ("body", "query"))
    if error.get("type") == "json_invalid":
        sentence = "The request's body is not valid JSON."
    elif error.get("type") == "missing":
        sentence = f"The request is missing {where or 'its body'}."
    else:
        sentence = f"The request's {where or 'body'} is not what this endpoint takes: {error.get('msg', 'invalid')}."
    return JSONResponse({"detail": sentence}, status_code=422)


async def body_not_received(request: Request, exc: Exception) -> Response:
    """A request whose body stopped coming: the client went away mid-upload, or its body was not in
    time or too large (chat/shedding.py BodyLimits noted which). One INFO line, where Starlette's
    ClientDisconnect would reach uvicorn as an error with a traceback; the client, if still there,
    gets the sentence and the connection closes."""
    from chat.shedding import BODY_TOO_LARGE, BODY_TOO_SLOW, BODY_WITHIN_S, SCOPE_KEY

    noted = request.scope.get(SCOPE_KEY, {})
    what = f"{request.method} {request.url.path[:100]}"
    if noted.get("overdue"):
        log.info("Closed a request whose body had not arrived within %.0f s: %s", BODY_WITHIN_S, what)
        status, sentence = 408, BODY_TOO_SLOW.format(BODY_WITHIN_S)
    elif limit := noted.get("too_large"):
        log.info("Closed a request whose body was over %d MB: %s", limit // (1024 * 1024), what)
        status, sentence = 413, BODY_TOO_LARGE.format(limit // (1024 * 1024))
    else:
        log.info("A client went away before its request's body had arrived: %s", what)
        status, sentence = 400, "The request's body did not arrive."
    return PlainTextResponse(sentence + "\n", status_code=status, headers={"Connection": "close"})


# launch(app_kwargs={"exception_handlers": ...})
PLAIN_REQUEST_ERRORS = {RequestValidationError: plain_request_errors, ClientDisconnect: body_not_received}


NO_SUCH_STREAM = ("There is no event {} waiting to be read; join the queue first (POST /gradio_api/queue/join "
                  "or /gradio_api/call/<api_name>), then read its events.")
REFUSED_REQUEST = "This request does not fit the route it was sent to; nothing was run."
_CALL_EVENTS = re.compile(r"/gradio_api/call/(?:v2/)?[^/]+/([^/]+)/?")
_DIRECT_CALL = re.compile(r"/gradio_api/(?:run|api)/")  # events run outside the queue (`run/predict`, `run/<name>`)


class PlainGradioErrors:
    """ASGI middleware for Gradio's own routes (/gradio_api/...): what a caller gets wrong there is
    answered with a 4xx and one sentence, where Gradio would answer a 500 and log a traceback
    (or, for an event called directly that refused what the caller sent, a 500: 422).

    An event stream for a session or event the queue does not hold is refused before it starts
    (Gradio starts it, then fails inside it); any other route that raises ValueError, TypeError,
    KeyError, IndexError or AttributeError before answering (an unknown component, a session id
    that is not a string) is answered with REFUSED_REQUEST."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = str(scope.get("path", ""))
        if scope["type"] != "http" or not path.startswith("/gradio_api/"):
            await self.app(scope, receive, send)
            return
        missing = self._missing_stream(scope, path)
        if missing is not None:
            await _send_json(send, 404, NO_SUCH_STREAM.format(missing))
            return
        started = False
        callers_fault: list[str] = []
        if _DIRECT_CALL.match(path):  # only there: a queue started inside a request would share the list
            _CALLERS_FAULT.set(callers_fault)

        async def watched(message: dict[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if message.get("status") == 500 and callers_fault:
                    message = {**message, "status": 422}  # Gradio answers every error of a direct call with 500
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            if started:
                raise
            log.info("Refused a request to %s: %s", path[:100], (str(exc).splitlines() or [repr(exc)])[0][:200])
            await _send_json(send, 400, REFUSED_REQUEST)

    @staticmethod
    def _missing_stream(scope: dict[str, Any], path: str) -> str | None:
        """What an event-stream request names that the queue does not hold (None: it holds it, or
        this is no such request)."""
        if scope.get("method") != "GET":
            return None
        queue = getattr(getattr(scope.get("app"), "get_blocks", lambda: None)(), "_queue", None)
        if queue is None:
            return None
        if path.rstrip("/") == "/gradio_api/queue/data":
            session = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("session_hash", [None])[0]
            if session is not None and session not in queue.pending_messages_per_session:
                return f"of session {session[:64]!r}"
            return None
        match = _CALL_EVENTS.fullmatch(path)
        if match is None:
            return None
        event_id = match[1]
        if (event_id in queue.event_ids_to_events or event_id in queue.pending_messages_per_session
                or any(event_id in ids for ids in queue.pending_event_ids_session.values())):
            return None
        return f"with id {event_id[:64]!r}"


async def _send_json(send: Any, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


_THIS_APP = str(Path(__file__).resolve().parents[1])  # the chat package
_RENDERS = asyncio.Lock()  # gr.render events run one at a time (`_with_plain_gradio_errors`)


def raised_in_this_app(exc: BaseException) -> bool:
    """Whether the innermost frame of `exc` is this app's code (a bug, to stay an error with its
    traceback) rather than Gradio's (a caller's inputs it could not take). Not the event function's
    module: ChatInterface wraps this app's function in its own, under the wrapped one's name."""
    frame = exc.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return frame is not None and frame.tb_frame.f_code.co_filename.startswith(_THIS_APP)


def _with_plain_gradio_errors(step: Callable[..., Any], what: str) -> Callable[..., Any]:
    """One step of Gradio's work on an event (`call_function`, `postprocess_data`), with what a
    caller's inputs break inside Gradio's own code (a ChatInterface's history helpers, an event with
    no server function, outputs a helper made of a conversation of the wrong shape, which Gradio's
    own checks refuse with an error that would print its traceback) answered with
    BAD_INPUTS, and a ChatError an event let through answered with its own sentence. An error
    raised in this app's own code is a bug: it stays an error, logged with its traceback."""
    if getattr(step, "plain_input_errors", False):
        return step

    async def plain(self: Any, block_fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            if what == "inputs" and getattr(block_fn, "renderable", None) is not None:
                # A gr.render's own event (the lazy tabs' making, chat/ui/lazy.py) one at a time in
                # this process, as its concurrency_limit asks: Gradio's direct route (run/predict)
                # skips the queue that enforces it, and two renders of one session at once change
                # the session's dict of blocks under each other ("dictionary changed size during
                # iteration": a traceback and a 500 for a stranger's concurrent calls).
                async with _RENDERS:
                    result = await step(self, block_fn, *args, **kwargs)
            else:
                result = await step(self, block_fn, *args, **kwargs)
            if what == "outputs" and not _written_here(block_fn) and not _sendable(result):
                # e.g. ChatInterface's _save_conversation writing an int key into a dict a caller sent
                # as the saved chats: Gradio's event stream would fail on it (its JSON needs str keys).
                # Outputs this app's own functions make are not checked (the streaming chat's are, every
                # redraw, and one they could not send would be a bug, to show with its traceback).
                log.info("Refused an event's outputs: they cannot be sent as JSON")
                raise _callers_fault(BAD_INPUTS)
            return result
        except gradio.Error as exc:
            # This app's own sentences never print their traceback; one that does is Gradio's check of
            # what a caller's inputs made (ChatInterface's saved-chat loader handing a Chatbot the
            # characters of a string as "messages"), unless it checked this app's own outputs (a bug).
            if not exc.print_exception or (what == "outputs" and _written_here(block_fn)):
                raise
            log.info("Refused an event's %s: %s", what, str(exc.message)[:200])
            raise _callers_fault(BAD_INPUTS) from exc
        except ChatError as exc:
            log.info("An event ended with: %s", exc.message[:200])
            if exc.callers_fault:
                raise _callers_fault(exc.message) from exc
            raise gradio.Error(exc.message, print_exception=False) from exc
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            if raised_in_this_app(exc):
                raise
            log.info("Refused an event's %s: %s", what, (str(exc).splitlines() or [repr(exc)])[0][:200])
            raise _callers_fault(BAD_INPUTS) from exc

    plain.plain_input_errors = True  # type: ignore[attr-defined]
    return plain


def _written_here(block_fn: Any) -> bool:
    """Whether an event's function is this app's (ChatInterface's wrapper of it keeps its module)."""
    return str(getattr(getattr(block_fn, "fn", None), "__module__", "")).split(".")[0] == "chat"


def _sendable(outputs: object) -> bool:
    """Whether Gradio's event stream can write `outputs` (it uses orjson, with str() for unknown types)."""
    try:
        orjson.dumps(outputs, default=str)
    except TypeError:  # orjson.JSONEncodeError: a dict key that is not a string, nesting too deep
        return False
    return True


GRADIO_STEPS: dict[str, Callable[..., Any]] = {}  # Gradio's own, as install() found them (tests check their shape)


def install() -> None:
    """Wrap Gradio's input checks, event lookup and event calls; idempotent."""
    for name, step in (("Blocks.preprocess_data", gradio.Blocks.preprocess_data), ("route_utils.get_fn", route_utils.get_fn),
                       ("Blocks.call_function", gradio.Blocks.call_function),
                       ("Blocks.postprocess_data", gradio.Blocks.postprocess_data)):
        GRADIO_STEPS.setdefault(name, step)
    gradio.Blocks.preprocess_data = _with_plain_input_errors(gradio.Blocks.preprocess_data)
    route_utils.get_fn = _with_plain_unknown_events(route_utils.get_fn)
    gradio.Blocks.call_function = _with_plain_gradio_errors(gradio.Blocks.call_function, "inputs")
    gradio.Blocks.postprocess_data = _with_plain_gradio_errors(gradio.Blocks.postprocess_data, "outputs")
