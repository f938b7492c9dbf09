"""Part of item 1 of chat/ui/gradio_internals.py that must come before Gradio is imported (so
chat/ui/__init__.py imports this module first): Gradio's typing stubs, left unwritten.

As each component class is defined, Gradio's `ComponentMeta` calls `create_or_modify_pyi`, which
reads the class's source file, parses it, renders a template for each of its events and compares
the result with the stub (`.pyi`) beside it, writing it where it differs. Gradio defines ~40
components as it loads, so every process that imports Gradio paid it: about 1 s of CPU of the
~2.5 s of `import gradio` on a 2-core Xeon, in every UI worker's start and ~30 times in a run of the
tests, for stubs that only an editor reads. Gradio has no setting for it; a hook on the import
system makes the function a no-op as `gradio.component_meta` loads (afterwards is too late: the
components are defined while the package loads). Where Gradio was imported already, nothing changes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

MODULE = "gradio.component_meta"
FUNCTION = "create_or_modify_pyi"


def no_typing_stub(*args: Any) -> None:
    """In place of Gradio's `create_or_modify_pyi(component_class, class_name, events)`."""


class WithoutTypingStubs(importlib.abc.MetaPathFinder):
    """Finds `gradio.component_meta` as Python would, and replaces FUNCTION once it has loaded."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != MODULE:
            return None
        sys.meta_path.remove(self)  # once: Gradio loads it once per process
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            if hasattr(module, FUNCTION):  # tests/test_gradio_internals.py fails, naming it, where it is gone
                setattr(module, FUNCTION, no_typing_stub)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if "gradio" not in sys.modules:  # this module runs once per process: one hook at most
    sys.meta_path.insert(0, WithoutTypingStubs())
