"""Gradio inputs that hand their values to the chat function unchecked.

Gradio's own checks answer API callers "Value 9 is greater than maximum value 2.0" without naming
the setting, and log a traceback for a preset name that is not in the list; the reply pipeline
says which setting or preset and what is allowed, in the chat, in one sentence.
(Gradio writes a typing stub, components.pyi, next to this file on import; it is git-ignored.)
"""

from __future__ import annotations

from typing import Any

import gradio as gr


class PlainSlider(gr.Slider):
    is_template = True  # the browser renders it as a plain Slider

    def preprocess(self, payload: Any) -> Any:
        return payload


class PlainNumber(gr.Number):
    is_template = True

    def preprocess(self, payload: Any) -> Any:
        return payload


class PlainDropdown(gr.Dropdown):
    is_template = True

    def preprocess(self, payload: Any) -> Any:
        return payload
