"""`registry`, `engine` and `service` on the stand-in engine (tests/stand_in.py), for a test module
whose subject is not the engine: importing them into the module replaces conftest's, which run the
real one, for that module's tests only.

    from tests.stand_in_fixtures import engine, registry, service  # noqa: F401 - fixtures

Import all three: conftest's session-scoped `engine` and `service` take whichever `registry` the
first module to ask for them names, so a module that replaced `registry` alone would put them on
the stand-in for every later module too.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", name="registry")
def registry(stand_in_registry):
    return stand_in_registry


@pytest.fixture(scope="session", name="engine")
async def engine(stand_in_registry, default_preset):
    return await stand_in_registry.get(default_preset)


@pytest.fixture(scope="session", name="service")
def service(stand_in_registry, default_preset):
    from chat.presets import load_presets
    from chat.service import ChatService

    return ChatService(load_presets(), stand_in_registry, default_preset.name)
