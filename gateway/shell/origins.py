"""Which browsers may talk to the HTTP listener: the Host and Origin checks.

Two attacks come through a browser on the LAN (a kiosk on the Pi, a laptop): a web page from
anywhere opening ``ws://gateway:8080/ws`` (it would join with the anonymous role's rights),
and DNS rebinding (a name of the attacker's that resolves to the gateway, so the browser
thinks /status and /metrics are the attacker's own). So, as Jupyter and Home Assistant do:

- the Host header must name the gateway: an IP address, ``localhost``, this machine's host
  name (also with ``.local``, as mDNS announces it), or a name in ``router.allowed_hosts``;
- a WebSocket upgrade that carries an Origin (browsers always send one) must come from the
  same origin as the page Cairn serves (Origin's host and port equal to Host), or from an
  origin in ``router.allowed_origins``. Clients that are not browsers send no Origin.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit


def _split_host(host: str) -> tuple[str, str]:
    """("name", "port") of a Host header value; IPv6 literals keep no brackets."""
    if host.startswith("["):
        name, _, rest = host[1:].partition("]")
        return name, rest.removeprefix(":")
    name, _, port = host.partition(":")
    return name, port


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.split("%")[0])
    except ValueError:
        return False
    return True


class BrowserGuard:
    def __init__(self, allowed_hosts: tuple[str, ...] = (),
                 allowed_origins: tuple[str, ...] = (),
                 hostname: str | None = None) -> None:
        own = (hostname or socket.gethostname()).lower()
        self.hosts = {"localhost", own, f"{own}.local", *(h.lower() for h in allowed_hosts)}
        self.any_host = "*" in allowed_hosts
        self.origins = {o.lower().rstrip("/") for o in allowed_origins}
        self.any_origin = "*" in allowed_origins

    def host_refused(self, host: str | None) -> str | None:
        """Why a request with this Host header is not answered, or None. No Host: an
        HTTP/1.0 client, not a browser."""
        if host is None or self.any_host:
            return None
        name = _split_host(host.strip().lower())[0].rstrip(".")
        if _is_ip(name) or name in self.hosts or name.endswith(".localhost"):
            return None
        return (f"Host {host!r} is not this gateway's (add it to router.allowed_hosts if it "
                f"is one of its names)")

    def origin_refused(self, origin: str | None, host: str | None) -> str | None:
        """Why a WebSocket upgrade from a page of ``origin`` is refused, or None."""
        if origin is None or self.any_origin:
            return None
        normal = origin.strip().lower().rstrip("/")
        if normal in self.origins:
            return None
        parts = urlsplit(normal)
        if parts.scheme in ("http", "https") and host is not None and \
                parts.netloc == host.strip().lower():
            return None
        return (f"a page from {origin!r} may not open a WAMP session here (add the origin to "
                f"router.allowed_origins to allow it)")
