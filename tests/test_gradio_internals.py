"""Gradio's adapter (chat/ui/gradio_internals.py): a session builds component configurations only
when they are read, and then the same ones as Gradio's own SessionState would have built (the app's
real page; the HTTP and browser tests run the app with it); each private name the adapter uses still
has the shape it is used in (a failure names it and the Gradio version); and no other module of the
app uses one."""

from __future__ import annotations

import asyncio
import datetime
import inspect
import json
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

# isort: off
import chat.ui  # noqa: F401 - before Gradio, as in the app: its stub writer is made a no-op as it loads (item 1)
# isort: on
import gradio
import gradio as gr
import pytest
from gradio.components import State, Textbox
from gradio.state_holder import SessionState

from chat.live import ReplyStore
from chat.monitor import Monitor
from chat.presets import load_presets
from chat.registry import EngineRegistry
from chat.sampling import KNOB_NAMES
from chat.service import ChatService
from chat.ui import build_ui, gradio_errors, gradio_internals
from chat.ui.components import PlainSlider

ROOT = Path(__file__).resolve().parent.parent


class GradioSession(SessionState):
    """Gradio's own behaviour, whatever install() did to SessionState."""

    __init__ = gradio_internals.GRADIO_METHODS["__init__"]
    __setitem__ = gradio_internals.GRADIO_METHODS["__setitem__"]
    _update_value_in_config = gradio_internals.GRADIO_METHODS["_update_value_in_config"]


@pytest.fixture(scope="module")
def page():
    catalog = load_presets(check_engine=False)
    registry = EngineRegistry(memory_budget=1e10)  # never started: no engine is needed to build the page
    service = ChatService(catalog, registry, "SmolLM2 135M (CPU)", has_gpu=False)
    return build_ui(service, Monitor(registry), ReplyStore())


def first(page, kind: type) -> int:
    return next(key for key, block in page.blocks.items() if type(block) is kind)


def test_a_new_session_builds_no_configuration(page):
    state = SessionState(page)
    assert isinstance(state.config_values, gradio_internals.LazyBlockConfigs)
    assert dict.__len__(state.config_values) == 1, "one is kept built (json reads an empty dict as {})"
    some_block = list(page.blocks)[-1]
    assert some_block in state.config_values
    assert len(state.config_values) == len(GradioSession(page).config_values)
    assert dict.__len__(state.config_values) == 1, "neither a membership test nor len() builds anything"
    assert state.config_values[some_block]["id"] == some_block
    assert dict.__len__(state.config_values) == 2


def test_configurations_match_gradios_in_the_same_order(page):
    ours, theirs = SessionState(page), GradioSession(page)
    assert len(page.blocks) > 50
    assert type(theirs.config_values) is dict, "the reference is Gradio's own"
    assert list(ours.config_values.items()) == list(theirs.config_values.items())
    assert list(SessionState(page).config_values) == list(theirs.config_values)
    assert list(ours.components) == list(theirs.components)


def test_an_event_builds_nothing_and_leaves_what_gradio_would(page):
    """What Gradio's pre- and postprocessing do to a session on an event: record each input's value,
    write a gr.State, record an output's value."""
    textbox, state_block = first(page, Textbox), first(page, State)
    ours, theirs = SessionState(page), GradioSession(page)
    for session in (ours, theirs):
        session._update_value_in_config(textbox, "typed by a visitor")
        session[state_block] = ["kept", "between", "events"]
        session._update_value_in_config(textbox, "typed again")
    assert dict.__len__(ours.config_values) == 1, "an event builds no configuration"
    assert ours[state_block] == theirs[state_block] == ["kept", "between", "events"]
    assert ours.config_values[textbox]["props"]["value"] == "typed again"
    assert list(ours.components) == list(theirs.components)


def test_a_value_recorded_after_building_lands_in_it(page):
    textbox = first(page, Textbox)
    ours, theirs = SessionState(page), GradioSession(page)
    built = ours.config_values[textbox]
    for session in (ours, theirs):
        session._update_value_in_config(textbox, "later")
    assert built["props"]["value"] == "later"
    assert ours.config_values[textbox] == theirs.config_values[textbox]


def test_an_unknown_block_is_still_missing(page):
    state = SessionState(page)
    assert -1 not in state.config_values
    with pytest.raises(KeyError):
        state.config_values[-1]


def test_the_queue_keeps_its_bookkeeping_down(page):
    queue = page._queue
    assert not queue.live_updates and queue.update_intervals == 1, "queue positions are sent once a second"
    assert queue.ANALYTICS_MAX_EVENTS == 1, "one past event's record kept, not 10,000"
    finished = [{"function": "chat", "status": "success", "process_time": 0.1, "time": 0.0}] * 3
    queue.events_recorded += 3
    assert queue.compute_analytics_summary(finished) == {"functions": {}}, "no pandas summary after each event"


def test_the_stand_in_behaves_as_gradios_dict_for_every_dict_operation(page):
    textbox = first(page, Textbox)
    theirs = GradioSession(page).config_values
    assert SessionState(page).config_values.get(textbox) == theirs[textbox]
    assert SessionState(page).config_values.get(-1, "absent") == "absent"
    assert SessionState(page).config_values.copy() == theirs and type(SessionState(page).config_values.copy()) is dict
    assert SessionState(page).config_values == theirs
    assert (SessionState(page).config_values != theirs) is False
    assert SessionState(page).config_values == SessionState(page).config_values
    assert json.dumps(SessionState(page).config_values, default=str) == json.dumps(theirs, default=str)
    assert dict(SessionState(page).config_values) == theirs
    assert repr(SessionState(page).config_values) == repr(theirs)
    ours = SessionState(page).config_values
    assert ours.pop(textbox) == theirs[textbox] and textbox not in ours
    assert len(ours) == len(theirs) - 1 and ours != theirs
    ours.update({textbox: theirs[textbox]})
    assert ours == theirs
    del ours[textbox]
    assert ours.setdefault(textbox, "x") == "x"


@pytest.mark.parametrize(("version", "accepted"), [("6.31.0", True), ("6.31.7", True), ("6.30.2", False),
                                                   ("6.32.0", False), ("7.0.0", False), ("dev", False)])
def test_an_untested_gradio_is_refused_with_what_to_install(version, accepted):
    if accepted:
        gradio_internals.check_version(version)
        return
    with pytest.raises(gradio_internals.UntestedGradio) as caught:
        gradio_internals.check_version(version)
    assert f"Gradio {version} is installed" in str(caught.value)
    assert "pip install 'gradio>=6.31,<6.32'" in str(caught.value)


def test_what_gradio_does_first_in_every_event_is_done_at_start(monkeypatch):
    """Not a reach-in (no Gradio name is used): Gradio still enters matplotlib's backend manager
    around every event, and warm_event_path does what it does (import matplotlib, switch the backend
    to "agg" and back) once, at start. Should Gradio stop, the warm-up is only wasted."""
    from gradio import route_utils, utils

    name = "gradio.utils.MatplotlibBackendMananger"
    gradio_has(name, "MatplotlibBackendMananger()" in inspect.getsource(route_utils.call_process_api),
               "entered by route_utils.call_process_api around every event")
    gradio_has(name, 'matplotlib.use("agg")' in inspect.getsource(utils.MatplotlibBackendMananger),
               'switches matplotlib\'s backend to "agg"')
    used: list[str] = []
    matplotlib = types.ModuleType("matplotlib")  # installed or not, as Gradio's manager would find it
    matplotlib.get_backend = lambda: "the backend before"  # type: ignore[attr-defined]
    matplotlib.use = lambda backend, *args, **kwargs: used.append(backend)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "matplotlib", matplotlib)
    gradio_internals.warm_event_path()
    assert used == ["agg", "the backend before"]


# One test per private name the adapter uses (gradio_internals.py's numbered items): each fails naming
# it and the installed Gradio, so an upgrade says at once what to look at.

def gradio_has(name: str, ok: object, shape: str) -> None:
    assert ok, (f"Gradio {gradio.__version__} changed {name}, which chat/ui/gradio_internals.py uses: "
                f"expected {shape}")


def parameters(fn: object) -> list[str]:
    return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]


def test_item_1_session_state_as_replaced(page):
    for name, wanted in (("__init__", ["self", "blocks"]), ("__setitem__", ["self", "key", "value"]),
                         ("_update_value_in_config", ["self", "key", "value"])):
        method = gradio_internals.GRADIO_METHODS[name]
        gradio_has(f"SessionState.{name}", parameters(method) == wanted, f"parameters {wanted}")
    theirs = GradioSession(page)
    for name in ("blocks_config", "config_values", "state_data", "_state_ttl"):
        gradio_has(f"SessionState.{name}", hasattr(theirs, name), "an attribute of every session")
    gradio_has("SessionState._state_ttl", isinstance(theirs._state_ttl, dict), "a dict of (time_to_live, set at)")
    textbox = first(page, Textbox)
    gradio_has("BlocksConfig.config_for_block", parameters(theirs.blocks_config.config_for_block)[:3]
               == ["_id", "rendered_ids", "block"], "config_for_block(id, rendered_ids, block)")
    gradio_has("BlocksConfig.blocks", textbox in theirs.blocks_config.blocks, "a dict of id -> block")


def test_item_1_no_typing_stubs_are_written_as_gradio_loads(tmp_path):
    """This module imports the UI before Gradio (above), as the app does: Gradio's stub writer was made a
    no-op as Gradio loaded, before its own components were defined, and a component class defined
    later writes no stub beside its file. (In this process, not a fresh one: that cost 3.5-5 s of
    `scripts/test --fast`, and the hook sets the function only while Gradio loads, so finding it set
    shows it was in place in time.)"""
    import importlib.util

    from chat.ui import gradio_import

    component_meta = sys.modules[gradio_import.MODULE]
    gradio_has(f"component_meta.{gradio_import.FUNCTION}",
               f"{gradio_import.FUNCTION}(component_class, name, events)" in inspect.getsource(component_meta.ComponentMeta.__new__),
               "called by ComponentMeta.__new__ for every component class")
    assert getattr(component_meta, gradio_import.FUNCTION) is gradio_import.no_typing_stub, (
        "Gradio was imported before chat.ui in this test process (a test module imports gradio first?)")
    assert not any(isinstance(finder, gradio_import.WithoutTypingStubs) for finder in sys.meta_path), "the hook left"
    module = tmp_path / "a_component.py"
    module.write_text("import gradio as gr\n\nclass Mine(gr.Textbox):\n    pass\n")
    spec = importlib.util.spec_from_file_location("a_component", module)
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    gradio_has(gradio_import.FUNCTION, not module.with_suffix(".pyi").exists(), "left unwritten, not written anyway")


@pytest.mark.parametrize("name", ["GRADIO_ANALYTICS_CACHE_FREQUENCY", "GRADIO_ANALYTICS_MAX_EVENTS"])
def test_item_1_queue_reads_the_analytics_settings(name):
    from gradio import queueing

    gradio_has(name, name in inspect.getsource(queueing.Queue.__init__), "read by Queue.__init__")


def test_item_2_chat_interface_parts():
    with gr.Blocks():
        chat = gr.ChatInterface(lambda message, history: "hi", save_history=True)
    for name in ("chatbot_state", "conversation_id", "saved_conversations", "new_chat_button", "chat_history_dataset"):
        gradio_has(f"ChatInterface.{name}", hasattr(chat, name), "an attribute of a ChatInterface with save_history")
    gradio_has("ChatInterface._save_conversation", parameters(chat._save_conversation)
               == ["index", "conversation", "saved_conversations"], "(index, conversation, saved_conversations)")
    gradio_has("ChatInterface.new_chat_button.parent", isinstance(chat.new_chat_button.parent, gr.Column),
               "the column of New chat and the saved chats")
    parts = gradio_internals.chat_parts(chat, new_chat_id="n", saved_list_id="s", column_id="c")
    assert (parts.new_chat.elem_id, parts.saved_list.elem_id, chat.new_chat_button.parent.elem_id) == ("n", "s", "c")
    assert parts.save(None, [{"role": "user", "content": "hello"}], [])[0] == 0


def test_item_2_a_chat_interface_without_its_parts_is_refused_by_name():
    with pytest.raises(gradio_internals.UntestedGradio, match="chatbot_state"):
        gradio_internals.chat_parts(object(), new_chat_id="n", saved_list_id="s", column_id="c")  # type: ignore[arg-type]


def test_item_2_the_chatbots_round_trip():
    chatbot = gr.Chatbot()
    saved = gradio_internals.as_saved(chatbot, [{"role": "user", "content": "hi"}, gr.ChatMessage("hello", role="assistant")])
    gradio_has("Chatbot.preprocess(Chatbot.postprocess(...))",
               [(m["role"], m["content"]) for m in saved] == [("user", [{"type": "text", "text": "hi"}]),
                                                             ("assistant", [{"type": "text", "text": "hello"}])],
               "role/content dicts with the text as a list of parts, as the page sends the chat back")


def test_item_3_the_login_cookie():
    from gradio import routes

    source = inspect.getsource(routes)
    gradio_has("access-token-{cookie_id}", 'f"access-token-{app.cookie_id}"' in source
               and 'f"access-token-unsecure-{app.cookie_id}"' in source, "the login cookies' names")
    init = inspect.getsource(routes.App.__init__)
    gradio_has("App.cookie_id", "self.cookie_id = " in init, "set by App.__init__")
    gradio_has("App.tokens", "self.tokens = {}" in init, "a dict of token -> user, set by App.__init__")


@pytest.mark.parametrize(("name", "wanted"), [("Blocks.preprocess_data", ["self", "block_fn", "inputs"]),
                                              ("Blocks.call_function", ["self", "block_fn"]),
                                              ("Blocks.postprocess_data", ["self", "block_fn"])])
def test_item_4_the_event_steps_as_wrapped(page, name, wanted):
    step = gradio_errors.GRADIO_STEPS[name]
    gradio_has(name, inspect.iscoroutinefunction(step) and parameters(step)[:len(wanted)] == wanted,
               f"a coroutine taking {wanted} first")
    gradio_has(name, getattr(gradio.Blocks, name.split(".")[1]) is not step, "looked up on Blocks at call time")


def test_item_4_block_functions():
    with gr.Blocks() as demo:
        box = gr.Textbox()
        box.submit(lambda text: text, [box], [box])
        @gr.render(inputs=[box], triggers=[box.change])
        def made(text):
            gr.Markdown(text)

    block_fn = demo.fns[0]
    for name in ("inputs", "component_prop_inputs", "fn", "renderable"):
        gradio_has(f"BlockFunction.{name}", hasattr(block_fn, name), "an attribute of an event's BlockFunction")
    gradio_has("BlockFunction.inputs", block_fn.inputs == [box], "the event's input components")
    gradio_has("BlockFunction.renderable", block_fn.renderable is None
               and [f.renderable.fn for f in demo.fns.values() if f.renderable is not None] == [made],
               "set (to the gr.render) on a render's own event only")


async def test_item_4_a_renders_own_events_run_one_at_a_time_and_others_do_not_wait():
    """Gradio's direct route skips the queue and so a render's concurrency limit: two makings of one
    session's blocks at once broke Gradio ("dictionary changed size during iteration")."""
    from chat.ui.gradio_errors import _with_plain_gradio_errors

    running, most = 0, 0

    async def step(self: Any, block_fn: Any, *args: Any) -> str:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.05)
        running -= 1
        return "made"

    call = _with_plain_gradio_errors(step, "inputs")
    render, event = types.SimpleNamespace(renderable=object()), types.SimpleNamespace(renderable=None)
    assert await asyncio.gather(*(call(None, render) for _ in range(4))) == ["made"] * 4
    assert most == 1, "a render's events overlapped"
    most = 0
    await asyncio.gather(*(call(None, event) for _ in range(4)))
    assert most == 4, "other events waited for each other"


def test_item_5_the_event_lookup(page):
    from gradio import queueing, route_utils, routes

    get_fn = gradio_errors.GRADIO_STEPS["route_utils.get_fn"]
    gradio_has("route_utils.get_fn", parameters(get_fn) == ["blocks", "api_name", "body"], "get_fn(blocks, api_name, body)")
    gradio_has("route_utils.get_fn", "route_utils.get_fn(" in inspect.getsource(routes)
               and "route_utils.get_fn(" in inspect.getsource(queueing), "looked up on route_utils at call time")
    gradio_has("route_utils.FnIndexInferError", issubclass(route_utils.FnIndexInferError, Exception), "an exception")


def test_item_5_the_queues_event_streams(page):
    from gradio import routes

    queue = page._queue
    for name in ("pending_messages_per_session", "event_ids_to_events", "pending_event_ids_session"):
        gradio_has(f"Queue.{name}", hasattr(queue, name) and hasattr(getattr(queue, name), "__contains__"),
                   "a mapping of the queue's sessions or events")
    gradio_has("App.get_blocks", callable(getattr(routes.App, "get_blocks", None)), "the app's Blocks")
    gradio_has("Blocks._queue", page._queue is not None, "the Blocks' queue")


def test_item_6_the_server(page):
    import uvicorn
    from gradio import blocks, http_server, networking

    server, start_server = gradio_internals.GRADIO_SERVER["Server"], gradio_internals.GRADIO_SERVER["start_server"]
    gradio_has("http_server.Server", issubclass(server, uvicorn.Server) and parameters(server.__init__)[:2]
               == ["self", "config"], "a uvicorn.Server taking its Config first")
    gradio_has("http_server.Server", "Server(" in inspect.getsource(start_server), "made by start_server")
    gradio_has("http_server.start_server", parameters(start_server)[:3] == ["app", "server_name", "server_port"],
               "start_server(app, server_name, server_port, ...)")
    gradio_has("http_server.start_server", "http_server.start_server(" in inspect.getsource(blocks.Blocks.launch),
               "called by Blocks.launch, looked up on http_server")
    gradio_has("http_server.Server", http_server.Server is gradio_internals._PatientServer, "replaced by install()")
    url_ok = gradio_internals.GRADIO_SERVER["url_ok"]
    gradio_has("networking.url_ok", parameters(url_ok) == ["url"], "url_ok(url)")
    gradio_has("networking.url_ok", "networking.url_ok(self.local_url)" in inspect.getsource(blocks.Blocks.launch),
               "Blocks.launch's check of its own address, looked up on networking")
    gradio_has("networking.url_ok", networking.url_ok is gradio_internals._patient_url_ok, "replaced by install()")


def test_item_6_launch_waits_for_its_own_address_where_gradio_gave_up_at_once():
    """The address answers only after a moment (a busy machine's first page): Gradio's check says no at
    its first failed ask, the app's waits for the answer."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from tests.conftest import free_port

    class Ok(BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    assert not gradio_internals.GRADIO_SERVER["url_ok"](url)  # nothing listens yet: Gradio gives up
    server = HTTPServer(("127.0.0.1", port), Ok)
    later = threading.Timer(0.3, server.serve_forever, kwargs={"poll_interval": 0.05})
    later.start()
    try:
        assert gradio_internals._patient_url_ok(url, within_s=30)
    finally:
        server.shutdown()
        later.join()
        server.server_close()
    assert not gradio_internals._patient_url_ok(url, within_s=0.3)  # nothing listens again: no


def test_item_7_a_subclass_drawn_as_its_base():
    slider = PlainSlider(0, 1)  # made with drawn_as_base
    gradio_has("Block.is_template", (slider.get_block_name(), slider.get_block_class()) == ("slider", "slider"),
               "a class with is_template drawn as its base class")


def test_item_8_gradio_clients_header():
    from gradio_client import client

    gradio_has("x-gradio-user", 'headers["x-gradio-user"] = "api"' in inspect.getsource(client),
               "gradio_client's header on every call")


def test_item_9_the_parameters_gradio_reads(page):
    endpoints = page.get_api_info()["named_endpoints"]
    names = [parameter["parameter_name"] for parameter in endpoints["/chat"]["parameters"]]
    gradio_has("__signature__ (inspect.signature)", set(KNOB_NAMES) <= set(names),
               f"the chat's API to take the knobs by name, got {names}")


def sessions(*, delete_callback: Callable[[Any], None]) -> tuple[gr.Blocks, State]:
    """A page with one gr.State, served (its StateHolder, its queue), as the app's page is."""
    from gradio.routes import App

    with gr.Blocks() as demo:
        kept = gr.State("a visitor's", delete_callback=delete_callback)
        box = gr.Textbox()
        box.submit(lambda text, value: text, [box, kept], [box])
    demo.queue()
    App.create_app(demo)
    return demo, kept


def test_item_11_sessions_whose_page_is_gone_are_dropped():
    deleted: list[Any] = []
    demo, kept = sessions(delete_callback=deleted.append)
    holder, long_ago = demo.state_holder, datetime.datetime.now() - datetime.timedelta(seconds=60)
    for session in ("open", "closed just now", "gone", "gone, with an event queued"):
        holder[session][kept._id] = f"{session}'s value"  # what an event writes
        holder[session].is_closed = session != "open"
        if session.startswith("gone") or session == "open":
            holder.time_last_used[session] = long_ago
    demo._queue.pending_event_ids_session["gone, with an event queued"] = {"an event"}
    assert gradio_internals.drop_closed_sessions(demo, keep_s=30) == 1
    assert list(holder.session_data) == ["open", "closed just now", "gone, with an event queued"]
    assert "gone" not in holder.time_last_used
    assert deleted == ["gone's value"], "its States' delete callbacks ran, as when Gradio drops a session"
    assert holder["gone"][kept._id] == "a visitor's", "a page that comes back starts a new session"


async def test_item_11_the_sweep_runs_until_the_server_stops(monkeypatch):
    demo, _ = sessions(delete_callback=lambda value: None)
    swept = asyncio.Event()
    monkeypatch.setattr(gradio_internals, "drop_closed_sessions", lambda blocks, keep_s: swept.set() or 0)
    sweeping = asyncio.create_task(gradio_internals.sessions_of_open_pages(demo, keep_s=30, every_s=0.01))
    await asyncio.wait_for(swept.wait(), 5)
    sweeping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sweeping


def test_item_11_gradios_session_bookkeeping():
    from gradio import routes, state_holder

    heartbeat = inspect.getsource(routes.App.create_app)
    gradio_has("SessionState.is_closed", "session_data[session_hash].is_closed = True" in heartbeat,
               "set when a session's heartbeat ends")
    gradio_has("StateHolder.time_last_used", "self.time_last_used[session_id] = datetime.datetime.now()"
               in inspect.getsource(state_holder.StateHolder.__getitem__), "set to now() on every use of a session")
    holder = state_holder.StateHolder()
    for name, kind in (("session_data", dict), ("time_last_used", dict)):
        gradio_has(f"StateHolder.{name}", isinstance(getattr(holder, name, None), kind), "a dict by session hash")
    gradio_has("StateHolder.lock", hasattr(getattr(holder, "lock", None), "__enter__"), "a lock")
    gradio_has("StateHolder.delete_state", parameters(holder.delete_state)[:1] == ["session_id"],
               "delete_state(session_id, ...)")
    gradio_has("Blocks.state_holder", "blocks.state_holder = self" in inspect.getsource(holder.set_blocks),
               "set when the app is made")


@pytest.fixture(scope="module")
def gradios_page() -> str:
    """Gradio's built page: its scripts and styles, as installed."""
    assets = Path(gradio.__file__).parent / "templates" / "frontend" / "assets"
    return "\n".join(path.read_text(errors="replace") for path in sorted(assets.iterdir()) if path.suffix in (".js", ".css"))


@pytest.mark.parametrize("markup", gradio_internals.MARKUP, ids=lambda markup: markup.selector)
def test_item_10_the_markup_the_page_selects(gradios_page, markup):
    gradio_has(f"its page's markup `{markup.selector}`", re.search(markup.found_by, gradios_page),
               f"/{markup.found_by}/ in its built page, which {markup.used_in} selects")
    assert markup.selector in (ROOT / markup.used_in).read_text(encoding="utf-8"), \
        f"MARKUP lists {markup.selector!r} for {markup.used_in}, which no longer selects it: drop it from the list"


ADAPTER = {"chat/ui/gradio_internals.py", "chat/ui/gradio_errors.py", "chat/ui/gradio_import.py"}
DOCUMENTED_MODULES = {"api", "components", "themes"}  # gr.api (docs/gradio/api), custom components' base class, themes
PRIVATE_USES = re.compile(
    r"^\s*from gradio[. ]|^\s*import gradio\.|\bgr\.\w+\.\w+\.|\bgr\._|is_template|x-gradio-user|__signature__|"
    r"new_chat_button|chat_history_dataset|chatbot_state|saved_conversations|_save_conversation|"
    r"(?<!def )\b(?:pre|post)process\(|access-token|cookie_id|route_utils|http_server|state_holder|\._queue\b",
    re.MULTILINE,
)


def test_no_module_outside_the_adapter_reaches_into_gradio():
    """Outside chat/ui/gradio_internals.py and gradio_errors.py, the app imports Gradio as `gr` and
    uses only names Gradio exports (a component's own `preprocess`/`postprocess` may be defined,
    as Gradio's guide to custom components does, not called)."""
    exported = set(gradio.__all__) | DOCUMENTED_MODULES
    found = []
    for path in sorted([*(ROOT / "chat").rglob("*.py"), ROOT / "app.py"]):
        name = str(path.relative_to(ROOT))
        if name in ADAPTER:
            continue
        text = path.read_text(encoding="utf-8")
        found += [f"{name}: {match[0].strip()}" for match in PRIVATE_USES.finditer(text)]
        found += [f"{name}: gr.{used}" for used in set(re.findall(r"\bgr\.(\w+)", text)) - exported]
    assert not found, "Gradio's private names outside its adapter (chat/ui/gradio_internals.py): " + "; ".join(found)
