"""The browser UI: a streaming chat, presets, sampling sliders, and stats beneath every reply.

Each reply is two messages in one bubble: the model's text, then an annotation whose title is the
stats line (visible without clicking; the details open beneath it). Annotations carry a metadata
title, which is how `chat.history` knows never to send them back to the model.
"""

from __future__ import annotations

import contextlib
import html
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import gradio as gr

from chat.components import PlainNumber, PlainSlider
from chat.errors import UNEXPECTED_ERROR, ChatError
from chat.history import to_model_messages
from chat.presets import Preset
from chat.sampling import KNOB_NAMES, Knob
from chat.service import ChatService
from chat.stats import ReplyStats
from chat.stream import Reply, paced

log = logging.getLogger(__name__)

STATS = "📊"
WAITING = "⏳"
PROBLEM = "⚠️"


def annotation(title: str, body: str = "", pending: bool = False) -> gr.ChatMessage:
    return gr.ChatMessage(
        role="assistant",
        content=body,
        metadata={"title": title, "status": "pending" if pending else "done"},
    )


def reply_messages(reply: Reply | None, annotation_msg: gr.ChatMessage) -> list[gr.ChatMessage]:
    messages = []
    if reply is not None and reply.text:
        messages.append(gr.ChatMessage(role="assistant", content=reply.text))
    messages.append(annotation_msg)
    return messages


def stats_annotation(stats: ReplyStats, notice: str | None = None) -> gr.ChatMessage:
    title = f"{STATS} {stats.summary()}"
    if notice:
        title = f"{PROBLEM} {notice} · {stats.summary()}"
    return annotation(title, stats.details())


def preset_card(preset: Preset) -> str:
    hardware = preset.hardware
    needs = "runs on a CPU" if hardware.device == "cpu" else f"needs {hardware.gpus} GPU(s)"
    if hardware.min_gpu_memory_gb:
        needs += f" with at least {hardware.min_gpu_memory_gb:g} GB of memory each"
    engine_args = preset.non_default_engine_args()
    args = ", ".join(f"`{key}: {value}`" for key, value in engine_args.items()) or "vLLM's defaults"
    model = "SmolLM2-135M-Instruct (embedded)" if preset.model_kind == "embedded" else preset.model
    return (
        f"**{html.escape(preset.name)}**: {html.escape(preset.description)}\n\n"
        f"Model: `{model}` · {needs} · Engine: {args}"
    )


def knob_input(knob: Knob) -> gr.components.Component:
    if knob.name == "seed":
        return PlainNumber(
            value=knob.default, label=knob.label, info=knob.help, precision=0,
            minimum=knob.minimum, maximum=knob.maximum, elem_id=f"knob-{knob.name}",
        )
    return PlainSlider(
        minimum=knob.minimum, maximum=knob.maximum, value=knob.default, step=knob.step,
        label=knob.label, info=knob.help, elem_id=f"knob-{knob.name}",
    )


def build_ui(service: ChatService, *, concurrency_limit: int | None = None, flush_s: float = 0.04) -> gr.Blocks:
    default = service.preset(None)
    knobs = default.sampling.knobs
    assert tuple(k.name for k in knobs) == KNOB_NAMES

    async def respond(
        message: str,
        history: list[dict[str, Any]],
        preset_name: str,
        system_prompt: str,
        temperature: float,
        top_p: float,
        top_k: float,
        max_tokens: float,
        repetition_penalty: float,
        seed: float,
        request: gr.Request,
    ) -> AsyncIterator[list[gr.ChatMessage]]:
        submitted = time.monotonic()
        session = request.session_hash if request is not None else None
        values = dict(zip(KNOB_NAMES, (temperature, top_p, top_k, max_tokens, repetition_penalty, seed), strict=True))
        reply: Reply | None = None
        try:
            text = service.check_message(message)
            preset = service.preset(preset_name)
            preset.sampling.resolve(values)  # fail fast, before waiting for an engine
            async for status in service.engine_progress(preset):
                yield [annotation(f"{WAITING} {status}", pending=True)]
            engine = await service.engine(preset)
            messages = to_model_messages(history, text, system_prompt if system_prompt is not None else preset.system_prompt)
            reply = service.open_reply(engine, preset, messages, values, session=session, submitted_at=submitted)
            async with contextlib.aclosing(paced(reply, flush_s=flush_s)) as redraws:
                async for _ in redraws:
                    line = reply.progress.line(time.monotonic())
                    yield reply_messages(reply, annotation(f"{WAITING} {line}", pending=True))
            assert reply.stats is not None
            yield reply_messages(reply, stats_annotation(reply.stats, reply.notice))
        except ChatError as exc:
            yield reply_messages(reply, annotation(f"{PROBLEM} {exc.message}"))
        except Exception:
            log.exception("Unexpected error while replying")
            yield reply_messages(reply, annotation(f"{PROBLEM} {UNEXPECTED_ERROR}"))
        finally:
            if reply is not None:
                service.close_reply(session, reply)

    async def on_preset_change(name: str) -> list[Any]:
        preset = service.preset(name)
        updates: list[Any] = [preset_card(preset), preset.system_prompt]
        for knob in preset.sampling.knobs:
            updates.append(gr.update(minimum=knob.minimum, maximum=knob.maximum, value=knob.default))
        return updates

    async def warm_up(name: str) -> str:
        """Start loading the chosen preset's engine as soon as it is picked."""
        preset = service.preset(name)
        return service.registry.start(preset).status()

    async def engine_status(name: str) -> str:
        try:
            preset = service.preset(name)
        except ChatError as exc:
            return exc.message
        engine = service.registry.peek(preset)
        return f"Engine: {engine.status()}" if engine else "Engine: not loaded yet (it starts with the first message)"

    async def stop(request: gr.Request) -> None:
        service.stop(request.session_hash)

    presets = service.preset_names()
    unavailable = service.unavailable()
    with gr.Blocks(title="vLLM chat demo", fill_height=True) as demo:
        # The settings are built first so that ChatInterface finds them rendered (it would
        # otherwise put them in its own accordion); the sidebar shows them on the right.
        with gr.Sidebar(position="right", width=340, open=True, label="Settings"):
            preset_choice = gr.Dropdown(
                choices=presets, value=default.name, label="Preset", elem_id="preset",
                info="A model with its engine and sampling settings.",
            )
            card = gr.Markdown(preset_card(default), elem_id="preset-card")
            if unavailable:
                with gr.Accordion(f"Unavailable here ({len(unavailable)})", open=False):
                    gr.Markdown("\n".join(f"- {html.escape(reason)}" for reason in unavailable.values()))
            system_prompt = gr.Textbox(
                value=default.system_prompt, label="System prompt", lines=2, elem_id="system-prompt",
                info="Instructions the model reads before the conversation.",
            )
            with gr.Accordion("Sampling settings", open=True):
                sliders = [knob_input(knob) for knob in knobs]
        gr.Markdown(f"## {html.escape(default.name)}\n{html.escape(default.description)}", elem_id="title")
        gr.ChatInterface(
            fn=respond,
            additional_inputs=[preset_choice, system_prompt, *sliders],
            chatbot=gr.Chatbot(elem_id="chatbot", label="Chat", scale=1, min_height=420),
            textbox=gr.Textbox(
                elem_id="message", placeholder="Type a message and press Enter", show_label=False,
                submit_btn=True, stop_btn=False, autofocus=True, scale=7,
            ),
            concurrency_limit=concurrency_limit,
            save_history=True,
            editable=True,
            examples=[[example] for example in default.examples] or None,
            fill_height=True,
            api_name="chat",
            validator=lambda message, *rest: gr.validate(bool(str(message).strip()), "Type a message first."),
        )
        with gr.Row():
            stop_button = gr.Button("Stop", variant="stop", elem_id="stop", scale=0, min_width=120)
            status = gr.Markdown("Engine: starting…", elem_id="engine-status")

        internal = {"queue": False, "api_visibility": "undocumented"}
        stop_button.click(stop, None, None, **internal)
        preset_choice.change(on_preset_change, [preset_choice], [card, system_prompt, *sliders], **internal).then(
            warm_up, [preset_choice], [status], **internal
        )
        gr.Timer(2.0).tick(engine_status, [preset_choice], [status], show_progress="hidden", **internal)
        demo.load(engine_status, [preset_choice], [status], **internal)
    return demo
