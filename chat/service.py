"""What the UI and the API share: presets by name, engines, and the replies in flight.

Nothing from a browser or API client names a file, a model or an engine argument: they pick a
preset by name and send sampling values, which are checked against that preset's ranges.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field

from chat.engine import Engine, EngineRegistry, EngineState
from chat.errors import InputError, PresetError
from chat.history import Message
from chat.presets import Preset, PresetCatalog
from chat.stream import Reply

MAX_MESSAGE_CHARS = 100_000  # far beyond any context window here; stops megabyte pastes early


@dataclass
class ChatService:
    catalog: PresetCatalog
    registry: EngineRegistry
    default_preset: str
    has_gpu: bool = False
    _replies: dict[str, Reply] = field(default_factory=dict)  # session -> its reply in flight
    _preparing: set[str] = field(default_factory=set)  # sessions whose reply is not streaming yet
    _stopped_early: set[str] = field(default_factory=set)  # ... and whose reader already pressed Stop

    def preset(self, name: str | None) -> Preset:
        """A preset this machine can run, by name; PresetError says why not otherwise."""
        preset = self.catalog.get(name or self.default_preset)
        if preset.needs_gpu and not self.has_gpu:
            raise PresetError(self.catalog.unusable(has_gpu=False)[preset.name])
        return preset

    def preset_names(self) -> list[str]:
        """Usable presets, the default first."""
        names = list(self.catalog.usable(self.has_gpu))
        default = self.preset(None).name
        return [default] + [name for name in names if name != default]

    def unavailable(self) -> dict[str, str]:
        return self.catalog.unusable(self.has_gpu)

    def check_message(self, message: object, system_prompt: object = "") -> str:
        """The message as it will be sent, or InputError saying what to change."""
        if not isinstance(message, str) or not message.strip():
            raise InputError("Type a message first.")
        if len(message) > MAX_MESSAGE_CHARS:
            raise InputError(
                f"Your message is {len(message):,} characters; the limit is {MAX_MESSAGE_CHARS:,}. "
                "Shorten it and send it again."
            )
        if not isinstance(system_prompt, str | None):
            raise InputError("The system prompt must be text.")
        if system_prompt and len(system_prompt) > MAX_MESSAGE_CHARS:
            raise InputError(
                f"The system prompt is {len(system_prompt):,} characters; the limit is {MAX_MESSAGE_CHARS:,}. "
                "Shorten it and send your message again."
            )
        return message

    async def engine_progress(self, preset: Preset, every_s: float = 1.0) -> AsyncIterator[str]:
        """Yield a status line every `every_s` while the preset's engine starts; return when ready.

        Raises EngineError when it cannot start.
        """
        engine = self.registry.start(preset)
        while engine.state is EngineState.STARTING:
            yield engine.status()
            try:
                await asyncio.wait_for(engine.wait_ready(), timeout=every_s)
            except TimeoutError:
                continue
        await engine.wait_ready()

    async def engine(self, preset: Preset) -> Engine:
        return await self.registry.get(preset)

    def open_reply(
        self,
        engine: Engine,
        preset: Preset,
        messages: list[Message],
        sampling_values: Mapping[str, object],
        *,
        session: str | None = None,
        submitted_at: float | None = None,
    ) -> Reply:
        now = time.monotonic()
        reply = Reply(
            engine,
            preset,
            messages,
            preset.sampling.resolve(sampling_values),
            submitted_at=now,
            # Time spent waiting for the engine to start is reported apart from time to first token.
            engine_wait_s=0.0 if submitted_at is None else max(now - submitted_at, 0.0),
        )
        if session:
            self._replies[session] = reply
            self._preparing.discard(session)
            if session in self._stopped_early:
                self._stopped_early.discard(session)
                reply.stop()
        return reply

    def preparing(self, session: str | None) -> None:
        """A reply for this session is on its way (waiting for an engine, say): Stop applies to it."""
        if session:
            self._preparing.add(session)
            self._stopped_early.discard(session)

    def close_reply(self, session: str | None, reply: Reply | None) -> None:
        if session:
            self._preparing.discard(session)
            self._stopped_early.discard(session)
            if reply is not None and self._replies.get(session) is reply:
                del self._replies[session]

    def stop_requested(self, session: str | None) -> bool:
        return bool(session) and session in self._stopped_early

    def stop(self, session: str | None) -> bool:
        """Stop the session's reply in flight or on its way; False when there is none."""
        reply = self._replies.get(session or "")
        if reply is not None:
            reply.stop()
            return True
        if session in self._preparing:
            self._stopped_early.add(session)
            return True
        return False
