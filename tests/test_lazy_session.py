"""A new session builds no component configuration until one is read, and then the same ones as
Gradio's own SessionState (the app's real page; the HTTP and browser tests run the app with it)."""

from __future__ import annotations

import pytest
from gradio.state_holder import SessionState

from chat.engine import EngineRegistry
from chat.monitor import Monitor
from chat.presets import load_presets
from chat.service import ChatService
from chat.ui import build_ui, lazy_session


@pytest.fixture(scope="module")
def page():
    catalog = load_presets()
    registry = EngineRegistry(memory_budget=1e10)  # never started: no engine is needed to build the page
    service = ChatService(catalog, registry, "SmolLM2 135M (CPU)", has_gpu=False)
    return build_ui(service, Monitor(registry))


def gradio_session(page) -> SessionState:
    state = SessionState.__new__(SessionState)
    lazy_session._original_init(state, page)
    return state


def test_a_new_session_builds_no_configuration(page):
    state = SessionState(page)
    assert isinstance(state.config_values, lazy_session.LazyBlockConfigs)
    assert dict.__len__(state.config_values) == 0
    some_block = next(iter(page.blocks))
    assert some_block in state.config_values
    assert len(state.config_values) == len(gradio_session(page).config_values)
    assert dict.__len__(state.config_values) == 0, "neither a membership test nor len() builds anything"
    assert state.config_values[some_block]["id"] == some_block
    assert dict.__len__(state.config_values) == 1


def test_configurations_match_gradios_in_the_same_order(page):
    ours, theirs = SessionState(page), gradio_session(page)
    assert len(page.blocks) > 50
    assert list(ours.config_values.items()) == list(theirs.config_values.items())
    assert list(SessionState(page).config_values) == list(theirs.config_values)
    assert list(ours.components) == list(theirs.components)


def test_updates_land_in_the_configuration_as_in_gradio(page):
    ours, theirs = SessionState(page), gradio_session(page)
    textbox = next(k for k, b in page.blocks.items() if type(b).__name__ == "Textbox")
    for state in (ours, theirs):
        state._update_value_in_config(textbox, "typed by a visitor")
    assert ours.config_values[textbox] == theirs.config_values[textbox]
    assert ours.config_values[textbox]["props"]["value"] == "typed by a visitor"
    assert list(ours.components) == list(theirs.components)


def test_an_unknown_block_is_still_missing(page):
    state = SessionState(page)
    assert -1 not in state.config_values
    with pytest.raises(KeyError):
        state.config_values[-1]
