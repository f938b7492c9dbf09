"""Comparisons as a service, beside `ChatService`: what the Compare tab and the /compare API do with
a comparison, in one place and without Gradio.

    compare = CompareService(service)
    with compare.turn_of(session):                       # one turn at a time per session (Busy)
        comparison, jobs = compare.begin(comparison, picked, blind, prompt, settings, session)
        async for _ in compare.write(jobs):              # every column at once (chat.fanout)
            ...                                          # redraw
    compare.stop(session)                                # every column of that session

A prompt and its settings are checked here, once (`begin` raises ChatError with the sentence and
adds nothing); the record is `chat.compare`, votes go through `chat.ballot`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Iterator, Mapping, Sequence
from typing import Any

from chat.compare import ComparedReply, Comparison
from chat.errors import InputError
from chat.fanout import Job, write_all
from chat.presets import Preset
from chat.sampling import Sampling
from chat.service import ChatService, ReplyRequest, check_text


class Busy(InputError):
    """This session's comparison is still writing a turn."""

    def __init__(self) -> None:
        super().__init__("Wait until every column has finished, or stop them.")


class CompareService:
    def __init__(self, service: ChatService) -> None:
        self.service = service
        self.writing: set[str] = set()  # sessions whose turn is being written

    @contextlib.contextmanager
    def turn_of(self, session: str) -> Iterator[None]:
        """Hold the session's one turn at a time (taken at once, before any await: a second Send
        during the first is refused with `Busy`)."""
        if session in self.writing:
            raise Busy()
        self.writing.add(session)
        try:
            yield
        finally:
            self.writing.discard(session)

    def begin(self, comparison: Comparison | None, picked: Sequence[str], blind: bool, prompt: str,
              settings: Sequence[Mapping[str, Any]], session: str) -> tuple[Comparison, list[Job]]:
        """Add the prompt as a turn of `comparison` (or of a new one with the picked presets): one job
        per column, with that column's preset and settings (`settings[i]` for `picked[i]`; blind,
        `settings[0]` for every column, or they could be told apart). Raises ChatError with a
        sentence for the person (nothing is added then)."""
        text = check_text(prompt, "Your message", new_message=True)
        comparison = comparison or Comparison.start([self.service.preset(name) for name in picked], blind)
        presets = [self.service.preset(column.preset) for column in comparison.columns]
        if comparison.hides_stats:
            base = self.service.preset(picked[0]) if picked else presets[0]
            shared = base.sampling.resolve(settings[0] if settings else {}).as_dict()
            sampling = [preset.sampling.resolve(shared) for preset in presets]
        else:
            sampling = [sampling_of(preset, picked, settings) for preset in presets]
        turn = comparison.add_turn(text, sampling)
        now = time.monotonic()  # one moment for all columns: their first-token times compare
        return comparison, [self.job(comparison, entry, len(comparison.turns) - 1, session, now) for entry in turn.replies]

    def rerun(self, comparison: Comparison, turn: int | None, column: int, session: str) -> Job:
        """That turn's prompt (the latest when None) again in one column, with its preset and exact settings."""
        if not comparison.turns or not 0 <= column < len(comparison.columns):
            raise InputError("Send a prompt first; then each column can rerun it.")
        index = len(comparison.turns) - 1 if turn is None else int(turn)
        entry = comparison.add_rerun(index, column)
        return self.job(comparison, entry, index, session, time.monotonic())

    def job(self, comparison: Comparison, entry: ComparedReply, turn: int, session: str, submitted_at: float) -> Job:
        """The request that writes one column's reply to a turn, with that column's preset and settings."""
        column = comparison.columns[entry.column]
        return Job(entry, ReplyRequest(
            comparison.turns[turn].prompt, comparison.history(entry.column, turn), preset=column.preset,
            system_prompt=column.system_prompt, sampling=entry.sampling, stop_key=stop_key(session),
            submitted_at=submitted_at,
        ))

    def write(self, jobs: Sequence[Job], every_s: float = 0.0) -> AsyncGenerator[None, None]:
        """Write every job's reply at once, yielding whenever the view should be redrawn (chat.fanout)."""
        return write_all(self.service, jobs, every_s)

    def stop(self, session: str) -> None:
        """Stop every column of this session's comparison (not its Chat tab's reply)."""
        self.service.stop(stop_key(session))


def sampling_of(preset: Preset, picked: Sequence[str], settings: Sequence[Mapping[str, Any]]) -> Sampling:
    """A picked preset's settings (those of its slot), checked against its ranges."""
    if preset.name not in picked:
        raise InputError(f"{preset.name} is not among the picked presets; press New comparison to change them.")
    slot = list(picked).index(preset.name)
    return preset.sampling.resolve(settings[slot] if slot < len(settings) else {})


def stop_key(session: str) -> str:
    return f"compare:{session}"
