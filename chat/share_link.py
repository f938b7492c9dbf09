"""Share links: a comparison's setup (presets, each one's exact settings, the prompt) as a URL query.

Only preset names travel, and per preset only the settings that differ from its defaults; opening a
link checks every value against the preset's ranges, as values from the browser are.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from chat.compare import MAX_COLUMNS, MIN_COLUMNS
from chat.errors import InputError, SettingsError
from chat.presets import Preset
from chat.sampling import Sampling, SamplingRules

LINK_PROMPT_CHARS = 2000  # a longer prompt is left out of a link (browsers cut long addresses)


@dataclass(frozen=True)
class LinkSetup:
    """What a share link reproduces: presets in order, each one's exact settings, the prompt."""

    presets: tuple[str, ...]
    sampling: tuple[Sampling, ...]
    prompt: str = ""
    blind: bool = False


def encode_link(presets: Sequence[Preset], sampling: Sequence[Sampling], prompt: str = "", blind: bool = False) -> str:
    """The query part of a share link, "?p=...&p=...&s1=temperature:0.2,max_tokens:64&q=...".

    Only preset names travel, and per preset only the settings that differ from its defaults.
    A prompt longer than LINK_PROMPT_CHARS is left out.
    """
    pairs = [("p", preset.name) for preset in presets]
    for index, (preset, values) in enumerate(zip(presets, sampling, strict=True), 1):
        changed = _overrides(preset.sampling, values)
        if changed:
            pairs.append((f"s{index}", ",".join(f"{name}:{value}" for name, value in changed.items())))
    if blind:
        pairs.append(("blind", "1"))
    if prompt and len(prompt) <= LINK_PROMPT_CHARS:
        pairs.append(("q", prompt))
    return "?" + urlencode(pairs, quote_via=quote, safe=":,()")


def _overrides(rules: SamplingRules, values: Sampling) -> dict[str, str]:
    defaults = rules.defaults
    changed = {}
    for knob in rules.knobs:
        value = getattr(values, knob.name)
        if value != getattr(defaults, knob.name):
            changed[knob.name] = str(int(value)) if knob.integer or float(value).is_integer() else repr(float(value))
    return changed


def decode_link(query: Iterable[tuple[str, str]], lookup: Callable[[str], Preset]) -> LinkSetup | None:
    """The setup a link's query describes, None when it describes none.

    `lookup` finds a usable preset by name (raising PresetError); every value is checked against
    that preset's ranges. Raises InputError, PresetError or SettingsError with a plain sentence.
    """
    pairs = list(query)
    names = [value for key, value in pairs if key == "p"]
    if not names:
        return None
    if not MIN_COLUMNS <= len(names) <= MAX_COLUMNS:
        raise InputError(f"A comparison link names two to four presets; this one names {len(names)}.")
    if len(set(names)) != len(names):
        raise InputError("This comparison link names a preset twice.")
    presets = [lookup(name) for name in names]
    settings = {key: value for key, value in pairs if re.fullmatch(r"s\d+", key)}
    for key in settings:
        if not 1 <= int(key[1:]) <= len(presets):
            raise SettingsError(f"This link has settings {key} but names only {len(presets)} presets.")
    sampling = []
    for index, preset in enumerate(presets, 1):
        try:
            sampling.append(preset.sampling.resolve(_parse_overrides(settings.get(f"s{index}", ""))))
        except SettingsError as exc:
            raise SettingsError(f"{preset.name}: {exc.message}") from None
    prompts = [value for key, value in pairs if key == "q"]
    prompt = prompts[-1] if prompts else ""
    if len(prompt) > LINK_PROMPT_CHARS:
        raise InputError(f"The prompt in this link is {len(prompt):,} characters; a link may carry {LINK_PROMPT_CHARS:,}.")
    blind = any(key == "blind" and value.lower() in ("1", "true", "yes") for key, value in pairs)
    return LinkSetup(tuple(p.name for p in presets), tuple(sampling), prompt, blind)


def _parse_overrides(text: str) -> dict[str, object]:
    values: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, colon, raw = item.partition(":")
        if not colon:
            raise SettingsError(f"{item!r} in the link is not a setting; write name:value, e.g. temperature:0.2.")
        values[name.strip()] = _number_of(raw.strip())
    return values


def _number_of(raw: str) -> object:
    """An int or float when the text is one; otherwise the text, which the knob's check then refuses."""
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            continue
    return raw
