"""Who is an administrator: names from --auth listed in --admins, or loopback with --admin-local."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from chat import settings
from chat.admin import Admins, is_loopback
from chat.auth import Login

pytestmark = pytest.mark.unit

LOGIN = Login.parse("alice:a-secret,bob:b-secret")


def test_nobody_is_an_administrator_by_default():
    admins = Admins.parse(settings.parse([]).admins, local=settings.parse([]).admin_local, login=None)
    assert not admins.anyone_can_be
    assert not admins.allows(None, "127.0.0.1") and not admins.allows("alice", "127.0.0.1")


def test_named_users_of_the_login_are_administrators_wherever_they_connect_from():
    admins = Admins.parse(" alice ,", login=LOGIN)
    assert admins.anyone_can_be
    assert admins.allows("alice", "203.0.113.9")
    assert not admins.allows("bob", "127.0.0.1")  # loopback counts only with --admin-local
    assert not admins.allows(None, "203.0.113.9")


@pytest.mark.parametrize(("spec", "login", "message"), [
    ("alice", None, "add --auth user:password"),
    ("alice,carol", LOGIN, "names carol, who is not a user of --auth"),
])
def test_admins_that_cannot_sign_in_are_refused_at_start(spec, login, message):
    with pytest.raises(ValueError, match=message):
        Admins.parse(spec, login=login)


@pytest.mark.parametrize(("host", "local"), [
    ("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.0.0.1", False), ("203.0.113.9", False), ("::ffff:10.0.0.1", False), ("localhost", False), ("", False), (None, False),
])
def test_only_loopback_addresses_are_local(host, local):
    assert is_loopback(host) is local
    assert Admins(local=True).allows(None, host) is local


def test_a_web_request_is_judged_by_its_signed_in_user_and_its_peer_address():
    admins = Admins.parse("alice", local=True, login=LOGIN)
    assert admins.allows_request(SimpleNamespace(username="alice", client=SimpleNamespace(host="203.0.113.9")))
    assert admins.allows_request(SimpleNamespace(username=None, client=SimpleNamespace(host="::1")))
    assert not admins.allows_request(SimpleNamespace(username="bob", client=SimpleNamespace(host="198.51.100.7")))
    # A forwarded-for header is a client's word, never an address: only the peer counts.
    forged = SimpleNamespace(username=None, client=SimpleNamespace(host="198.51.100.7"),
                             headers={"x-forwarded-for": "127.0.0.1"})
    assert not admins.allows_request(forged)
    assert not admins.allows_request(SimpleNamespace(username=None))  # no connection at all


def test_the_flags_and_their_environment_variables(monkeypatch):
    args = settings.parse(["--admins", "alice", "--admin-local"])
    assert (args.admins, args.admin_local) == ("alice", True)
    monkeypatch.setenv("CHAT_ADMINS", "bob")
    monkeypatch.setenv("CHAT_ADMIN_LOCAL", "yes")
    args = settings.parse([])
    assert (args.admins, args.admin_local) == ("bob", True)
    assert settings.parse(["--no-admin-local"]).admin_local is False
