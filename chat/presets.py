"""Presets: one YAML file per model configuration, validated into typed `Preset` objects.

A preset names a model, vLLM engine arguments (checked against vLLM's own `AsyncEngineArgs`),
sampling defaults and ranges, a system prompt and its hardware needs. Every problem is reported
with the file, the line where known, the key and a fix; one bad file never hides the good ones.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from chat.engine_args import check_engine_args
from chat.errors import PresetError, SettingsError
from chat.sampling import KNOB_NAMES, SamplingRules

EMBEDDED = "embedded"
DEFAULT_PRESETS_DIR = Path(__file__).resolve().parent.parent / "presets"
MAX_PRESET_BYTES = 64 * 1024
_HUB_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class KnobSetting(_Strict):
    default: float | None = None
    min: float | None = None
    max: float | None = None


class Hardware(_Strict):
    device: Literal["cpu", "gpu"] = "cpu"
    min_gpu_memory_gb: float | None = Field(default=None, gt=0)
    gpus: int = Field(default=1, ge=1)


class PresetFile(_Strict):
    """The schema of one YAML file; `Preset` is what the app uses."""

    name: str = Field(min_length=1, max_length=80)
    description: str = Field(min_length=1, max_length=600)
    model: str = Field(min_length=1)
    engine: dict[str, Any] = Field(default_factory=dict)
    sampling: dict[str, float | KnobSetting] = Field(default_factory=dict)
    system_prompt: str = ""
    hardware: Literal["cpu", "gpu"] | Hardware = "cpu"
    timeout_s: float | None = Field(default=None, gt=0)
    tags: list[str] = Field(default_factory=list)
    examples: list[str] = Field(default_factory=list)
    ignore_eos: bool = False  # for benchmarks: always write Max new tokens


ModelKind = Literal["embedded", "folder", "hub"]


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    model: str  # "embedded", an absolute folder, or a Hugging Face repo id
    model_kind: ModelKind
    engine: Mapping[str, Any]
    sampling: SamplingRules
    system_prompt: str
    hardware: Hardware
    timeout_s: float | None
    tags: tuple[str, ...]
    examples: tuple[str, ...]
    ignore_eos: bool = False
    path: Path | None = None

    @property
    def engine_key(self) -> str:
        """Presets with equal keys share one engine: they differ only in sampling and prompts."""
        return json.dumps({"model": self.model, "engine": dict(self.engine)}, sort_keys=True, default=str)

    @property
    def needs_gpu(self) -> bool:
        return self.hardware.device == "gpu"


@dataclass
class PresetCatalog:
    """Every preset found, by name, and the files that could not be used, with why."""

    presets: dict[str, Preset] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # file name -> message

    def usable(self, has_gpu: bool) -> dict[str, Preset]:
        """The presets this machine can run; the others are reported by `unusable`."""
        return {name: p for name, p in self.presets.items() if has_gpu or not p.needs_gpu}

    def unusable(self, has_gpu: bool) -> dict[str, str]:
        """Why each preset or file cannot be used here, by name (or file name for bad files)."""
        reasons = dict(self.problems)
        if not has_gpu:
            for name, preset in self.presets.items():
                if preset.needs_gpu:
                    reasons[name] = f"{name} needs an NVIDIA GPU; this machine has none."
        return reasons

    def runnable(self, name: object, default: str, has_gpu: bool) -> Preset:
        """The preset `name` names (None or "": `default`), if this machine can run it; PresetError says why not."""
        if name is not None and not isinstance(name, str):
            raise PresetError(f"A preset is named by text; {str(name)[:100]!r} is not a preset's name.")
        preset = self.get(name or default)
        if preset.needs_gpu and not has_gpu:
            raise PresetError(self.unusable(has_gpu=False)[preset.name])
        return preset

    def get(self, name: str) -> Preset:
        if name in self.presets:
            return self.presets[name]
        if name in self.problems:
            raise PresetError(self.problems[name])
        by_file = {p.path.stem: p for p in self.presets.values() if p.path}
        if name in by_file:
            return by_file[name]
        known = ", ".join(sorted(self.presets)) or "none"
        shown = repr(name[:100]) + ("…" if len(name) > 100 else "")  # a stranger's name can be any length
        raise PresetError(f"There is no preset named {shown}; the presets are: {known}.")


# --- loading -------------------------------------------------------------------------------


def load_presets(directory: Path | str = DEFAULT_PRESETS_DIR, *, check_engine: bool = True) -> PresetCatalog:
    """Load every *.yaml / *.yml file; problems are collected, never raised. `check_engine=False`
    leaves a preset's engine settings to vLLM's own check at the engine's start, for what only reads
    presets: checking them here imports vLLM (7-10 s of CPU, torch with it)."""
    directory = Path(directory)
    catalog = PresetCatalog()
    if not directory.is_dir():
        catalog.problems[str(directory)] = f"{directory}: the presets folder does not exist."
        return catalog
    files = sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])
    for path in files:
        try:
            preset = load_preset(path, check_engine=check_engine)
        except PresetError as exc:
            catalog.problems[path.stem] = exc.message
            continue
        if preset.name in catalog.presets:
            other = catalog.presets[preset.name].path
            catalog.problems[path.stem] = (
                f"{_shown_path(path)}: the name '{preset.name}' is already used by {_shown_path(other)}; "
                "give each preset its own name."
            )
            continue
        catalog.presets[preset.name] = preset
    return catalog


def load_preset(path: Path, *, check_engine: bool = True) -> Preset:
    """One preset file; PresetError lists every problem found in it, one line each (`check_engine`:
    see `load_presets`)."""
    shown = _shown_path(path)
    try:
        if path.stat().st_size > MAX_PRESET_BYTES:
            raise PresetError(f"{shown}: the file is larger than {MAX_PRESET_BYTES // 1024} KB; a preset is a few lines.")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PresetError(f"{shown}: cannot read the file ({exc}).") from exc
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f", line {mark.line + 1}" if mark else ""
        raise PresetError(f"{shown}{where}: this is not valid YAML ({exc.problem or exc.context}).") from exc
    except yaml.YAMLError as exc:
        raise PresetError(f"{shown}: this is not valid YAML ({exc}).") from exc
    alias_line = _first_alias_line(root)
    if alias_line:
        raise PresetError(f"{shown}, line {alias_line}: YAML anchors and aliases are not allowed in presets; write the values out.")
    if not isinstance(data, dict):
        raise PresetError(f"{shown}: a preset is a YAML mapping of keys (name, description, model, ...).")

    problems = [*_schema_problems(data), *(_engine_problems(data.get("engine")) if check_engine else [])]
    overrides, sampling_problems = _sampling_overrides(data.get("sampling"))
    problems += sampling_problems
    model, model_kind, model_problem = _resolve_model(data.get("model"), path.parent)
    if model_problem:
        problems.append((["model"], model_problem))
    if problems:
        raise PresetError("\n".join(_located(shown, root, problems)))

    spec = PresetFile.model_validate(data)
    rules = SamplingRules().narrowed(overrides)
    max_model_len = spec.engine.get("max_model_len")
    if max_model_len and rules.knob("max_tokens").maximum > max_model_len:
        max_tokens = rules.knob("max_tokens")
        rules = rules.narrowed({"max_tokens": (min(max_tokens.default, max_model_len), None, max_model_len)})
    hardware = spec.hardware if isinstance(spec.hardware, Hardware) else Hardware(device=spec.hardware)
    return Preset(
        name=spec.name.strip(),
        description=spec.description.strip(),
        model=model,
        model_kind=model_kind,
        engine=dict(spec.engine),
        sampling=rules,
        system_prompt=spec.system_prompt,
        hardware=hardware,
        timeout_s=spec.timeout_s,
        tags=tuple(spec.tags),
        examples=tuple(spec.examples),
        ignore_eos=spec.ignore_eos,
        path=path.resolve(),
    )


Problem = tuple[Sequence[str | int], str]  # (key path, message)


def _located(shown: str, root: yaml.Node | None, problems: list[Problem]) -> list[str]:
    """Each problem as one sentence naming the file and line, in the file's order."""
    lines = []
    for key_path, message in problems:
        line = _line_of(root, key_path)
        end = "" if message.endswith(("?", ".")) else "."
        lines.append((line or 0, f"{shown}{f', line {line}' if line else ''}: {message}{end}"))
    return [text for _, text in sorted(lines, key=lambda pair: pair[0])]


# pydantic names the member of a union it tried in the error's location (e.g. "KnobSetting",
# "literal['cpu','gpu']"); these are not keys of the file.
_MODEL_MEMBERS = {"KnobSetting", "Hardware"}


def _union_member(part: str | int) -> bool:
    return isinstance(part, str) and (part in _MODEL_MEMBERS or part in ("float", "str") or "[" in part or part.startswith("function-"))


def _schema_problems(data: dict[str, Any]) -> list[Problem]:
    """Every problem pydantic finds, once per key: for a value that may be a number or a mapping,
    only the errors of the form the file used."""
    try:
        PresetFile.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
    else:
        return []
    found: dict[tuple[str | int, ...], dict[str, Any]] = {}
    for error in errors:
        loc = list(error["loc"])
        member = next((i for i, part in enumerate(loc) if _union_member(part)), None)
        if member is not None:
            is_mapping = isinstance(_value_at(data, loc[:member]), dict)
            if is_mapping != (loc[member] in _MODEL_MEMBERS):
                continue
        key = tuple(part for part in loc if not _union_member(part))
        found.setdefault(key, error)
    problems: list[Problem] = []
    suggested: set[tuple[str | int, ...]] = set()
    for key, error in found.items():
        if error["type"] != "extra_forbidden":
            continue
        known = _keys_at(key[:-1])
        close = difflib.get_close_matches(str(key[-1]), known, n=1, cutoff=0.6)
        if close:
            suggested.add((*key[:-1], close[0]))
        hint = f" - did you mean '{close[0]}'?" if close else f" (the keys are: {', '.join(known)})"
        problems.append((key, f"unknown key '{'.'.join(map(str, key))}'{hint}"))
    for key, error in found.items():
        dotted = ".".join(map(str, key))
        if error["type"] == "extra_forbidden" or key in suggested:
            continue  # a misspelt key also makes the right one "missing": its suggestion says it
        if error["type"] == "missing":
            problems.append((key[:-1], f"the key '{dotted}' is required"))
        else:
            problems.append((key, f"{dotted}: {error['msg'][0].lower()}{error['msg'][1:]}; it is {error.get('input')!r}"))
    return problems


def _value_at(data: Any, loc: Sequence[str | int]) -> Any:
    for part in loc:
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def _engine_problems(engine: Any) -> list[Problem]:
    if not isinstance(engine, dict):
        return []  # the schema check reports it
    return [(["engine", key], message) for key, message in check_engine_args(engine)]


_KNOB_VALUE: TypeAdapter = TypeAdapter(float | KnobSetting)


def _sampling_overrides(sampling: Any) -> tuple[dict[str, tuple[float | None, float | None, float | None]], list[Problem]]:
    """The preset's (default, min, max) per sampling setting, and the problems of each."""
    overrides: dict[str, tuple[float | None, float | None, float | None]] = {}
    problems: list[Problem] = []
    if not isinstance(sampling, dict):
        return overrides, problems  # the schema check reports it
    for name, value in sampling.items():
        if name not in KNOB_NAMES:
            close = difflib.get_close_matches(str(name), KNOB_NAMES, n=1, cutoff=0.6)
            hint = f" - did you mean '{close[0]}'?" if close else f" (the settings are: {', '.join(KNOB_NAMES)})"
            problems.append((["sampling", name], f"unknown sampling setting '{name}'{hint}"))
            continue
        try:
            setting = _KNOB_VALUE.validate_python(value, strict=True)
        except ValidationError:
            continue  # the schema check reports it
        override = (setting.default, setting.min, setting.max) if isinstance(setting, KnobSetting) else (setting, None, None)
        try:
            SamplingRules().narrowed({name: override})
        except SettingsError as exc:
            problems.append((["sampling", name], f"sampling.{name}: {exc.message.rstrip('.')}"))
            continue
        overrides[name] = override
    return overrides, problems


def _resolve_model(model: Any, folder_of_file: Path) -> tuple[str, ModelKind, str | None]:
    """The model as the app uses it and its kind, or a problem saying what is wrong with it."""
    if not isinstance(model, str) or not model.strip():
        return "", "hub", None  # the schema check reports it
    model = model.strip()
    folder = (folder_of_file / Path(model).expanduser()).resolve()
    if model == EMBEDDED:
        return model, "embedded", None
    if model.startswith(("/", "./", "../", "~")) or folder.is_dir():
        if not folder.is_dir():
            return model, "folder", f"the model folder {model} does not exist (looked in {folder})"
        return str(folder), "folder", None
    if not _HUB_REPO.match(model):
        return model, "hub", (
            f"model {model!r} is neither 'embedded', a folder (start it with ./ or /) "
            "nor a Hugging Face repo id like Qwen/Qwen2.5-7B-Instruct"
        )
    return model, "hub", None


def _first_alias_line(node: yaml.Node | None) -> int | None:
    """The line of the first anchored node used twice (aliases can nest into a 'billion laughs')."""
    seen: set[int] = set()
    stack = [node] if node is not None else []
    while stack:
        current = stack.pop()
        if id(current) in seen:
            return int(current.start_mark.line) + 1
        seen.add(id(current))
        if isinstance(current, yaml.MappingNode):
            for key, value in current.value:
                stack.extend((key, value))
        elif isinstance(current, yaml.SequenceNode):
            stack.extend(current.value)
    return None


def _keys_at(loc: Sequence[str | int]) -> list[str]:
    model: type[BaseModel] = PresetFile
    if list(loc) == ["hardware"]:
        model = Hardware
    elif len(loc) == 2 and loc[0] == "sampling":
        model = KnobSetting
    return list(model.model_fields)


def _line_of(node: yaml.Node | None, key_path: Sequence[str | int]) -> int | None:
    """The 1-based line of a key in the composed YAML, or of its closest parent."""
    line = None
    for part in key_path:
        if not isinstance(node, yaml.MappingNode):
            break
        for key_node, value_node in node.value:
            if key_node.value == str(part):
                line = key_node.start_mark.line + 1
                node = value_node
                break
        else:
            break
    return line


def _shown_path(path: Path | None) -> str:
    if path is None:
        return "?"
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
