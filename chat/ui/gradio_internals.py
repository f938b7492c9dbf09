"""The app's adapter to Gradio: every use of Gradio beyond its documented API, for the versions it
was tested with. Nothing else in the app uses Gradio's private names; chat/ui/gradio_errors.py,
installed from here, holds items 4-5, and chat/ui/gradio_import.py, which must run before Gradio
loads, a part of item 1. `check_version()` runs at start and refuses a Gradio outside
TESTED (requirements*.txt pin the same range); tests/test_gradio_internals.py checks each private
name below still has the shape used, and fails naming it and the Gradio version.

1. Gradio's bookkeeping that this app does not use, kept off the streaming path, out of the garbage
   collector's way and out of every process's start. Found (but the last) by the benchmarks on an
   H200 host (docs/benchmarks.md), where Gradio's event loop, not the engine, limited replies at 64
   and more streams, and on steady arrivals:
   - Per browser session Gradio keeps the configuration of every component on the page
     (`SessionState.config_values`). It builds all of them when a session starts (about 10 ms for
     this app's ~150 components on a 2-core machine: a burst of 256 new visitors queued 1-3 s of it
     in front of their first tokens), rebuilds a `gr.State`'s on every event that writes it, and
     builds each input's on its first event. Only Gradio's deep links read them, and the app has
     none: here each is built when first read, with the latest value Gradio recorded for it, so a
     reader sees what Gradio would have built (`SessionState.__init__`, `__setitem__` and
     `_update_value_in_config` are replaced; they use its `blocks_config.config_for_block`,
     `state_data` and `_state_ttl`). The stand-in (`LazyBlockConfigs`) behaves as the dict Gradio
     built for every dict operation.
   - After every finished event Gradio rebuilds a pandas summary of up to 10,000 past events for its
     optional /monitoring page, in a worker thread that holds the interpreter lock (the app's own
     /metrics and Monitor tab cover this): the undocumented `GRADIO_ANALYTICS_CACHE_FREQUENCY`
     defers it for good, and `GRADIO_ANALYTICS_MAX_EVENTS` keeps one event's record instead of
     10,000 (a dict each, which every full garbage collection walked: the last point says why that counts).
   - With `status_update_rate="auto"` every event that starts sends a queue-position update to every
     event still queued: quadratic in a burst. Once a second is plenty (replies rarely queue here;
     a documented setting).
   - The state of sessions whose page is gone (`drop_closed_sessions`). Gradio keeps every browser
     session's state (`App.state_holder`: `StateHolder.session_data`, `time_last_used`, `lock`) for
     up to `state_session_capacity` sessions (10,000), and one whose heartbeat has ended (the page
     was closed or reloaded, or lost its connection: Gradio's page never opens it again) is only
     marked `SessionState.is_closed` and its `gr.State` values deleted an hour later. What it keeps
     per session (a copy of the page's configuration, the components its events updated, each
     State) was ~200 objects that every full garbage collection walked: ~2 million, over a second
     of every such pause on a 2-core Xeon, once 10,000 visitors had come and gone
     (bench/frontend_rates.py, issue 48). Gradio's settings do not reach it: `delete_cache` and a
     State's `time_to_live` delete State values, not the session; a smaller capacity evicts the
     least recently used session whether its page is open or not. Here a closed session that no
     event has used for `keep_s` and that has no event in Gradio's queue (`Queue.
     pending_event_ids_session`) is dropped as Gradio drops one beyond its capacity, after its
     States' delete callbacks (`StateHolder.delete_state`); a page that comes back later starts a
     new session, with its components' values from the browser and its States' defaults.
   - The typing stub Gradio writes beside every component class as it is defined, in every process,
     about 1 s of CPU of each `import gradio` (`component_meta.create_or_modify_pyi`): left
     unwritten by chat/ui/gradio_import.py, which chat/ui/__init__.py imports first.

2. The parts of a `ChatInterface` that a message sent outside its own event chain must keep up to
   date, and the saved chats' column the page's CSS lays out (`chat_parts`: `chatbot_state`,
   `conversation_id`, `saved_conversations`, `_save_conversation`, `new_chat_button` and its
   `parent`, `chat_history_dataset`); and the form the page sends a chat back in, which they hold
   (`as_saved`: the Chatbot's own `preprocess(postprocess(...))`).

3. The login cookie of Gradio's own login page (`access-token-{cookie_id}`, `App.cookie_id`,
   `App.tokens`), which the app's routes (the WebSocket API, /metrics) accept as well as HTTP Basic
   credentials (chat/auth.py).

4. An event called with inputs that do not fit it (too few, or a component's own check fails, e.g.
   chat messages in the wrong shape) is answered with one sentence (`BAD_INPUTS`) instead of the
   traceback Gradio writes to the log for it; so are a caller's inputs that break Gradio's own event
   functions (`Blocks.preprocess_data`, `call_function`, `postprocess_data` are wrapped; they read
   a `BlockFunction`'s `inputs`, `component_prop_inputs` and `fn`). And a `gr.render`'s own event
   (a `BlockFunction` whose `renderable` is set) runs one at a time, also through Gradio's direct
   route, which skips the queue's concurrency limit: two of one session at once broke Gradio's
   making of blocks with a traceback.

5. A request naming an event that is not there (an unknown `fn_index` or API name) gets a 404 and a
   sentence instead of a 500 and a traceback (`route_utils.get_fn`, `FnIndexInferError`), and so
   does an event stream for a session or event the queue does not hold (`PlainGradioErrors` reads
   the queue's `pending_messages_per_session`, `event_ids_to_events`, `pending_event_ids_session`
   through `App.get_blocks()._queue`). A body that does not fit Gradio's request models gets a 422
   and one sentence through launch's documented `app_kwargs` (`plain_request_errors`).

6. Gradio's server (`http_server.Server`, made by `http_server.start_server`):
   - A UI worker listens on a socket its supervisor bound and keeps (`serve_on`), instead of Gradio
     binding the port itself: a port picked by one process and bound later by another could be
     taken in between by any local program, which the front door would then send visitors to.
   - uvicorn, which Gradio serves with, closes a connection idle for 5 s: exactly as long as httpx
     (and so gradio_client) keeps one, so a request such a client sends just then is reset
     unanswered (a browser sends it again; those clients raise). Gradio has no setting for it:
     `_PatientServer` keeps one `IDLE_CONNECTION_S`, longer than the usual programs keep theirs
     (httpx 5 s, Node's fetch 4 s, aiohttp 15 s), so they let go first; not much longer, since every
     idle connection holds a file descriptor of the app's process. Behind the front door, Caddy lets
     go first (3 s).
   - The limits that shed a flood (chat/shedding.py, which names the uvicorn attributes it reads):
     `_PatientServer.startup` wraps the loaded app (`config.loaded_app`) in the request body's
     limits and, where the app faces clients itself, puts the cap on connections per address in
     front of uvicorn's protocol (`config.http_protocol_class`).
   - Once listening, `launch()` asks the app's own address (`networking.url_ok`) and refuses to
     start when no answer comes; Gradio's check gives up at its first 3 s timeout, and on a busy
     machine (load 15-24 on two cores) a UI worker's first page took longer, so the worker failed to
     start with an ERROR and a traceback. `install()` puts a check in its place that waits up to
     `LOCAL_CHECK_S` for the app's own answer (`_patient_url_ok`).

7. Inputs that hand their values to the chat function unchecked (chat/ui/components.py) are
   subclasses the browser must draw as the component they extend (`drawn_as_base`: `is_template`).

8. Gradio's Python client marks its requests with a header (`x-gradio-user: api`): such a caller
   cannot run the page's script, so it gets every redraw's text (`from_gradio_client`).

9. Gradio reads an event function's parameters with `inspect.signature` (its inputs, where a
   gr.Request goes, the API's parameter names): the chat's functions take the sampling knobs as
   `*values` and name them in `__signature__` (`with_parameters`).

10. The page's CSS and scripts select Gradio's markup where they mend or lay it out (Gradio documents
    `elem_id` and `elem_classes` only): `MARKUP` names each class, attribute and id they rely on, and
    the name of the script whose frames chat/ui/status_timers.js lets run only while Gradio's
    progress indicator shows (its page-loading indicator's timer otherwise ran for the page's life).

Not a reach-in, as it uses no Gradio name: Gradio runs every event inside
`utils.MatplotlibBackendMananger` (`route_utils.call_process_api`), which imports matplotlib where it
is installed (on the H200 host, a dependency of vLLM's): the first event in each process paid for
that import, about half a second per UI worker (and the font cache, the first time on a machine).
`warm_event_path` does the same at start, before the process serves.
"""

from __future__ import annotations

import asyncio
import datetime
import inspect
import logging
import os
import socket
import time
from collections.abc import Callable, ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from dataclasses import dataclass
from typing import Any, TypeVar

import gradio
import httpx
from gradio import http_server, networking
from gradio.components import State
from gradio.state_holder import SessionState
from starlette.requests import HTTPConnection

from chat.shedding import BodyLimits, capped, connections_per_address
from chat.ui import gradio_errors
from chat.ui.gradio_errors import PLAIN_REQUEST_ERRORS, PlainGradioErrors

__all__ = ["MARKUP", "PLAIN_REQUEST_ERRORS", "TESTED", "ChatParts", "Markup", "PlainGradioErrors", "UntestedGradio", "as_saved",
           "chat_parts", "check_version", "drawn_as_base", "drop_closed_sessions", "enable_queue", "from_gradio_client",
           "install", "login_token", "serve_on", "sessions_of_open_pages", "warm_event_path", "with_parameters"]

log = logging.getLogger(__name__)
ComponentT = TypeVar("ComponentT", bound=gradio.components.Component)

IDLE_CONNECTION_S = 20  # item 6
LOCAL_CHECK_S = 60.0  # item 6: how long launch() waits for the app's own first answer
CLOSED_SESSIONS_EVERY_S = 2.0  # item 1: how often closed sessions are looked for (~1 ms per 10,000 sessions)
TESTED = ((6, 31), (6, 32))  # Gradio versions this module was tested with: at least the first, below the second
_UNSET = object()


class UntestedGradio(RuntimeError):
    """The installed Gradio is outside the range this app was tested with."""


def check_version(version: str = gradio.__version__) -> None:
    """Refuse to run on a Gradio whose internals this module was not tested against."""
    low, high = TESTED
    try:
        found = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        found = (0, 0)
    if not low <= found < high:
        wanted = f"gradio>={low[0]}.{low[1]},<{high[0]}.{high[1]}"
        raise UntestedGradio(
            f"This app was tested with Gradio {low[0]}.{low[1]}, and Gradio {version} is installed. "
            f"Install a tested version with: pip install '{wanted}' (scripts/setup does)."
        )


@dataclass(frozen=True)
class Markup:
    """Item 10: a piece of Gradio's markup that the page's CSS or a script selects."""

    selector: str  # as the page writes it, in `used_in`
    found_by: str  # a regular expression that finds it in Gradio's built page (gradio/templates/frontend)
    used_in: str


MARKUP = (
    Markup("div.main.app", r"`main fillable[^`]*`[^}]*\bapp:", "chat/ui/style.py"),
    Markup('.examples[role="list"]', r'class="examples[^"]*" role="list"', "chat/ui/style.py"),
    Markup('[role="button"] .arrow button', r'role="button"[^>]*><span class="arrow', "chat/ui/style.py"),
    Markup("button.submit-button", r"submit-button", "chat/ui/style.py"),
    Markup('[role="tab"][data-tab-id=', r"`data-tab-id`", "chat/ui/style.py"),
    Markup('[role="tablist"]', r'role="tablist"', "chat/ui/style.py"),
    Markup('#message textarea', r"<textarea", "chat/ui/style.py"),
    Markup('ul[role="listbox"]', r'<ul[^>]*role="listbox"', "chat/ui/style.py"),
    Markup('input[role="combobox"]', r'<input[^>]*role="combobox"', "chat/ui/style.py"),
    Markup('footer img[alt]', r"<footer", "chat/ui/style.py"),
    Markup('.user-row textarea', r"\.user-row", "chat/ui/style.py"),
    Markup('button[aria-label="Submit"]', r'aria-label="Submit"', "chat/ui/style.py"),
    Markup("> .column >", r"`column \$\{", "chat/ui/style.py"),
    Markup(".row > .column", r"`row \$\{", "chat/ui/style.py"),
    Markup('[aria-busy="true"]', r"`aria-busy`", "chat/ui/style.py"),
    Markup('[aria-busy="true"] .loading-spinner', r'class="loading-spinner', "chat/ui/style.py"),  # a pending line's
    Markup('#chatbot [aria-busy="true"] .loading-spinner', r'class="loading-spinner', "chat/ui/live.js"),
    Markup("#chatbot .message-buttons", r"message-buttons \$\{", "chat/ui/style.py"),
    Markup("#saved-chats:not(:has(td))", r"<td", "chat/ui/style.py"),
    Markup('.vega-embed g[role="graphics-symbol"]', r"graphics-symbol", "chat/ui/style.py"),
    Markup('[data-testid="block-info"]', r'data-testid="block-info"', "chat/ui/style.py"),
    Markup("#tab-compare-button", r"elem_id\+`-button`", "chat/ui/__init__.py"),
    Markup("#saved-file a[download]", r'class="download svelte-', "chat/ui/chat_tab.py"),
    Markup("#engine-status .md p", r"`md svelte-", "chat/ui/engine_line.js"),
    Markup("#preset input", r'<input[^>]*role="combobox"', "chat/ui/engine_line.js"),
    Markup("gradio-app .toast-wrap", r"toast-wrap", "chat/ui/page_shell.py"),
    Markup("statustracker-", r"\bstatustracker-[\w-]+\.js\b", "chat/ui/status_timers.js"),
    Markup(".wrap:is(.default, .center):not(.hide)", r"`wrap \$\{[^`]*``\} \$\{[^`]*``\}`.{0,80}?\bhide:",
           "chat/ui/status_timers.js"),
)


def login_token(connection: HTTPConnection) -> str | None:
    """The token of a login made on Gradio's login page, if this request carries one that is valid."""
    app = connection.app
    cookie_id = getattr(app, "cookie_id", None)
    if cookie_id is None:
        return None
    token = connection.cookies.get(f"access-token-{cookie_id}") or connection.cookies.get(
        f"access-token-unsecure-{cookie_id}"
    )
    return token if token is not None and token in getattr(app, "tokens", {}) else None


class LazyBlockConfigs(dict[int, Any]):
    """`SessionState.config_values`, built one block at a time when first read.

    One configuration stays built while any is pending: C code that reads a dict directly (json's
    encoder) takes a dict whose own storage is empty for `{}` without asking it for its items.
    """

    def __init__(self, blocks_config: Any, block_ids: Iterable[int]) -> None:
        super().__init__()
        self._blocks_config = blocks_config
        self._order = list(block_ids)
        self._pending: dict[int, Any] = dict.fromkeys(self._order)  # id -> block to build from (None: the current)
        self._values: dict[int, Any] = {}  # id -> the value Gradio last recorded for a block not built yet
        self._keep_one_built()

    def _keep_one_built(self) -> None:
        if self._pending and not super().__len__():
            self[next(iter(self._pending))]

    def __missing__(self, key: int) -> dict[str, Any]:
        if key not in self._pending:
            raise KeyError(key)
        block = self._pending.pop(key) or self._blocks_config.blocks[key]
        config: dict[str, Any] = self._blocks_config.config_for_block(key, [], block)
        value = self._values.pop(key, _UNSET)
        if value is not _UNSET and "props" in config:
            config["props"]["value"] = value
        super().__setitem__(key, config)
        return config

    def __setitem__(self, key: int, config: dict[str, Any]) -> None:
        self._pending.pop(key, None)
        self._values.pop(key, None)
        super().__setitem__(key, config)

    def build_later(self, key: int, block: Any) -> None:
        """Forget `key`'s configuration; build it from `block` when it is read."""
        super().pop(key, None)
        self._values.pop(key, None)
        self._pending[key] = block
        if key not in self._order:
            self._order.append(key)
        self._keep_one_built()

    def set_value(self, key: int, value: Any) -> None:
        """What `SessionState._update_value_in_config` does, without building the configuration."""
        if super().__contains__(key):
            config = super().__getitem__(key)
            if "props" in config:
                config["props"]["value"] = value
            return
        if key not in self._pending:
            self.build_later(key, None)
        self._values[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self._pending or super().__contains__(key)

    def get(self, key: int, default: Any = None) -> Any:
        return self[key] if key in self else default  # noqa: SIM401 - dict.get skips __missing__

    def setdefault(self, key: int, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def pop(self, key: int, *default: Any) -> Any:
        if key in self._pending:
            self[key]  # build it: the value popped is what Gradio would have held
        value = super().pop(key, *default)
        self._keep_one_built()
        return value

    def popitem(self) -> tuple[int, Any]:
        self._build_all()
        return super().popitem()

    def __delitem__(self, key: int) -> None:
        if self._pending.pop(key, _UNSET) is _UNSET:
            super().__delitem__(key)
        self._values.pop(key, None)
        self._keep_one_built()

    def update(self, *others: Any, **more: Any) -> None:
        for other in others:
            pairs = other.items() if isinstance(other, Mapping) else other
            for key, value in pairs:
                self[key] = value
        for key, value in more.items():
            self[key] = value  # type: ignore[index]

    def clear(self) -> None:
        self._pending.clear()
        self._values.clear()
        super().clear()

    def copy(self) -> dict[int, Any]:
        """A plain dict with every configuration built, as Gradio's own would be."""
        self._build_all()
        return dict(super().items())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyBlockConfigs):
            other._build_all()
        self._build_all()
        return dict(super().items()) == other

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None

    def __repr__(self) -> str:
        self._build_all()
        return super().__repr__()

    def _build_all(self) -> None:
        if self._pending:  # in the page's order, as Gradio builds them
            built = {key: self[key] for key in self._order if key in self}
            rest = {key: value for key, value in super().items() if key not in built}
            super().clear()
            for key, value in (built | rest).items():
                super().__setitem__(key, value)

    def items(self) -> ItemsView[int, Any]:  # type: ignore[override]
        self._build_all()
        return super().items()

    def keys(self) -> KeysView[int]:  # type: ignore[override]
        self._build_all()
        return super().keys()

    def values(self) -> ValuesView[Any]:  # type: ignore[override]
        self._build_all()
        return super().values()

    def __iter__(self) -> Iterator[int]:
        self._build_all()
        return super().__iter__()

    def __len__(self) -> int:
        return super().__len__() + len(self._pending)


class _NoBlocks:
    """A stand-in for the Blocks that lets Gradio's own __init__ run with nothing to build."""

    def __init__(self, blocks: gradio.Blocks) -> None:
        self.default_config = blocks.default_config
        self.blocks: dict[int, Any] = {}


def _init(self: SessionState, blocks: gradio.Blocks) -> None:
    _gradio_init(self, _NoBlocks(blocks))
    self.config_values = LazyBlockConfigs(
        self.blocks_config, (k for k in self.blocks_config.blocks if k in blocks.blocks)
    )


def _setitem(self: SessionState, key: int, value: Any) -> None:
    # Gradio's SessionState.__setitem__, but the configuration is built when read.
    block = self.blocks_config.blocks.get(key)
    if isinstance(block, State):
        self._state_ttl[key] = (block.time_to_live, datetime.datetime.now())
        self.state_data[key] = value
    else:
        self.blocks_config.blocks[key] = value
    if block:
        self.config_values.build_later(key, block)


def _update_value_in_config(self: SessionState, key: int, value: Any) -> None:
    self.config_values.set_value(key, value)


_PATCHES = {"__init__": _init, "__setitem__": _setitem, "_update_value_in_config": _update_value_in_config}
GRADIO_METHODS = {name: SessionState.__dict__[name] for name in _PATCHES}  # before install() replaces them
_gradio_init = GRADIO_METHODS["__init__"]


def install() -> None:
    """Check the version, then apply the patches; idempotent, called when the UI is built."""
    check_version()
    for name, function in _PATCHES.items():
        setattr(SessionState, name, function)
    gradio_errors.install()
    http_server.Server = _PatientServer
    networking.url_ok = _patient_url_ok


def enable_queue(demo: gradio.Blocks) -> None:
    """`demo.queue()`: nobody waits behind anybody (vLLM batches them), and the bookkeeping above stays down."""
    os.environ.setdefault("GRADIO_ANALYTICS_CACHE_FREQUENCY", str(10**9))  # read by the Queue being made
    os.environ.setdefault("GRADIO_ANALYTICS_MAX_EVENTS", "1")  # likewise
    demo.queue(default_concurrency_limit=None, status_update_rate=1)


@dataclass(frozen=True)
class ChatParts:
    """What a ChatInterface keeps beside its Chatbot (attributes Gradio 6.31 does not document)."""

    history: Any  # gr.State: the conversation as the server holds it (retry, undo and edit read it)
    conversation_id: Any  # gr.State: which saved chat this is
    saved: Any  # gr.BrowserState: every saved chat, kept in the browser
    save: Callable[..., Any]  # (conversation_id, history, saved) -> (conversation_id, saved)
    new_chat: Any  # gr.Button: New chat
    saved_list: Any  # gr.Dataset: the saved chats, clicked by index


def chat_parts(chat: gradio.ChatInterface, *, new_chat_id: str, saved_list_id: str, column_id: str) -> ChatParts:
    """Item 2: the ChatInterface's state holders and its saved-chats column (given these elem_ids,
    for the page's CSS), refusing clearly if Gradio renamed them."""
    try:
        parts = ChatParts(chat.chatbot_state, chat.conversation_id, chat.saved_conversations, chat._save_conversation,
                          chat.new_chat_button, chat.chat_history_dataset)
        column = chat.new_chat_button.parent
    except AttributeError as exc:
        raise UntestedGradio(f"Gradio's ChatInterface changed ({exc}); install gradio>=6.31,<6.32.") from exc
    parts.new_chat.elem_id, parts.saved_list.elem_id, column.elem_id = new_chat_id, saved_list_id, column_id
    return parts


def as_saved(chatbot: gradio.Chatbot, messages: list[Any]) -> Any:
    """Item 2: `messages` (dicts or gr.ChatMessage) in the form the page sends the chat back in, which
    the ChatInterface's history and saved chats hold: the Chatbot's own round trip."""
    return chatbot.preprocess(chatbot.postprocess(messages))


def drawn_as_base(cls: type[ComponentT]) -> type[ComponentT]:
    """Item 7: a subclass of a Gradio component that the browser draws as the component it extends."""
    cls.is_template = True
    return cls


def from_gradio_client(request: gradio.Request | None) -> bool:
    """Item 8: whether Gradio's own Python client sent this request (it says so in a header)."""
    return request is not None and request.headers.get("x-gradio-user") == "api"


def with_parameters(fn: Callable[..., Any], parameters: list[inspect.Parameter]) -> None:
    """Item 9: Gradio reads `fn`'s parameters (for its inputs, a gr.Request's place and the API's
    names) as `inspect.signature` gives them: here, `parameters`."""
    fn.__signature__ = inspect.signature(fn).replace(parameters=parameters)  # type: ignore[attr-defined]


GRADIO_SERVER: dict[str, Any] = {"Server": http_server.Server, "start_server": http_server.start_server,
                                 "url_ok": networking.url_ok}  # before install, serve_on


def _patient_url_ok(url: str, within_s: float | None = None) -> bool:
    """Item 6: whether `url` answers as Gradio's `networking.url_ok` counts an answer, asked until it
    does or `within_s` (LOCAL_CHECK_S) has passed, a slow or refused ask included."""
    deadline = time.monotonic() + (LOCAL_CHECK_S if within_s is None else within_s)
    while True:
        try:
            if httpx.head(url, timeout=10, verify=False).status_code in (200, 401, 301, 302, 303, 307, 308):
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


class _PatientServer(http_server.Server):
    """Item 6: Gradio's server, keeping an idle connection `IDLE_CONNECTION_S` instead of 5 s, with
    the limits that shed floods (chat/shedding.py): a request body's time and size, and, where it
    faces clients, a cap on each address's connections, a time limit for a request head, and a
    body declared too large refused unread."""

    faces_clients = True

    def __init__(self, config: Any, *args: Any, **kwargs: Any) -> None:
        config.timeout_keep_alive = IDLE_CONNECTION_S
        super().__init__(config, *args, **kwargs)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn has loaded its config: the app and the protocol class it is about to serve with.
        self.config.loaded_app = BodyLimits(self.config.loaded_app, refuse_declared=self.faces_clients)
        if self.faces_clients:
            self.config.http_protocol_class = capped(self.config.http_protocol_class, connections_per_address())
        await super().startup(sockets)


class _ServerOnSocket(_PatientServer):
    """Gradio's server thread (it stops with the app's `close()`), accepting on an open socket: a UI
    worker's, behind the front door (every connection is Caddy's, which applies the limits itself)."""

    faces_clients = False

    def __init__(self, config: Any, listener: socket.socket) -> None:
        super().__init__(config)
        self.listener = listener

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        super().run(sockets=[self.listener])


def serve_on(listener: socket.socket) -> None:
    """Item 6: the next `launch()` in this process listens on `listener`, a socket bound to a port of
    127.0.0.1 (uvicorn starts listening once the app has started); its `server_name` and
    `server_port` name that address."""
    import uvicorn

    def start_server(app: Any, server_name: str | None = None, server_port: int | None = None,
                     **_tls: Any) -> tuple[str, int, str, http_server.Server]:
        host, port = server_name or "127.0.0.1", int(server_port or 0)
        # SO_REUSEADDR while listening (its connections inherit it), so that a replacement can listen
        # again while its predecessor's connections linger in TIME_WAIT; the supervisor clears it when
        # the port stops listening, so no other program may bind the port then (chat/supervisor.py).
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.listen(2048)  # uvicorn's backlog; its own listen() then changes nothing
        server = _ServerOnSocket(uvicorn.Config(app=app, host=host, port=port, log_level="warning"), listener)
        server.run_in_thread()
        return host, port, f"http://{host}:{port}/", server

    http_server.start_server = start_server


def drop_closed_sessions(demo: gradio.Blocks, keep_s: float) -> int:
    """Item 1: drop the state of every session whose heartbeat has ended, unused for `keep_s` and
    with no event queued or running; how many were dropped."""
    holder, queue = demo.state_holder, demo._queue
    unused_since = datetime.datetime.now() - datetime.timedelta(seconds=keep_s)  # Gradio's clock: naive local time
    gone = [session for session, state in list(holder.session_data.items())
            if state.is_closed and holder.time_last_used.get(session, unused_since) <= unused_since
            and not queue.pending_event_ids_session.get(session)]
    for session in gone:
        holder.delete_state(session)  # each gr.State's delete_callback, as Gradio's own expiry calls it
        with holder.lock:
            holder.session_data.pop(session, None)
            holder.time_last_used.pop(session, None)
    return len(gone)


async def sessions_of_open_pages(demo: gradio.Blocks, keep_s: float, every_s: float = CLOSED_SESSIONS_EVERY_S) -> None:
    """Item 1, for the server's life: `drop_closed_sessions` every `every_s`."""
    while True:
        await asyncio.sleep(every_s)
        try:
            dropped = drop_closed_sessions(demo, keep_s)
        except Exception:  # a Gradio whose bookkeeping changed: serve on, with Gradio's own limits
            log.exception("Could not drop the state of closed Gradio sessions; keeping them as Gradio does")
            return
        if dropped:
            log.debug("Dropped the state of %d closed Gradio sessions", dropped)


def warm_event_path() -> None:
    """Blocking; what Gradio's first event in this process would otherwise do first (not a reach-in:
    Gradio's own names are not used, see the note above): import matplotlib, where installed, and
    switch its backend to "agg" and back, as Gradio's `utils.MatplotlibBackendMananger` does."""
    try:
        import matplotlib
    except ImportError:
        return
    backend = matplotlib.get_backend()
    matplotlib.use("agg")
    matplotlib.use(backend)
