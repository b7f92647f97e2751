"""base.config_secrets: ``cairn.admin.config.get`` shows a config text without its inline
secrets, and ``apply`` of that text, edited, keeps each secret where it was."""

from __future__ import annotations

import pytest

from cairn.base.config_secrets import REDACTED, Unredactable, redact, restore
from cairn.base.config_tools import ConfigError
from harness.config import user

SECRETS = ("admin-ticket-0123456789", "pump-ticket-9876543210", "sync-token-abcdef",
           "sync-pass-word", "update-token-xyz", "mqtt-pass", "s3-secret-key")
TEXT = """\
[router]
listen = "127.0.0.1:8080"   # the dashboard
status_token_file = "/etc/cairn/secrets/status.token"

[mqtt]
broker = "mqtt://localhost"
password = 'mqtt-pass'

[sync]
sink = "https://central.example/landing"
token = "sync-token-abcdef"   # rotated yearly
password = \"\"\"sync-pass-word\"\"\"
secret_access_key = "s3-secret-key"

[update]
source = "https://updates.example/{gateway_id}"
token="update-token-xyz"

[[realms]]
name = "realm1"
""" + user("admin", "admin", secret="admin-ticket-0123456789") \
    + user("pump", "device", secret="pump-ticket-9876543210") \
    + user("observer", "device", secret_file="/etc/cairn/secrets/observer")


def test_get_shows_no_inline_secret():
    shown = redact(TEXT)
    assert not [s for s in SECRETS if s in shown]
    assert shown.count(REDACTED) == len(SECRETS)


def test_get_keeps_the_rest_of_the_text_as_written():
    shown = redact(TEXT)
    assert shown.splitlines()[:3] == TEXT.splitlines()[:3]
    assert f'token = "{REDACTED}"   # rotated yearly' in shown
    assert 'secret_file = "/etc/cairn/secrets/observer"' in shown  # a name, not a value


def test_a_text_applied_as_get_showed_it_is_the_current_file():
    assert restore(redact(TEXT), TEXT, "cairn.toml") == TEXT


def test_an_edit_of_what_get_showed_keeps_every_secret():
    edited = redact(TEXT).replace('listen = "127.0.0.1:8080"', 'listen = "127.0.0.1:9090"')
    assert restore(edited, TEXT, "cairn.toml") == \
        TEXT.replace('listen = "127.0.0.1:8080"', 'listen = "127.0.0.1:9090"')


def test_a_user_moved_within_its_realm_keeps_its_own_secret():
    users = redact(TEXT).split("  [[realms.users]]\n")
    moved = users[0] + "".join(f"  [[realms.users]]\n{u}" for u in (users[2], users[1], users[3]))
    restored = restore(moved, TEXT, "cairn.toml")
    assert restored.index('"pump-ticket-9876543210"') < restored.index('"admin-ticket-')
    assert 'authid = "pump"\n  role = "device"\n  secret = "pump-ticket-9876543210"' in restored


def test_a_secret_written_out_replaces_the_current_one():
    shown = redact(TEXT)
    at = shown.index('authid = "admin"')
    edited = shown[:at] + shown[at:].replace(f'secret = "{REDACTED}"',
                                             'secret = "new-admin-ticket-5555"', 1)
    restored = restore(edited, TEXT, "cairn.toml")
    assert "new-admin-ticket-5555" in restored and "admin-ticket-0123456789" not in restored


def test_the_marker_for_a_secret_the_file_does_not_have_names_its_key():
    added = redact(TEXT) + user("new", "device", secret=REDACTED)
    with pytest.raises(ConfigError) as refused:
        restore(added, TEXT, "cairn.toml")
    assert refused.value.key == "realms[0].users[3].secret"
    assert "write the secret out" in refused.value.problem


def test_the_marker_in_a_comment_or_another_keys_value_is_left_as_it_is():
    text = f'# secret = "{REDACTED}"\n[router]\nlog_level = "{REDACTED}"\n'
    assert restore(text, TEXT, "cairn.toml") == text


def test_a_secret_with_quotes_and_backslashes_round_trips():
    text = '[sync]\ntoken = "a\\"b\\\\c\\u0007d"\n'
    assert redact(text) == f'[sync]\ntoken = "{REDACTED}"\n'
    assert restore(redact(text), text, "cairn.toml") == text


def test_a_secret_under_a_quoted_key_is_not_shown_at_all():
    with pytest.raises(Unredactable, match="cannot hide"):
        redact('[sync]\n"token" = "sync-token-abcdef"\n')


def test_a_text_that_is_not_toml_is_not_shown():
    with pytest.raises(Unredactable, match="not valid TOML"):
        redact('[sync]\ntoken = "sync-token-abcdef\n')
