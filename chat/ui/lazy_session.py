"""Make a new Gradio session cheap: configurations of the page's components are built when read.

Gradio 6.31 builds the configuration of every component on the page for each new session
(`SessionState.__init__`), on the event loop, before the session's first event can run. For this
app's ~150 components that is about 10 ms per new visitor on a 2-core machine, and a burst of 256
new visitors queues 1-3 s of it in front of every first token (measured on an H200 host, see
bench/). Only Gradio's deep links read those configurations, so they are built when first read.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterable, Iterator, KeysView, ValuesView
from typing import Any

import gradio
from gradio.state_holder import SessionState


class LazyBlockConfigs(dict):
    """`SessionState.config_values`, built one block at a time when first read."""

    def __init__(self, blocks_config: Any, block_ids: Iterable[int]) -> None:
        super().__init__()
        self._blocks_config = blocks_config
        self._order = list(block_ids)
        self._pending = set(self._order)

    def __missing__(self, key: int) -> dict:
        if key not in self._pending:
            raise KeyError(key)
        self._pending.discard(key)
        config = self._blocks_config.config_for_block(key, [], self._blocks_config.blocks[key])
        self[key] = config
        return config

    def __setitem__(self, key: int, config: dict) -> None:
        self._pending.discard(key)
        super().__setitem__(key, config)

    def __contains__(self, key: object) -> bool:
        return key in self._pending or super().__contains__(key)

    def _build_all(self) -> None:
        if self._pending:  # in the page's order, as Gradio builds them
            built = {key: self[key] for key in self._order}
            extra = {key: value for key, value in super().items() if key not in built}
            self.clear()
            self.update(built | extra)

    def items(self) -> ItemsView:  # type: ignore[override]
        self._build_all()
        return super().items()

    def keys(self) -> KeysView:  # type: ignore[override]
        self._build_all()
        return super().keys()

    def values(self) -> ValuesView:  # type: ignore[override]
        self._build_all()
        return super().values()

    def __iter__(self) -> Iterator[int]:
        self._build_all()
        return super().__iter__()

    def __len__(self) -> int:
        return super().__len__() + len(self._pending)


def _lazy_init(self: SessionState, blocks: gradio.Blocks) -> None:
    _original_init(self, _NoBlocks(blocks))
    self.config_values = LazyBlockConfigs(
        self.blocks_config, (k for k in self.blocks_config.blocks if k in blocks.blocks)
    )


class _NoBlocks:
    """A stand-in for the Blocks that lets the original __init__ run with nothing to build."""

    def __init__(self, blocks: gradio.Blocks) -> None:
        self.default_config = blocks.default_config
        self.blocks: dict[int, Any] = {}


_original_init = SessionState.__init__


def install() -> None:
    """Idempotent; called when the UI is built."""
    if SessionState.__init__ is not _lazy_init:
        SessionState.__init__ = _lazy_init  # type: ignore[method-assign]

