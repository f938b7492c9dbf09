"""Gradio inputs that hand their values to the chat function unchecked.

Gradio's own checks answer API callers "Value 9 is greater than maximum value 2.0" without naming
the setting, and log a traceback for a preset name that is not in the list; the reply pipeline
says which setting or preset and what is allowed, in the chat, in one sentence.
The browser draws each as the component it extends (`drawn_as_base`, chat/ui/gradio_internals.py).
(Gradio writes a typing stub, components.pyi, next to this file on import; it is git-ignored.)
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from chat.ui.gradio_internals import drawn_as_base


@drawn_as_base
class PlainSlider(gr.Slider):
    def preprocess(self, payload: Any) -> Any:
        return payload


@drawn_as_base
class PlainNumber(gr.Number):
    def preprocess(self, payload: Any) -> Any:
        return payload


@drawn_as_base
class PlainDropdown(gr.Dropdown):
    def preprocess(self, payload: Any) -> Any:
        return payload
