"""The Chat tab: a streaming chat, presets, sampling sliders, and stats beneath every reply."""

from __future__ import annotations

import contextlib
import html
import inspect
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from chat import live
from chat.errors import ChatError
from chat.history import text_of
from chat.live import ReplyStore
from chat.presets import Preset
from chat.sampling import KNOB_NAMES, KNOBS, Knob
from chat.service import ChatService, ReplyRequest
from chat.stats import READING
from chat.ui.components import PlainDropdown, PlainNumber, PlainSlider
from chat.ui.gradio_internals import ChatParts, as_saved, chat_parts, with_parameters
from chat.ui.live_script import is_browser, page_id
from chat.ui.messages import conversation_file, event_messages, live_messages
from chat.ui.preset_card import preset_card
from chat.voters import visitor_of

log = logging.getLogger(__name__)

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


@dataclass
class Settings:
    """The sidebar's inputs, in the order the chat function takes them."""

    preset: PlainDropdown
    card: gr.Markdown
    system_prompt: gr.Textbox
    knobs: list[gr.components.Component]

    @property
    def inputs(self) -> list[gr.components.Component]:
        return [self.preset, self.system_prompt, *self.knobs]


def settings_panel(service: ChatService) -> Settings:
    """Preset, its card, the system prompt and the sampling settings: beside the chat on a wide
    screen; on a phone, a panel that the Settings button opens over the chat and Done closes."""
    default = service.preset(None)
    unavailable = service.unavailable()
    with gr.Column(scale=1, min_width=300, elem_id="chat-settings"):
        with gr.Row(elem_id="settings-header"):
            gr.Markdown("### Settings")
            gr.Button("Done", size="sm", scale=0, min_width=80, elem_id="settings-done").click(
                None, js=TOGGLE_SETTINGS, queue=False, api_visibility="private"
            )
        preset = PlainDropdown(
            choices=service.preset_names(), value=default.name, label="Preset", elem_id="preset",
            info="A model with its engine and sampling settings.",
        )
        card = gr.Markdown(preset_card(default), elem_id="preset-card")
        if unavailable:
            with gr.Accordion(f"Unavailable here ({len(unavailable)})", open=False):
                gr.Markdown("\n".join(f"- {html.escape(reason)}".replace("\n", "<br>") for reason in unavailable.values()))
        system_prompt = gr.Textbox(
            value=default.system_prompt, label="System prompt", lines=2, elem_id="system-prompt",
            info="Instructions the model reads before the conversation.",
        )
        with gr.Accordion("Sampling settings", open=True):
            knobs = [knob_input(knob) for knob in default.sampling.knobs]
    return Settings(preset, card, system_prompt, knobs)


# The page's script that keeps the engine line beneath the chat current (in the page's head).
ENGINE_LINE_SCRIPT = f"<script>{Path(__file__).with_name('engine_line.js').read_text(encoding='utf-8')}</script>"
TOGGLE_SETTINGS = "() => document.querySelector('#chat-settings').classList.toggle('open')"
DOWNLOAD_SAVED = """async () => {
  for (let frame = 0; frame < 300; frame++) {
    const link = document.querySelector('#saved-file a[download]');
    if (link) return link.click();
    await new Promise(requestAnimationFrame);
  }
}"""


def chat_tab(service: ChatService, logs: ReplyStore) -> None:
    """The chat with its settings; Stop, the engine's load and Save beneath the chat."""
    with gr.Row(equal_height=False, elem_id="chat-layout"):
        settings = settings_panel(service)  # first, so the chat finds its inputs rendered (CSS puts it right)
        with gr.Column(scale=3, min_width=300, elem_id="chat-main"):
            chat_column(service, logs, settings)


def chat_column(service: ChatService, logs: ReplyStore, settings: Settings) -> None:
    """The chat: its title, the conversation, the message box, and Stop, Save and the engine line."""
    default = service.preset(None)
    assert tuple(k.name for k in default.sampling.knobs) == KNOB_NAMES
    with gr.Row(elem_id="chat-header"):
        title = gr.Markdown(title_of(default), elem_id="title")
        gr.Button("⚙ Settings", size="sm", scale=0, min_width=110, elem_id="settings-open").click(
            None, js=TOGGLE_SETTINGS, queue=False, api_visibility="private"
        )
    # No "share" button: it posts to Hugging Face Spaces discussions (not where this demo runs), and
    # Gradio renders it without a name for screen readers.
    chatbot = gr.Chatbot(elem_id="chatbot", label="Chat", scale=1, min_height=420, render=False,
                         buttons=["copy", "copy_all"])
    validator = lambda message, *rest: gr.validate(bool(str(message).strip()), "Type a message first.")  # noqa: E731
    respond = replies(service, logs)
    chat = gr.ChatInterface(
        fn=respond,
        additional_inputs=settings.inputs,
        chatbot=chatbot,
        # Its own message box stays hidden: a typed message takes `turn` below. ChatInterface still
        # runs examples, retry, edit, undo, the saved chats and the /chat API.
        textbox=gr.Textbox(visible=False, stop_btn=False),
        concurrency_limit=None,  # the service admits replies (--concurrency-limit), for every tab and the API alike
        save_history=True,
        editable=True,
        examples=[[example] for example in default.examples] or None,
        fill_height=True,
        api_name="chat",
        validator=validator,
    )
    # ChatInterface turns one typed message into eleven events, several sending the whole chat both
    # ways (bench/frontend.py measured about 60 ms of the server's time per message on 2 cores, which
    # a burst of visitors waits for in line). Here it is one queued event, then saving the chat.
    textbox = gr.Textbox(
        elem_id="message", placeholder="Type a message and press Enter", show_label=False,
        submit_btn=True, autofocus=True,
    )
    parts = chat_parts(chat, new_chat_id="new-chat", saved_list_id="saved-chats", column_id="chat-history")  # for the phone's CSS
    # The page starts the reply over its socket as it sends the turn, which then follows it by its
    # id (chat/live.py).
    began = gr.Textbox(visible=False, elem_id="began")  # the id of the reply the page started
    asked = [textbox, chatbot, *settings.inputs, began]
    inputs = [*asked, parts.conversation_id, parts.saved]  # and where the turn saves the chat
    begin = (
        f"(...values) => window.chatLive ? [...window.chatLive.begin(values.slice(0, {len(asked)}), {json.dumps(KNOB_NAMES)}),"
        f" ...values.slice({len(asked)}, {len(inputs)})] : values.slice(0, {len(inputs)})")
    # Which saved chat the page shows, kept in the browser so that a reload reopens it (none after New chat).
    shown = gr.BrowserState({"index": None}, storage_key="chat_shown_conversation")
    turn = textbox.submit(
        typed_turn(service, logs, chatbot, parts.save), inputs,
        [textbox, chatbot, parts.history, parts.conversation_id, parts.saved, shown], js=begin,
        concurrency_limit=None, api_visibility="undocumented", show_progress="hidden",
        # The values as the page sent them: Gradio would hand each input to a worker thread to
        # "preprocess" it, for nothing here (the chat's messages already are role/content dicts).
        preprocess=False,
    )
    # The box takes text again once the page counts the turn as over, not with the turn's last
    # update: until the page hears the turn is done it drops another Enter (Gradio's trigger_mode
    # "once"), and a message typed quickly would sit in the box unsent.
    # The page's script holds the box while a retry's or an edit's reply is written, not during a turn (live.js).
    turn.then(None, None, [textbox], js="() => { window.chatLive?.turnOver(); return {__type__: 'update', interactive: true}; }",
              queue=False, api_visibility="private")  # in the page only, as the Settings buttons
    status = chat_actions(service, logs, chatbot, textbox, began)
    reopen_where_left(chat, chatbot, parts, shown)
    switch_presets(service, settings, title, status, chatbot if default.examples else None)


def replies(service: ChatService, logs: ReplyStore) -> Callable[..., AsyncIterator[list[gr.ChatMessage]]]:
    """The ChatInterface's function (and the /chat API's): one reply to a message, as chat messages.
    A page gets the text live (chat/live.py) and Gradio's redraws once a second."""
    async def respond(
        message: str, history: list[dict[str, Any]], request: gr.Request, preset_name: str, system_prompt: str,
        *knob_values: float,
    ) -> AsyncIterator[list[gr.ChatMessage]]:
        # Gradio passes the request where the signature names it; only parameters before *args count.
        ask = reply_request(message, history, request, preset_name, system_prompt, knob_values)
        # Closed with this generator, not whenever the garbage collector gets to it: Gradio closes a
        # turn waiting between updates (its /cancel), and the reply would go on being written meanwhile.
        async with contextlib.aclosing(reply_messages(service, logs, ask, request)) as written:
            async for messages in written:
                yield messages

    name_knob_parameters(respond)
    return respond


def reply_request(message: str, history: list[dict[str, Any]], request: gr.Request, preset_name: str,
                  system_prompt: str, knob_values: tuple[float, ...] | list[float]) -> ReplyRequest:
    return ReplyRequest(
        message, history, preset=preset_name, system_prompt=system_prompt,
        sampling=dict(zip(KNOB_NAMES, knob_values, strict=True)), stop_key=stop_key(request), visitor=visitor_of(request),
    )


async def reply_messages(service: ChatService, logs: ReplyStore, ask: ReplyRequest, request: gr.Request,
                         began: str | None = None) -> AsyncGenerator[list[gr.ChatMessage], None]:
    """The reply as chat messages: the one the page started under the id `began`, or one of the turn's own."""
    async with contextlib.aclosing(live.turn_reply(service, logs, ask, visitor_of(request), began, is_browser(request))) as shown:
        async for event, live_id in shown:
            yield event_messages(event, live_id)


def typed_turn(service: ChatService, logs: ReplyStore, chatbot: gr.Chatbot,
               save: Callable[..., tuple[Any, Any]]) -> Callable[..., AsyncIterator[tuple[Any, ...]]]:
    async def turn(
        message: str, history: list[dict[str, Any]] | None, request: gr.Request, preset_name: str, system_prompt: str,
        *values: Any,
    ) -> AsyncIterator[tuple[Any, ...]]:
        """A message typed on the page, the whole turn in one queued event: the message box (shut
        while the reply is written), the chat, and at the end the server's copy of the chat, the
        chat saved in the browser, and which saved chat is shown. After the knobs come the id of the
        reply the page started for it (chat/live.py) or empty, the saved chat's index and the saved chats."""
        *knob_values, began, conversation_id, saved = values
        unchanged = (gr.skip(),) * 4
        if not str(message).strip():
            gr.Warning("Type a message first.")
            yield gr.skip(), *unchanged, gr.skip()
            return
        ask = reply_request(message, history or [], request, preset_name, system_prompt, knob_values)
        began = page_id(began)
        asked = [*(history or []), {"role": "user", "content": message}]
        # The page follows the reply by its id: its box goes on the page now, to be filled as the
        # text arrives over the socket, without waiting for Gradio to redraw the chat.
        begun = live_messages(began, "", READING) if began is not None else []
        yield gr.update(value="", interactive=False), [*asked, *begun], *unchanged
        reply: list[gr.ChatMessage] = []
        async with contextlib.aclosing(reply_messages(service, logs, ask, request, began)) as written:  # as `respond`
            async for reply in written:
                yield gr.skip(), [*asked, *reply], *unchanged
        done = [*asked, *reply]
        # The server's copy in the form the page sends back (what retry, undo and the saved chats read).
        copy = as_saved(chatbot, done)
        # Saved in the same update that ends the turn, not by an event after it: a New chat clicked
        # once the turn is over can no longer be overtaken by the save (which would reopen the old
        # chat on a reload, and send the next message into it).
        if not isinstance(saved, list) or not isinstance(conversation_id, int) or not 0 <= conversation_id < len(saved):
            conversation_id, saved = None, saved if isinstance(saved, list) else []  # saved anew, at the top
        conversation_id, saved = save(conversation_id, copy, saved)
        yield gr.skip(), done, copy, conversation_id, saved, {"index": conversation_id}

    name_knob_parameters(turn, then=["began", "conversation_id", "saved"])
    return turn


INTERNAL: dict[str, Any] = {"queue": False, "api_visibility": "undocumented"}


def chat_actions(service: ChatService, logs: ReplyStore, chatbot: gr.Chatbot, textbox: gr.Textbox,
                 began: gr.Textbox) -> gr.Markdown:
    """Stop and Save beneath the chat, Undo's message back in the box; returns the engine line."""
    async def stop(began: Any, request: gr.Request) -> None:  # async: stopping aborts on the server's event loop
        live.stop(service, logs, visitor_of(request), stop_key(request), page_id(began))

    with gr.Row(elem_id="chat-actions"):
        stop_button = gr.Button("Stop", variant="stop", elem_id="stop", scale=0, min_width=100, size="sm")
        save_button = gr.Button("Save conversation", elem_id="save", scale=0, min_width=170, size="sm")
    # Kept current by the page itself (engine_line.js asks /status), not by a Gradio timer.
    status = gr.Markdown("Engine: checking…", elem_id="engine-status")
    saved_file = gr.File(label="Conversation as Markdown", visible=False, elem_id="saved-file", interactive=False)
    # The page says which reply it started last (its turn's own, if it started one, has the session's key).
    stop_button.click(stop, [began], None, js="() => [window.chatLive ? window.chatLive.latest() : '']", **INTERNAL)
    # One click saves: the file is written, and the page follows its link as soon as it shows.
    save_button.click(
        lambda history: gr.File(value=conversation_file(history), visible=True), [chatbot], [saved_file], **INTERNAL
    ).then(None, js=DOWNLOAD_SAVED, **INTERNAL)
    # Undo puts the message back in the box to be changed and sent again (Gradio puts it into the
    # ChatInterface's own box, which is hidden here).
    chatbot.undo(undone_message, None, [textbox], **INTERNAL)
    return status


def switch_presets(service: ChatService, settings: Settings, title: gr.Markdown, status: gr.Markdown,
                   examples_of: gr.Chatbot | None) -> None:
    """A preset picked in the list: its card, ranges and (`examples_of` that chat) examples, and its
    engine started or woken at once. Gradio wires clicks on a chat's examples only when it starts
    with some, so presets' own examples replace each other only then."""
    async def on_preset_change(name: str, previous_name: str, system_prompt: str, *knob_values: Any) -> list[Any]:
        """The new preset's card and ranges; what the person changed in the settings stays (where
        it fits the new ranges: a sentence says what had to move), the rest take its defaults."""
        preset = service.preset(name)
        try:
            previous = service.preset(previous_name)
        except ChatError:
            previous = preset
        values = dict(zip([knob.name for knob in previous.sampling.knobs], knob_values, strict=False))
        kept, notes = preset.sampling.carried_over(previous.sampling, values, preset.name)
        card = preset_card(preset) + "".join(f"\n\n⚠️ {html.escape(note)}" for note in notes)
        prompt = system_prompt if system_prompt != previous.system_prompt else preset.system_prompt
        updates: list[Any] = [title_of(preset), card, prompt, preset.name]
        for knob in preset.sampling.knobs:
            updates.append(gr.update(minimum=knob.minimum, maximum=knob.maximum, value=kept[knob.name]))
        if examples_of is not None:
            updates.append(gr.update(examples=[{"text": example} for example in preset.examples] or None))
        return updates

    async def warm_up(name: str) -> str:
        """Start loading (or wake) the chosen preset's engine as soon as it is picked."""
        service.registry.prepare(service.preset(name))
        return service.engine_line(name)

    previous = gr.State(service.preset(None).name)  # the preset before a switch: which settings the person changed
    settings.preset.change(
        on_preset_change,
        [settings.preset, previous, settings.system_prompt, *settings.knobs],
        [title, settings.card, settings.system_prompt, previous, *settings.knobs, *([examples_of] if examples_of else [])],
        **INTERNAL,
    ).then(warm_up, [settings.preset], [status], **INTERNAL)


def reopen_where_left(chat: gr.ChatInterface, chatbot: gr.Chatbot, parts: ChatParts, shown: gr.BrowserState) -> None:
    """A reload puts the page back in the conversation it showed, with its stats: which saved chat
    that was is kept in the browser (`shown`, {"index": None} after New chat: the page stores no
    false value, 0 included) beside the saved chats themselves."""
    quiet = {"queue": False, "api_visibility": "private", "show_progress": "hidden"}

    # Every save (retry, edit, undo, an example; a typed turn says so itself) changes the saved
    # chats, and with them which one is shown; so do New chat and picking a saved chat, without saving.
    def follow_save(index: int | None, current: Any) -> Any:
        return gr.skip() if current == {"index": index} else {"index": index}

    parts.saved.change(follow_save, [parts.conversation_id, shown], [shown], **quiet)
    parts.new_chat.click(None, None, [shown], js="() => ({index: null})", **quiet)  # in the page, at once
    parts.saved_list.click(lambda index: {"index": index}, [parts.saved_list], [shown], **quiet)

    def reopen(shown: Any, saved: Any) -> tuple[Any, Any, Any]:
        index = shown.get("index") if isinstance(shown, dict) else None
        if not isinstance(index, int) or not isinstance(saved, list) or not 0 <= index < len(saved) or not saved[index]:
            return gr.skip(), gr.skip(), gr.skip()
        return index, saved[index], saved[index]

    chat.load(reopen, [shown, parts.saved], [parts.conversation_id, chatbot, parts.history], **quiet)


def undone_message(undone: gr.UndoData) -> str:
    """The message Undo took back (Gradio passes it where the parameter says gr.UndoData)."""
    return text_of(undone.value)


def name_knob_parameters(fn: Callable[..., Any], then: list[str] | None = None) -> None:
    """Give `fn(..., *values)` one named parameter per knob (and after them those named in `then`),
    as Gradio reads signatures: the API then takes `temperature=0.2` by name, and a gr.Request
    parameter keeps its position."""
    signature = inspect.signature(fn)
    fixed = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    knobs = [inspect.Parameter(knob.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=knob.kind) for knob in KNOBS]
    more = [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in then or []]
    with_parameters(fn, [*fixed, *knobs, *more])


def stop_key(request: gr.Request) -> str:
    """The Chat tab's Stop stops this browser session's chat reply (not its Compare columns), and only
    its visitor's: the session hash is the client's to choose, so a stranger who learnt it must not
    stop the reply with it."""
    return f"chat:{visitor_of(request)}:{request.session_hash}"


def title_of(preset: Preset) -> str:
    return f"## {html.escape(preset.name)}\n{html.escape(preset.description)}"
