"""Imports point down the layers (docs/architecture.md "The layers"): a process's top puts the parts together,
the web page's package uses the services, the services use the engine, and only the engine layer
speaks vLLM. Read from the source (every import, those inside functions too), not by importing it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

ROOTS = {"chat.server", "chat.supervisor"}  # a process's top: a UI worker, the app with several
ENGINE = {"chat.engine", "chat.engine_core", "chat.engine_load", "chat.engine_args", "chat.engine_vllm"}
# What the engine layer may use besides itself: data and checks that know nothing of serving.
BENEATH_ENGINE = {"chat", "chat.errors", "chat.presets", "chat.models", "chat.sampling", "chat.cpu"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_by(source: str) -> set[str]:
    """The modules a source imports, those inside functions too (absolute names; `from a import b`
    gives a and a.b, since b may be a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def imports() -> dict[str, set[str]]:
    """Each module of chat/ -> the modules it imports."""
    return {module_name(path): imported_by(path.read_text()) for path in sorted((ROOT / "chat").rglob("*.py"))}


def under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_only_a_process_top_and_the_page_itself_import_the_page():
    wrong = {m: sorted(n for n in names if under(n, "chat.ui"))
             for m, names in imports().items() if not under(m, "chat.ui") and m not in ROOTS}
    assert not {m: n for m, n in wrong.items() if n}, wrong


def test_nothing_but_the_top_imports_the_top():
    wrong = {m: sorted(n for n in names if any(under(n, r) for r in ROOTS))
             for m, names in imports().items() if m not in ROOTS}
    assert not {m: n for m, n in wrong.items() if n}


def test_gradio_is_imported_in_the_page_package_only():
    wrong = [m for m, names in imports().items()
             if not under(m, "chat.ui") and any(under(n, "gradio") for n in names)]
    assert not wrong, wrong


def test_vllm_is_spoken_by_the_engine_layer_only_and_it_uses_nothing_above_it():
    found = imports()
    speaking = sorted(m for m, names in found.items() if any(under(n, "vllm") for n in names))
    assert speaking and set(speaking) <= ENGINE, speaking
    allowed = ENGINE | BENEATH_ENGINE - {"chat"}
    above = {m: sorted(n for n in names if under(n, "chat") and n != "chat" and not any(under(n, a) for a in allowed))
             for m, names in found.items() if m in ENGINE}
    assert not {m: n for m, n in above.items() if n}, above


def test_the_compare_api_does_not_import_the_compare_tab():
    """The tab is made only in pages that open it (chat/ui/lazy.py); the API is made with every page."""
    assert not any(under(n, "chat.ui.compare_tab") for n in imports()["chat.ui.compare_api"])


def test_the_rules_read_imports_inside_functions_and_from_a_package():
    """The kind of import that hid chat/auth.py's use of the page (inside a method), and `from chat import cpu`."""
    source = "from chat import cpu\n\ndef f():\n    from chat.ui.gradio_internals import login_token\n"
    assert {"chat.cpu", "chat.ui.gradio_internals"} <= imported_by(source)
