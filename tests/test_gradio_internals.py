"""A session builds component configurations only when they are read, and then the same ones as
Gradio's own SessionState would have built (the app's real page; the HTTP and browser tests run
the app with it)."""

from __future__ import annotations

import json

import pytest
from gradio.components import State, Textbox
from gradio.state_holder import SessionState

from chat.live import ReplyStore
from chat.monitor import Monitor
from chat.presets import load_presets
from chat.registry import EngineRegistry
from chat.service import ChatService
from chat.ui import build_ui, gradio_internals


class GradioSession(SessionState):
    """Gradio's own behaviour, whatever install() did to SessionState."""

    __init__ = gradio_internals.GRADIO_METHODS["__init__"]
    __setitem__ = gradio_internals.GRADIO_METHODS["__setitem__"]
    _update_value_in_config = gradio_internals.GRADIO_METHODS["_update_value_in_config"]


@pytest.fixture(scope="module")
def page():
    catalog = load_presets()
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
    """Item 7: Gradio still enters matplotlib's backend manager around every event (importing
    matplotlib where installed), and warm_event_path does it once, at start."""
    import inspect

    from gradio import route_utils, utils

    assert "MatplotlibBackendMananger()" in inspect.getsource(route_utils.call_process_api)
    entered: list[str] = []

    class Manager:
        def __enter__(self) -> None:
            entered.append("enter")

        def __exit__(self, *exc: object) -> None:
            entered.append("exit")

    monkeypatch.setattr(utils, "MatplotlibBackendMananger", Manager)
    gradio_internals.warm_event_path()
    assert entered == ["enter", "exit"]
