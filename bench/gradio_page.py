"""A Gradio page as its browser front end knows it: the components and events of its `/config`,
and the values its events send back (Gradio's streaming diffs, chat messages). bench/gradio_browser.py
replays the page's events with it."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import httpx

from chat.front_door import COOKIE as STICKY_COOKIE  # the app runs several UI workers (--ui-workers)


@dataclass(frozen=True)
class Event:
    """One dependency of the page's config."""

    id: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    queue: bool
    generator: bool
    after: int | None  # runs when this event ends (.then / .success / .failure)
    only_on_success: bool
    only_on_failure: bool
    backend: bool
    api_name: str | None
    # Where its page-side script (live.js's chatLive.begin) puts the id of the reply it begins over
    # the socket: the position of the input named `began`; None when it begins none.
    began: int | None = None


class Page:
    """The page's components and events, from its /config."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.types = {c["id"]: c["type"] for c in config["components"]}
        self.elem_ids = {c["props"].get("elem_id"): c["id"] for c in config["components"] if c["props"].get("elem_id")}
        self.initial: dict[int, Any] = {}
        for c in config["components"]:
            props = c["props"]
            if "value" in props:
                self.initial[c["id"]] = props["value"]
            elif "default_value" in props:  # BrowserState: kept in the browser's storage
                self.initial[c["id"]] = props["default_value"]
        self.sticky = False  # the app pins each browser to one of its UI workers by a cookie
        self.events: dict[int, Event] = {}
        self.listeners: dict[tuple[int, str], list[Event]] = defaultdict(list)
        self.followers: dict[int, list[Event]] = defaultdict(list)
        for d in config["dependencies"]:
            event = Event(d["id"], tuple(d["inputs"]), tuple(d["outputs"]), bool(d["queue"]),
                          bool(d["types"]["generator"]), d.get("trigger_after"), bool(d.get("trigger_only_on_success")),
                          bool(d.get("trigger_only_on_failure")), bool(d["backend_fn"]), d.get("api_name"),
                          self._began(d))
            self.events[event.id] = event
            if event.after is not None:
                self.followers[event.after].append(event)
            for target, name in d["targets"]:
                if target is not None:
                    self.listeners[(target, name)].append(event)

    def stateful(self, component: int) -> bool:
        return self.types.get(component) == "state"  # held by the server per session; the browser sends null

    def _began(self, dependency: dict[str, Any]) -> int | None:
        began = self.elem_ids.get("began")
        if "chatLive.begin" not in (dependency.get("js") or "") or began not in dependency["inputs"]:
            return None
        return list(dependency["inputs"]).index(began)

    def component(self, elem_id: str) -> int:
        if elem_id not in self.elem_ids:
            raise LookupError(f"the page has no component with elem_id {elem_id!r}")
        return self.elem_ids[elem_id]

    def api(self, name: str) -> Event:
        matches = [e for e in self.events.values() if e.api_name == name]
        if not matches:
            raise LookupError(f"the page has no event with api_name {name!r}")
        return matches[0]


async def load_page(http: httpx.AsyncClient, base_url: str) -> Page:
    response = await http.get(base_url.rstrip("/") + "/config")
    page = Page(response.json())
    page.sticky = STICKY_COOKIE in response.cookies
    return page


def patch(target: Any, diff: list[Any]) -> Any:
    """Gradio's streaming diff applied in place (gradio_client's apply_diff deep-copies the whole
    value first, which would make this client's work per update grow with the conversation)."""
    for action, path, value in diff:
        if not path:
            target = value if action == "replace" else target + value
            continue
        parent = target
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        if action == "replace":
            parent[key] = value
        elif action == "append":
            parent[key] += value
        elif action == "add" and isinstance(parent, list):
            parent.insert(int(key), value)
        elif action == "add":
            parent[key] = value
        elif action == "delete":
            del parent[int(key) if isinstance(parent, list) else key]
        else:
            raise ValueError(f"unknown diff action {action!r}")
    return target


def message_text(message: dict[str, Any]) -> str:
    """A chat message's text, whether its content is a string or Gradio's list of parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    if isinstance(content, dict):
        return content.get("text") or ""
    return ""


def reply_text(messages: Any) -> str:
    """The reply's own text: assistant messages after the last user message, without titled
    (metadata) annotations such as stats or status lines."""
    if not isinstance(messages, list):
        return ""
    parts = []
    for m in reversed(messages):  # from the end: the work stays the reply's size in a long chat
        if not isinstance(m, dict) or m.get("role") == "user":
            break
        if m.get("role") == "assistant" and not (m.get("metadata") or {}).get("title"):
            parts.append(message_text(m))
    return "".join(reversed(parts))
