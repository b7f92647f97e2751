"""The ``[driver]`` section shared by every driver: how it reaches the router.

```toml
[driver]
router = "rawsocket+unix:/run/cairn/wamp.sock"  # or ws://127.0.0.1:8080/ws, rawsocket+tcp://h:p
realm = "realm1"
authid = "sensors"        # optional: ticket/wampcra login (else anonymous)
secret_env = "CAIRN_SENSOR_SECRET"   # or secret / secret_file
backlog = 1000            # readings kept per device while the router is away; its oldest go
backlog_total = 10000     # ... and for all devices: then the oldest of the one with the most
```

Each driver validates its own sections ([[sensors]], [mqtt]) with the same
:class:`base.config_tools.ConfigError`, naming file, key and problem.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cairn.base.config_tools import ConfigError, Validator, secret
from cairn.gateway.core.config import read_document as read_toml  # noqa: F401  (drivers' entry point)


@dataclass(frozen=True)
class DriverConfig:
    router: str = "ws://127.0.0.1:8080/ws"
    realm: str = "realm1"
    authid: str | None = None
    secret: str | None = None
    backlog: int = 1000          # readings waiting, per device (drivers.backlog)
    backlog_total: int = 10_000  # ... of all devices together


def parse_driver(data: dict[str, Any], source: str) -> DriverConfig:
    v = Validator(source)
    t = v.table(data, "driver")
    at = "driver"
    v.keys(t, at, {"router", "realm", "authid", "secret", "secret_file", "secret_env",
                   "backlog", "backlog_total"})
    d = DriverConfig()
    router = v.get(t, at, "router", str, d.router)
    if not router.startswith(("ws://", "wss://", "rawsocket+tcp://", "rawsocket+unix:")):
        raise ConfigError(source, f"{at}.router",
                          f"expected ws://host:port/ws, rawsocket+tcp://host:port or "
                          f"rawsocket+unix:/path, not {router!r}")
    return DriverConfig(router=router, realm=v.get(t, at, "realm", str, d.realm),
                        authid=v.get(t, at, "authid", str, None), secret=secret(v, t, at),
                        backlog=v.positive(t, at, "backlog", d.backlog),
                        backlog_total=v.positive(t, at, "backlog_total", d.backlog_total))
