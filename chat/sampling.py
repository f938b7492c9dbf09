"""Sampling settings: one declarative table (`KNOBS`) drives every place a setting appears: the
engine's SamplingParams, the Chat and Compare sliders and their help, validation of values from the
browser, the API and share links, presets' ranges, and the Python client's flags.

A preset may narrow any knob's range and change its default (`sampling:` in its YAML file);
values from the browser or the API are checked against the preset's range, so a public demo can
cap, say, Max new tokens. Messages are written for the person who moved the slider.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace

from chat.errors import SettingsError


@dataclass(frozen=True)
class Knob:
    """One sampling setting: its slider, its plain-language help and its valid range."""

    name: str  # the SamplingParams field
    label: str
    help: str
    default: float
    minimum: float
    maximum: float
    step: float
    integer: bool = False
    unset: float | None = None  # the value that means "not set", given to the engine as None

    @property
    def flag(self) -> str:
        """The client's command-line flag for it."""
        return "--" + self.name.replace("_", "-")

    @property
    def kind(self) -> type:
        return int if self.integer else float

    def engine_value(self, value: float | int) -> float | int | None:
        """The value as vLLM's SamplingParams takes it."""
        return None if self.unset is not None and value == self.unset else value

    def with_range(self, default: float, minimum: float, maximum: float) -> Knob:
        return replace(self, default=default, minimum=minimum, maximum=maximum)

    def format(self, value: float) -> str:
        return f"{int(value)}" if self.integer else f"{value:g}"

    def check(self, value: object) -> float | int:
        """Return the value as this knob's type, or raise SettingsError saying what is allowed."""
        allowed = f"{self.label} must be a {'whole ' if self.integer else ''}number from {self.format(self.minimum)} to {self.format(self.maximum)}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SettingsError(f"{allowed}; it was {_shown(value)}.")
        if not math.isfinite(value) or not self.minimum <= value <= self.maximum:
            raise SettingsError(f"{allowed}; it was {_shown(value)}.")
        if self.integer:
            if value != int(value):
                raise SettingsError(f"{allowed}; it was {_shown(value)}.")
            return int(value)
        return float(value)


def _shown(value: object) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


# Hard ranges are what vLLM accepts (or what makes sense to offer); presets may narrow them.
KNOBS: tuple[Knob, ...] = (
    Knob(
        "temperature", "Temperature",
        "How adventurous the wording is: 0 always picks the most likely next word, higher values vary more.",
        0.7, 0.0, 2.0, 0.05,
    ),
    Knob(
        "top_p", "Top-p",
        "Only words among the most likely ones, whose chances add up to this share, are considered; lower is more focused.",
        0.9, 0.05, 1.0, 0.05,
    ),
    Knob(
        "top_k", "Top-k",
        "Only this many of the most likely next words are considered; 0 means no limit.",
        0, 0, 200, 1, integer=True,
    ),
    Knob(
        "max_tokens", "Max new tokens",
        "The reply stops after this many tokens (a token is about three quarters of a word).",
        256, 1, 4096, 1, integer=True,
    ),
    Knob(
        "repetition_penalty", "Repetition penalty",
        "Above 1 discourages repeating the same words; 1 leaves the model as it is.",
        1.0, 1.0, 2.0, 0.05,
    ),
    Knob(
        "seed", "Seed",
        "The same seed, settings and conversation give the same reply; -1 picks a new one every time.",
        -1, -1, 2**31 - 1, 1, integer=True, unset=-1,
    ),
)
KNOB_NAMES: tuple[str, ...] = tuple(knob.name for knob in KNOBS)


@dataclass(frozen=True)
class Sampling:
    """The exact values one reply was written with (one field per knob of KNOBS, in order)."""

    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    repetition_penalty: float
    seed: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass(frozen=True)
class SamplingRules:
    """The knobs as one preset offers them: ranges and defaults."""

    knobs: tuple[Knob, ...] = KNOBS

    def knob(self, name: str) -> Knob:
        for knob in self.knobs:
            if knob.name == name:
                return knob
        raise KeyError(name)

    @property
    def defaults(self) -> Sampling:
        return _sampling({knob.name: knob.check(knob.default) for knob in self.knobs})

    def resolve(self, values: Mapping[str, object]) -> Sampling:
        """Validate values from a slider, the API or a link; missing ones take the defaults."""
        unknown = sorted(set(values) - set(KNOB_NAMES))
        if unknown:
            raise SettingsError(
                f"Unknown setting {unknown[0]!r}; the settings are {', '.join(KNOB_NAMES)}."
            )
        chosen = {
            knob.name: knob.check(values[knob.name] if values.get(knob.name) is not None else knob.default)
            for knob in self.knobs
        }
        return _sampling(chosen)

    def carried_over(self, previous: SamplingRules, values: Mapping[str, object],
                     name: str) -> tuple[dict[str, float | int], list[str]]:
        """Slider values after switching to these rules (preset `name`) from `previous`: a value the
        person changed (it differs from the previous default) stays where it fits, or moves to the
        nearest limit with a sentence saying so; one left alone takes this preset's default."""
        kept: dict[str, float | int] = {}
        notes = []
        for knob in self.knobs:
            value = values.get(knob.name)
            before = next((k for k in previous.knobs if k.name == knob.name), None)
            changed = (before is not None and isinstance(value, int | float) and not isinstance(value, bool)
                       and math.isfinite(value) and value != before.default)
            if not changed:
                kept[knob.name] = knob.kind(knob.default)
                continue
            assert isinstance(value, int | float)
            fitted = min(max(value, knob.minimum), knob.maximum)
            if knob.integer:
                fitted = round(fitted)
            kept[knob.name] = knob.kind(fitted)
            if fitted != value:
                limit = "most" if value > knob.maximum else "least"
                notes.append(f"{knob.label} {knob.format(value)} is outside what {name} allows, so it is now "
                             f"{knob.format(fitted)}, the {limit} it allows.")
        return kept, notes

    def narrowed(self, overrides: Mapping[str, tuple[float | None, float | None, float | None]]) -> SamplingRules:
        """Apply a preset's (default, min, max) per knob; None keeps the table's value.

        Raises SettingsError when the preset asks for values outside what the knob allows.
        """
        knobs = []
        for knob in self.knobs:
            if knob.name not in overrides:
                knobs.append(knob)
                continue
            default, minimum, maximum = overrides[knob.name]
            minimum = knob.minimum if minimum is None else knob.check(minimum)
            maximum = knob.maximum if maximum is None else knob.check(maximum)
            if minimum > maximum:
                raise SettingsError(f"{knob.label}: min {knob.format(minimum)} is above max {knob.format(maximum)}.")
            if default is None:
                default = min(max(knob.default, minimum), maximum)
            narrowed = knob.with_range(knob.default, minimum, maximum)
            knobs.append(narrowed.with_range(narrowed.check(default), minimum, maximum))
        return SamplingRules(tuple(knobs))


def _sampling(values: Mapping[str, float | int]) -> Sampling:
    return Sampling(**{knob.name: knob.kind(values[knob.name]) for knob in KNOBS})


if tuple(f.name for f in fields(Sampling)) != KNOB_NAMES:  # the dataclass and the table must not drift
    raise RuntimeError("chat.sampling: Sampling's fields must be the knobs of KNOBS, in order")
