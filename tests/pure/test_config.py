"""gateway.core.config: the embedded default, a full example, and a clear ConfigError (file, dotted
key, problem) for every kind of mistake."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cairn.gateway.core import config as cfg
from harness.config import permission, realm, role

FULL = """
[router]
listen = "0.0.0.0:9090"
rawsocket = ["127.0.0.1:9091", "unix:/run/cairn/wamp.sock", "[::1]:9092",
             "tls:0.0.0.0:9443"]
data_dir = "/var/lib/cairn"
max_message_size = 262144
send_buffer_limit = 2097152
history_page_cap = 500
max_store_bytes = 1073741824
card_endurance_tb = 100
health_interval = "5m"
allowed_hosts = ["gateway.farm.lan"]
allowed_origins = ["https://grafana.farm.lan:3000"]
log_level = "debug"

[router.tls]
cert = "@DIR@/cert.pem"
key = "@DIR@/key.pem"

[sensors]
anything = "is validated by the drivers"

[mqtt]
broker = "mqtt://localhost"

[sync]
peer = "wss://upstream.example/ws"

[[realms]]
name = "farm.north"
anonymous_role = "guest"

  [[realms.roles]]
  name = "guest"
  permissions = [
    { uri = "sensor.", match = "prefix", allow = ["subscribe"] },
    { uri = "sensor..temperature", match = "wildcard", allow = ["subscribe", "call"] },
    { uri = "com.farm.status", allow = ["call"], disclose = true },
  ]

  [[realms.roles]]
  name = "device"
  permissions = [
    { uri = "", match = "prefix", allow = ["publish", "subscribe", "call", "register"] },
  ]

  [[realms.users]]
  authid = "pump-1"
  role = "device"
  secret = "s3cret"

  [[realms.users]]
  authid = "observer"
  role = "guest"
  secret_file = "@DIR@/observer.secret"

  [[realms.users]]
  authid = "gate"
  role = "device"
  secret_env = "CAIRN_TEST_GATE_SECRET"
  salt = "salt123"
  iterations = 2000
  keylen = 16

  [[realms.users]]
  authid = "tractor"
  role = "device"
  pubkeys = ["@PUBKEY@"]

  [[realms.history]]
  uri = "sensor"
  match = "prefix"
  max_events = 5000
  max_age = "12h"
  commit_window = "2.5s"

  [[realms.history]]
  uri = "alarm..raised"
  match = "wildcard"

[[realms]]
name = "realm2"
"""

# a minimal valid config: each mistake below is one edit of it
BASE = '\n[router]\nlisten = "127.0.0.1:8080"\n' + realm(
    "realm1", role("anonymous", permission("", ["publish", "subscribe"])),
    anonymous_role="anonymous")


def write(tmp_path: Path, text: str, name: str = "cairn.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_embedded_default():
    config = cfg.load(None)
    assert config.source == cfg.EMBEDDED
    assert config.router.listen == cfg.Endpoint("127.0.0.1", 8080)
    assert str(config.router.listen) == "127.0.0.1:8080"
    assert config.router.listen.is_loopback
    assert config.router.data_dir == Path("cairn-data")
    assert config.router.rawsocket == (cfg.Endpoint(path="cairn-data/wamp.sock"),)
    assert [r.name for r in config.realms] == ["realm1"]
    realm = config.realm("realm1")
    assert realm.anonymous_role == "anonymous"
    anonymous = realm.role("anonymous")
    assert anonymous is not None
    assert anonymous.permissions == (
        cfg.Permission("", "prefix", frozenset(cfg.ACTIONS), False),)
    assert realm.history == (cfg.HistoryRule("sensor", "prefix", 1_000_000, 90 * 86400, 5.0),)


PUBKEY = "0123456789abcdef" * 4


def test_full_example_with_every_key(tmp_path, monkeypatch):
    for name in ("cert.pem", "key.pem"):
        (tmp_path / name).write_text("-----BEGIN PEM-----\n")
    (tmp_path / "observer.secret").write_text("from-a-file\n")
    monkeypatch.setenv("CAIRN_TEST_GATE_SECRET", "from-the-env")
    path = write(tmp_path, FULL.replace("@DIR@", str(tmp_path)).replace("@PUBKEY@",
                                                                         PUBKEY.upper()))
    config = cfg.load(path)
    assert config.source == str(path)
    r = config.router
    assert r.listen == cfg.Endpoint("0.0.0.0", 9090) and not r.listen.is_loopback
    assert r.rawsocket == (cfg.Endpoint("127.0.0.1", 9091),
                           cfg.Endpoint(path="/run/cairn/wamp.sock"), cfg.Endpoint("::1", 9092),
                           cfg.Endpoint("0.0.0.0", 9443, tls=True))
    assert [str(e) for e in r.rawsocket] == ["127.0.0.1:9091", "unix:/run/cairn/wamp.sock",
                                             "::1:9092", "tls:0.0.0.0:9443"]
    assert r.tls == cfg.TlsConfig(tmp_path / "cert.pem", tmp_path / "key.pem")
    assert r.data_dir == Path("/var/lib/cairn")
    assert (r.max_message_size, r.send_buffer_limit) == (262144, 2097152)
    assert (r.history_page_cap, r.max_store_bytes) == (500, 1073741824)
    assert r.card_endurance_tb == 100.0
    assert r.health_interval == 300.0
    assert (r.allowed_hosts, r.allowed_origins) == (("gateway.farm.lan",),
                                                    ("https://grafana.farm.lan:3000",))
    assert r.log_level == "debug"

    assert [realm.name for realm in config.realms] == ["farm.north", "realm2"]
    farm = config.realm("farm.north")
    assert farm.anonymous_role == "guest"
    assert [role.name for role in farm.roles] == ["guest", "device"]
    assert farm.role("guest").permissions == (
        cfg.Permission("sensor.", "prefix", frozenset({"subscribe"})),
        cfg.Permission("sensor..temperature", "wildcard", frozenset({"subscribe", "call"})),
        cfg.Permission("com.farm.status", "exact", frozenset({"call"}), disclose=True),
    )
    assert farm.users == (
        cfg.User("pump-1", "device", "s3cret"),
        cfg.User("observer", "guest", "from-a-file"),
        cfg.User("gate", "device", "from-the-env", salt="salt123", iterations=2000, keylen=16),
        cfg.User("tractor", "device", pubkeys=(PUBKEY,)),
    )
    assert farm.history == (cfg.HistoryRule("sensor", "prefix", 5000, 12 * 3600, 2.5),
                            cfg.HistoryRule("alarm..raised", "wildcard", 1_000_000, None))
    realm2 = config.realm("realm2")
    assert (realm2.anonymous_role, realm2.roles, realm2.users, realm2.history) == (
        None, (), (), ())
    assert config.realm("nope") is None


def test_base_config_is_valid(tmp_path):
    config = cfg.load(write(tmp_path, BASE))
    assert config.realm("realm1").role("anonymous").permissions[0].allow == {"publish",
                                                                             "subscribe"}


def _replace(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, 1)


PERMISSION = '{ uri = "", match = "prefix", allow = ["publish", "subscribe"] }'
REALM_TAIL = '  [[realms.roles]]\n  name = "anonymous"'

# (id, config text, dotted key, words the problem must contain)
MISTAKES = [
    ("unknown-top-level-key", 'routers = "typo"\n' + BASE, "routers", [r"unknown key"]),
    ("unknown-router-key", _replace('[router]\n', '[router]\nport = 8080\n'), "router.port",
     [r"unknown key", r"listen"]),
    ("unknown-realm-key", _replace('name = "realm1"\n', 'name = "realm1"\nrole = "x"\n'),
     "realms[0].role", [r"unknown key", r"anonymous_role"]),
    ("unknown-permission-key",
     _replace(PERMISSION, '{ uri = "", match = "prefix", allow = [], colour = "red" }'),
     "realms[0].roles[0].permissions[0].colour", [r"unknown key", r"allow"]),
    ("unknown-user-key",
     BASE + '  [[realms.users]]\n  authid = "a"\n  role = "anonymous"\n  password = "x"\n',
     "realms[0].users[0].password", [r"unknown key", r"secret"]),
    ("unknown-history-key", BASE + '  [[realms.history]]\n  uri = "s"\n  keep = 5\n',
     "realms[0].history[0].keep", [r"unknown key", r"max_events"]),
    ("listen-is-a-number", _replace('listen = "127.0.0.1:8080"', "listen = 8080"),
     "router.listen", [r"expected a string", r"int 8080"]),
    ("max-message-size-is-a-string", _replace('[router]\n', '[router]\nmax_message_size = "big"\n'),
     "router.max_message_size", [r"expected an integer", r"'big'"]),
    ("max-message-size-is-a-bool", _replace('[router]\n', '[router]\nmax_message_size = true\n'),
     "router.max_message_size", [r"expected an integer", r"True"]),
    ("send-buffer-limit-zero", _replace('[router]\n', '[router]\nsend_buffer_limit = 0\n'),
     "router.send_buffer_limit", [r"positive integer"]),
    ("pending-per-address-zero",
     _replace('[router]\n', '[router.limits]\nmax_pending_per_address = 0\n[router]\n'),
     "router.limits.max_pending_per_address", [r"positive integer"]),
    ("allow-is-a-string",
     _replace(PERMISSION, '{ uri = "", match = "prefix", allow = "publish" }'),
     "realms[0].roles[0].permissions[0].allow", [r"expected an array", r"'publish'"]),
    ("rawsocket-is-a-string", _replace('[router]\n', '[router]\nrawsocket = "unix:/s"\n'),
     "router.rawsocket", [r"expected an array"]),
    ("rawsocket-item-is-a-number", _replace('[router]\n', '[router]\nrawsocket = [8081]\n'),
     "router.rawsocket[0]", [r"expected a string"]),
    ("router-is-not-a-table",
     'router = "fast"\n' + _replace('[router]\nlisten = "127.0.0.1:8080"\n', ''),
     "router", [r"expected a table"]),
    ("realms-is-a-table", '[realms]\nname = "realm1"\n', "realms", [r"expected an array"]),
    ("realm-name-with-space", _replace('name = "realm1"', 'name = "a b"'), "realms[0].name",
     [r"invalid URI", r"'a b'"]),
    ("realm-name-missing", _replace('name = "realm1"\n', ''), "realms[0].name", [r"missing"]),
    ("permission-uri-empty-component",
     _replace(PERMISSION, '{ uri = "a..b", match = "exact", allow = ["publish"] }'),
     "realms[0].roles[0].permissions[0].uri", [r"invalid URI", r"'a..b'", r"exact"]),
    ("permission-uri-with-hash",
     _replace(PERMISSION, '{ uri = "com.#", match = "prefix", allow = ["publish"] }'),
     "realms[0].roles[0].permissions[0].uri", [r"invalid URI", r"prefix"]),
    ("bad-match-policy",
     _replace(PERMISSION, '{ uri = "com", match = "regex", allow = ["publish"] }'),
     "realms[0].roles[0].permissions[0].match", [r"exact, prefix or wildcard", r"'regex'"]),
    ("unknown-action",
     _replace(PERMISSION, '{ uri = "", match = "prefix", allow = ["publish", "delete"] }'),
     "realms[0].roles[0].permissions[0].allow[1]", [r"unknown action", r"'delete'"]),
    ("anonymous-role-missing",
     _replace('anonymous_role = "anonymous"', 'anonymous_role = "guest"'),
     "realms[0].anonymous_role", [r"no role named 'guest'"]),
    ("user-role-missing",
     BASE + '  [[realms.users]]\n  authid = "pump"\n  role = "device"\n',
     "realms[0].users[0].role", [r"no role named 'device'"]),
    ("user-without-role", BASE + '  [[realms.users]]\n  authid = "pump"\n',
     "realms[0].users[0].role", [r"missing"]),
    ("user-without-authid", BASE + '  [[realms.users]]\n  role = "anonymous"\n',
     "realms[0].users[0].authid", [r"missing"]),
    ("role-without-name", _replace(REALM_TAIL, '  [[realms.roles]]'),
     "realms[0].roles[0].name", [r"missing"]),
    ("duplicate-role", BASE + '  [[realms.roles]]\n  name = "anonymous"\n',
     "realms[0].roles[1].name", [r"duplicate role 'anonymous'"]),
    ("duplicate-user",
     BASE + '  [[realms.users]]\n  authid = "pump"\n  role = "anonymous"\n' * 2,
     "realms[0].users[1].authid", [r"duplicate user 'pump'"]),
    ("roles-is-a-table", _replace('[[realms.roles]]', '[realms.roles]'), "realms[0].roles",
     [r"expected an array"]),
    ("permission-is-a-string", _replace(PERMISSION, '"publish"'),
     "realms[0].roles[0].permissions[0]", [r"must be a table"]),
    ("disclose-is-a-string",
     _replace(PERMISSION, '{ uri = "", match = "prefix", disclose = "yes" }'),
     "realms[0].roles[0].permissions[0].disclose", [r"expected true or false"]),
    ("tls-listener-without-tls-table",
     _replace('[router]\n', '[router]\nrawsocket = ["tls:127.0.0.1:9443"]\n'),
     "router.rawsocket[0]", [r"needs \[router.tls\]"]),
    ("tls-cert-missing-file",
     _replace('[router]\n', '[router]\ntls = { cert = "/nonexistent/c.pem", key = "k" }\n'),
     "router.tls.cert", [r"no such file"]),
    ("tls-unknown-key", _replace('[router]\n', '[router]\ntls = { certificate = "c" }\n'),
     "router.tls.certificate", [r"unknown key"]),
    ("network-listener-without-users",
     _replace('listen = "127.0.0.1:8080"', 'listen = "0.0.0.0:8080"'), "router.listen",
     [r"reachable from the network", r"users"]),
    ("listener-on-a-name-that-looks-like-loopback",
     _replace('listen = "127.0.0.1:8080"', 'listen = "127.0.0.1.example.invalid:8080"'),
     "router.listen", [r"names a host, not an IP address", r"reachable from the network",
                       r"users"]),
    ("rawsocket-on-a-name-that-looks-like-loopback",
     _replace('[router]\n', '[router]\nrawsocket = ["unix:/s", "127.evil.lan:8081"]\n'),
     "router.rawsocket[1]", [r"127.evil.lan:8081 names a host", r"reachable from the network"]),
    ("network-listener-with-anonymous-publish-everywhere",
     _replace('listen = "127.0.0.1:8080"', 'listen = "0.0.0.0:8080"')
     + '  [[realms.users]]\n  authid = "a"\n  role = "anonymous"\n  secret = "x"\n',
     "realms[0].anonymous_role", [r"reachable from the network", r"publish on every URI",
                                  r"'anonymous'"]),
    ("two-secrets",
     BASE + '  [[realms.users]]\n  authid = "a"\n  role = "anonymous"\n  secret = "x"\n'
            '  secret_env = "CAIRN_TEST_UNSET"\n',
     "realms[0].users[0].secret_env", [r"only one of"]),
    ("secret-env-not-set",
     BASE + '  [[realms.users]]\n  authid = "a"\n  role = "anonymous"\n'
            '  secret_env = "CAIRN_TEST_SURELY_UNSET_VARIABLE"\n',
     "realms[0].users[0].secret_env", [r"CAIRN_TEST_SURELY_UNSET_VARIABLE is not set"]),
    ("secret-file-missing",
     BASE + '  [[realms.users]]\n  authid = "a"\n  role = "anonymous"\n'
            '  secret_file = "/nonexistent/secret"\n',
     "realms[0].users[0].secret_file", [r"cannot read /nonexistent/secret"]),
    ("pubkey-not-hex",
     BASE + '  [[realms.users]]\n  authid = "a"\n  role = "anonymous"\n  pubkeys = ["xyz"]\n',
     "realms[0].users[0].pubkeys[0]", [r"64 hex digits"]),
    ("iterations-zero",
     BASE + '  [[realms.users]]\n  authid = "a"\n  role = "anonymous"\n  iterations = 0\n',
     "realms[0].users[0].iterations", [r"positive integer"]),
    ("duplicate-realm", BASE + '\n[[realms]]\nname = "realm2"\n[[realms]]\nname = "realm1"\n',
     "realms[2].name", [r"duplicate realm 'realm1'"]),
    ("no-realm", '[router]\nlisten = "127.0.0.1:8080"\n', "realms", [r"at least one"]),
    ("listen-without-port", _replace('listen = "127.0.0.1:8080"', 'listen = "localhost"'),
     "router.listen", [r"host:port", r"'localhost'"]),
    ("listen-port-too-big", _replace('listen = "127.0.0.1:8080"', 'listen = "localhost:65536"'),
     "router.listen", [r"host:port", r"65536"]),
    ("listen-on-unix-socket", _replace('listen = "127.0.0.1:8080"', 'listen = "unix:/tmp/s"'),
     "router.listen", [r"host:port"]),
    ("rawsocket-unix-without-path", _replace('[router]\n', '[router]\nrawsocket = ["unix:"]\n'),
     "router.rawsocket[0]", [r"unix: needs a socket path"]),
    ("rawsocket-without-host", _replace('[router]\n', '[router]\nrawsocket = [":8081"]\n'),
     "router.rawsocket[0]", [r"host:port"]),
    ("max-age-in-words",
     BASE + '  [[realms.history]]\n  uri = "sensor"\n  max_age = "ninety days"\n',
     "realms[0].history[0].max_age", [r"duration like '90d'", r"'ninety days'"]),
    ("max-age-is-a-number", BASE + '  [[realms.history]]\n  uri = "sensor"\n  max_age = 90\n',
     "realms[0].history[0].max_age", [r"expected a string"]),
    ("max-events-negative",
     BASE + '  [[realms.history]]\n  uri = "sensor"\n  max_events = -1\n',
     "realms[0].history[0].max_events", [r"positive integer"]),
    ("card-endurance-zero", _replace('[router]\n', '[router]\ncard_endurance_tb = 0\n'),
     "router.card_endurance_tb", [r"positive number", r"0"]),
    ("card-endurance-a-string", _replace('[router]\n', '[router]\ncard_endurance_tb = "10TB"\n'),
     "router.card_endurance_tb", [r"positive number", r"'10TB'"]),
    ("health-interval-not-a-duration",
     _replace('[router]\n', '[router]\nhealth_interval = "often"\n'),
     "router.health_interval", [r"duration like", r"'often'"]),
    ("health-interval-under-a-second",
     _replace('[router]\n', '[router]\nhealth_interval = "100ms"\n'),
     "router.health_interval", [r"at least 1s", r"'100ms'"]),
    ("commit-window-not-a-duration",
     BASE + '  [[realms.history]]\n  uri = "sensor"\n  commit_window = "soon"\n',
     "realms[0].history[0].commit_window", [r"duration like", r"'soon'"]),
    ("commit-window-negative",
     BASE + '  [[realms.history]]\n  uri = "sensor"\n  commit_window = "-5s"\n',
     "realms[0].history[0].commit_window", [r"must not be negative", r"'-5s'"]),
    ("commit-window-over-a-minute",
     BASE + '  [[realms.history]]\n  uri = "sensor"\n  commit_window = "2m"\n',
     "realms[0].history[0].commit_window", [r"at most 60s", r"'2m'"]),
    ("commit-window-is-a-number",
     BASE + '  [[realms.history]]\n  uri = "sensor"\n  commit_window = 5\n',
     "realms[0].history[0].commit_window", [r"expected a string"]),
    ("history-without-uri", BASE + '  [[realms.history]]\n  match = "prefix"\n',
     "realms[0].history[0].uri", [r"missing"]),
    ("bad-log-level", _replace('[router]\n', '[router]\nlog_level = "verbose"\n'),
     "router.log_level", [r"debug, info, warning or error", r"'verbose'"]),
    ("allowed-origin-with-a-path",
     _replace('[router]\n', '[router]\nallowed_origins = ["https://grafana.lan/d/1"]\n'),
     "router.allowed_origins[0]", [r"origin like", r"'https://grafana.lan/d/1'"]),
    ("allowed-origin-without-scheme",
     _replace('[router]\n', '[router]\nallowed_origins = ["grafana.lan:3000"]\n'),
     "router.allowed_origins[0]", [r"origin like"]),
    ("status-token-file-missing",
     _replace('[router]\n', '[router]\nstatus_token_file = "/nonexistent/status.token"\n'),
     "router.status_token_file", [r"cannot read", r"/nonexistent/status.token"]),
    ("allowed-hosts-not-strings", _replace('[router]\n', '[router]\nallowed_hosts = [1]\n'),
     "router.allowed_hosts[0]", [r"non-empty string"]),
    # issue 45, C3: applied and marked good, it let no client log in again
    ("max-message-size-no-hello-fits-in",
     _replace('[router]\n', '[router]\nmax_message_size = 1\n'),
     "router.max_message_size", [r"at least 4096 bytes, not 1", r"no one can log in"]),
]


@pytest.mark.parametrize(("text", "key", "words"), [m[1:] for m in MISTAKES],
                         ids=[m[0] for m in MISTAKES])
def test_mistake_names_file_key_and_problem(tmp_path, text, key, words):
    path = write(tmp_path, text)
    with pytest.raises(cfg.ConfigError) as info:
        cfg.load(path)
    error = info.value
    assert error.source == str(path)
    assert error.key == key
    for word in words:
        assert re.search(word, error.problem), f"{word!r} not in {error.problem!r}"
    # the one-line message a person sees: file, key, problem
    assert str(error) == f"{path}: {key}: {error.problem}"


def test_invalid_toml(tmp_path):
    path = write(tmp_path, BASE + "\n[router\n")
    with pytest.raises(cfg.ConfigError) as info:
        cfg.load(path)
    assert info.value.source == str(path)
    assert str(path) in str(info.value)
    assert "invalid TOML" in info.value.problem
    assert re.search(r"line \d+", info.value.problem), info.value.problem


def test_missing_file(tmp_path):
    path = tmp_path / "nope.toml"
    with pytest.raises(cfg.ConfigError) as info:
        cfg.load(path)
    assert str(info.value).startswith(f"{path}: ")
    assert "cannot read file" in info.value.problem
    assert "No such file" in info.value.problem


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(cfg.ConfigError) as info:
        cfg.load(tmp_path)
    assert info.value.source == str(tmp_path)
    assert "cannot read file" in info.value.problem


def test_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(BASE.replace('"realm1"', '"r\xe9alm"').encode("latin-1"))
    with pytest.raises(cfg.ConfigError) as info:
        cfg.load(path)
    assert info.value.source == str(path)
    assert "UTF-8" in info.value.problem


def test_parse_takes_the_source_name_for_messages():
    import tomllib

    with pytest.raises(cfg.ConfigError) as info:
        cfg.parse(tomllib.loads(_replace('name = "realm1"', 'name = "a b"')), "inline.toml")
    assert str(info.value).startswith("inline.toml: realms[0].name: invalid URI")


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("15m", 900), ("12h", 43200),
                                                ("90d", 7776000), ("2w", 1209600),
                                                (" 7 d ", 604800), ("250ms", 0.25),
                                                ("1.5h", 5400), ("0s", 0)])
def test_durations(text, seconds):
    assert cfg.parse_duration(text, "f", "k") == seconds


@pytest.mark.parametrize("text", ["", "90", "d", "1.h", "90 days", "1y", "5 s s"])
def test_bad_durations(text):
    with pytest.raises(cfg.ConfigError, match=r"^f: k: expected a duration"):
        cfg.parse_duration(text, "f", "k")


def test_a_negative_duration_is_refused_as_negative():
    with pytest.raises(cfg.ConfigError, match=r"^f: k: must not be negative, not '-1d'"):
        cfg.parse_duration("-1d", "f", "k")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.4.5", "::1", "localhost", "LocalHost"])
def test_localhost_and_loopback_addresses_are_loopback(host):
    assert cfg.Endpoint(host, 8080).is_loopback


@pytest.mark.parametrize("host", ["127.0.0.1.example.invalid", "127.evil.lan",
                                  "localhost.example", "0.0.0.0", "::", "10.0.0.7",
                                  "::ffff:10.0.0.7"])
def test_names_and_addresses_that_only_look_like_loopback_are_not(host):
    assert not cfg.Endpoint(host, 8080).is_loopback


def test_an_empty_status_token_file_is_refused(tmp_path):
    (tmp_path / "status.token").write_text("\n")
    text = BASE.replace("[router]\n", f'[router]\nstatus_token_file = "{tmp_path}/status.token"\n')
    with pytest.raises(cfg.ConfigError, match=r"router.status_token_file: .* holds no token"):
        cfg.load(write(tmp_path, text))
