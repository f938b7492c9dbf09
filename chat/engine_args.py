"""vLLM's engine arguments as a preset may give them: each key and value checked against
`AsyncEngineArgs` (an unknown key gets the closest known one; a wrong type says which it should
be). Read from vLLM, so a preset is checked against the vLLM installed."""

from __future__ import annotations

import dataclasses
import difflib
import sys
from collections.abc import Mapping
from functools import cache
from typing import Any

from pydantic import TypeAdapter, ValidationError

RESERVED_ENGINE_KEYS = {"model": "model"}


@cache
def _engine_fields() -> dict[str, dataclasses.Field[Any]]:
    from vllm import AsyncEngineArgs

    return {f.name: f for f in dataclasses.fields(AsyncEngineArgs)}


@cache
def _engine_type(name: str) -> TypeAdapter | None:
    annotation = _engine_fields()[name].type
    if isinstance(annotation, str):
        from vllm import AsyncEngineArgs

        try:
            annotation = eval(annotation, vars(sys.modules[AsyncEngineArgs.__module__]))  # noqa: S307
        except Exception:
            return None  # a type vLLM itself cannot resolve: vLLM checks the value at start
    try:
        return TypeAdapter(annotation)
    except Exception:
        return None


def check_engine_args(engine: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Problems as (key, message): unknown keys with the closest valid one, and wrong types."""
    fields = _engine_fields()
    problems = []
    for key, value in engine.items():
        if key in RESERVED_ENGINE_KEYS:
            problems.append((key, f"engine key '{key}' belongs at the top level of the preset, not under 'engine'"))
            continue
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.6)
            hint = f" - did you mean '{close[0]}'?" if close else " (see vLLM's engine arguments)"
            problems.append((key, f"unknown engine key '{key}'{hint}"))
            continue
        adapter = _engine_type(key)
        if adapter is None:
            continue
        try:
            adapter.validate_python(value, strict=True)
        except ValidationError as exc:
            expected = _expected_type(fields[key].type)
            problems.append((key, f"engine.{key} must be {expected}; it is {value!r} ({exc.errors()[0]['msg'].lower()})"))
    return problems


def _expected_type(annotation: Any) -> str:
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))
    return {"int": "a whole number", "float": "a number", "bool": "true or false", "str": "text"}.get(
        text, f"of type {text}"
    )
