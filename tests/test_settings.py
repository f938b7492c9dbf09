"""The settings table drives --help, the environment fallbacks and the README: keep them in step."""

from __future__ import annotations

import pytest

from chat import settings
from tests.conftest import ROOT


def test_every_setting_is_documented_in_the_readme():
    readme = (ROOT / "README.md").read_text()
    for setting in settings.SETTINGS:
        row = next((line for line in readme.splitlines() if line.startswith(f"| `{setting.flag}`")), None)
        assert row is not None, f"README lacks a row for {setting.flag}"
        for env in setting.env:
            assert f"`{env}`" in row, f"README row for {setting.flag} lacks {env}"


def test_environment_variables_fill_in_absent_flags(monkeypatch):
    monkeypatch.setenv("CHAT_PORT", "8123")
    monkeypatch.setenv("CHAT_SHARE", "true")
    monkeypatch.setenv("CHAT_HOST", "0.0.0.0")
    args = settings.parse([])
    assert (args.port, args.share, args.host) == (8123, True, "0.0.0.0")
    assert settings.parse(["--port", "9000", "--no-share"]).port == 9000


def test_safe_defaults():
    args = settings.parse([])
    assert args.host == "127.0.0.1" and args.share is False and args.auth == "" and args.concurrency_limit == 0


def test_a_bad_environment_value_says_which_variable(monkeypatch):
    monkeypatch.setenv("CHAT_PORT", "eighty")
    with pytest.raises(SystemExit, match="CHAT_PORT='eighty' is not a valid int"):
        settings.parse([])
