"""The S3 sink: ``sink = "s3://BUCKET/PREFIX"``. Each batch file and manifest is one
SigV4-signed PUT (:mod:`.sigv4`) of ``PREFIX/<gateway_id>/<name>``, to AWS S3 or any
store speaking its API (MinIO, Ceph RGW, Garage, R2, B2, rclone ``serve s3``).

- **PUT only.** Nothing here lists, reads or deletes: the names are deterministic and a
  batch sent twice is harmless, so a gateway's key needs ``s3:PutObject`` under its own
  prefix and nothing else (docs/sync-and-spark.md, "Landing in S3"), and a stolen gateway
  can neither read nor erase the fleet's data. An overwrite is the re-send of the same batch.
- **What landed is what was sent.** ``x-amz-content-sha256`` is the body's SHA-256, which the
  server checks before it stores anything; the 200's ``ETag`` (a single PUT's MD5) is then
  compared with the body's, so an answer from something that did not store these bytes is
  no confirmation (``verify_etag = false`` for buckets encrypted with SSE-KMS, whose ETags
  are no MD5).
- **A wrong clock.** SigV4 signs the request time and S3 refuses one 15 minutes off
  (``RequestTimeTooSkewed``; rclone: 400 ``AccessDenied`` "the difference between the request
  time and the server's time..."). An off-grid gateway comes back online with a wrong clock
  and a week of backlog, so a refusal whose ``Date`` is more than :data:`SKEW_S` from the
  request time is retried once, signed with the server's time; that time is then carried
  forward on ``CLOCK_BOOTTIME`` (:class:`UplinkClock`), which no step of the wall clock
  moves, kept for later requests (and later runs of the same boot, through the status) and
  reported as the uplink's view of the clock, as the AWS SDKs correct their clock skew.
- **Refusals say why**, naming the key, the bucket or the setting to look at, never a secret.
"""

from __future__ import annotations

import email.utils
import hashlib
import logging
import re
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from cairn.base import clock
from cairn.base.clock_readings import rfc3339
from cairn.base.config_tools import ConfigError, Validator, optional_secret
from cairn.sync.sinks.http import HttpSink
from cairn.sync.sinks.sigv4 import Credentials, authorize, uri_encode
from cairn.sync.sinks.sink import SinkError

log = logging.getLogger("cairn.sync")

SKEW_S = 300  # a refusal whose Date is this far from the request time is about the clock
DEFAULT_REGION = "us-east-1"
# the [sync] keys of an s3:// sink (secret_access_key_file and _env are read as the token's
# are, base.config_tools.optional_secret); sync.cli refuses them with another sink
KEYS = frozenset({"endpoint", "region", "access_key_id", "secret_access_key",
                  "secret_access_key_file", "secret_access_key_env", "addressing",
                  "verify_etag"})
# bucket names (S3's rules, loosely: 3-63 of a-z 0-9 . -) and a prefix of plain key parts
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
PREFIX_PART = re.compile(r"[A-Za-z0-9!_.*'()-]+")


@dataclass(frozen=True)
class S3Config:
    """``[sync]`` of an ``s3://`` sink, checked."""

    bucket: str
    prefix: str
    endpoint: str  # scheme://host[:port]
    region: str
    addressing: str  # "path" (endpoint/bucket/key) or "virtual" (bucket.endpoint/key)
    credentials: Credentials
    verify_etag: bool = True


def parse(v: Validator, t: dict[str, Any], at: str, sink: str) -> S3Config:
    """The s3 settings of section ``t`` (sync.sinks.Scheme.parse), the secret access key
    from whichever of its three keys was given."""
    secret = optional_secret(v, t, at, "secret_access_key")
    parts = urllib.parse.urlsplit(sink)
    bucket, prefix = parts.netloc, parts.path.strip("/")
    if not BUCKET.fullmatch(bucket) or ".." in bucket:
        raise ConfigError(v.source, f"{at}.sink", f"{bucket!r} is not an S3 bucket name "
                          "(3-63 characters: lower-case letters, digits, '.' and '-'): "
                          "s3://BUCKET/PREFIX")
    if parts.query or parts.fragment or not all(
            PREFIX_PART.fullmatch(p) and p not in (".", "..") for p in prefix.split("/")
            if prefix):
        raise ConfigError(v.source, f"{at}.sink", f"the prefix {prefix!r} must be parts of "
                          "letters, digits and !_.*'()- between single '/'")
    region = v.get(t, at, "region", str, DEFAULT_REGION)
    if not re.fullmatch(r"[a-z0-9-]+", region):
        raise ConfigError(v.source, f"{at}.region", f"{region!r} is not a region name "
                                                    "(such as eu-central-1)")
    endpoint = v.get(t, at, "endpoint", str, None)
    if endpoint is None:
        endpoint, addressing = f"https://s3.{region}.amazonaws.com", "virtual"
    else:
        e = urllib.parse.urlsplit(endpoint)
        if e.scheme not in ("http", "https") or not e.hostname or e.path.strip("/") \
                or e.query or e.username:
            raise ConfigError(v.source, f"{at}.endpoint", f"must be http(s)://HOST[:PORT] "
                              f"of the S3 API, without a path, not {endpoint!r}")
        endpoint, addressing = f"{e.scheme}://{e.netloc}", "path"  # MinIO's, rclone's way
    addressing = v.get(t, at, "addressing", str, addressing)
    if addressing not in ("path", "virtual"):
        raise ConfigError(v.source, f"{at}.addressing", f"must be \"path\" (ENDPOINT/BUCKET/"
                          f"KEY) or \"virtual\" (BUCKET.ENDPOINT/KEY), not {addressing!r}")
    key_id = v.get(t, at, "access_key_id", str, None)
    if not key_id or not key_id.strip():
        raise ConfigError(v.source, f"{at}.access_key_id", "missing: an s3:// sink signs "
                          "its PUTs with an access key (the gateway's own, allowed to put "
                          "under its prefix only)")
    if secret is None:
        raise ConfigError(v.source, f"{at}.secret_access_key", "missing: give "
                          "secret_access_key, secret_access_key_file or secret_access_key_env")
    return S3Config(bucket, prefix, endpoint, region, addressing,
                    Credentials(key_id.strip(), secret.strip()),
                    v.get(t, at, "verify_etag", bool, True))


@dataclass
class UplinkClock:
    """The S3 server's time, carried forward on ``CLOCK_BOOTTIME`` from the ``Date`` of a
    refusal: ``server_ns - boottime_ns`` then, for this boot only (a reboot restarts that
    clock). None of it while the wall clock is good enough."""

    boot_id: str | None = None
    server_minus_boottime_ns: int | None = None
    measured: str | None = None  # the server's time when it was measured (RFC 3339)

    def now_ns(self) -> int | None:
        """The server's time now, if it was measured in this boot."""
        if self.server_minus_boottime_ns is None or self.boot_id != clock.boot_id():
            return None
        return clock.boottime_ns() + self.server_minus_boottime_ns

    def learn(self, server_ns: int) -> float:
        """The server said it is ``server_ns``; returns its lead on the wall clock, in s."""
        self.boot_id = clock.boot_id()
        self.server_minus_boottime_ns = server_ns - clock.boottime_ns()
        self.measured = rfc3339(server_ns // 1_000_000)
        return (server_ns - clock.wall_ns()) / 1e9

    def view(self) -> dict[str, Any] | None:
        """For the status and the health record: how far the wall clock is from the
        uplink's (positive: the server's is ahead), and since when that is known."""
        now = self.now_ns()
        if now is None:
            return None
        return {"offset_s": round((now - clock.wall_ns()) / 1e9, 1), "measured": self.measured,
                "source": "the S3 server's Date", "boot_id": self.boot_id,
                "server_minus_boottime_ns": self.server_minus_boottime_ns}

    def resume(self, saved: Any) -> None:
        """Take over what an earlier run of this boot measured (its :meth:`view`)."""
        if isinstance(saved, dict) and saved.get("boot_id") == clock.boot_id() and \
                isinstance(saved.get("server_minus_boottime_ns"), int):
            self.boot_id = saved["boot_id"]
            self.server_minus_boottime_ns = saved["server_minus_boottime_ns"]
            self.measured = saved.get("measured")


def _tag(xml: str, name: str) -> str:
    """The text of ``<name>`` in an S3 error document (read with a pattern, not an XML
    parser: an answer is at most 64 KiB and only two of its fields are wanted)."""
    found = re.search(rf"<{name}>([^<]{{0,500}})</{name}>", xml)
    return found.group(1).strip().replace("&#39;", "'").replace("&quot;", '"') \
        .replace("&amp;", "&") if found else ""


@dataclass
class S3Sink:
    config: S3Config
    timeout: float = 30.0
    verify_tls: bool = True
    bandwidth: int = 0
    uplink_clock: UplinkClock = field(default_factory=UplinkClock)

    def __post_init__(self) -> None:
        # the transport of every HTTP sink: its deadline, TLS and pacing (no redirects:
        # the signature is for one host, and S3 answers a wrong region with a 301)
        self._http = HttpSink(self.config.endpoint, timeout=self.timeout,
                              verify_tls=self.verify_tls, bandwidth=self.bandwidth)
        e = urllib.parse.urlsplit(self.config.endpoint)
        self._host = e.netloc if self.config.addressing == "path" else \
            f"{self.config.bucket}.{e.netloc}"

    @property
    def sent(self) -> int:
        """Bytes put on the wire: request heads and bodies, every try (its transport's)."""
        return self._http.sent

    def describe(self) -> str:
        c = self.config
        return f"s3://{c.bucket}/{c.prefix}" + (f" at {c.endpoint}" if
                                                "amazonaws.com" not in c.endpoint else "")

    def key(self, name: str) -> str:
        return f"{self.config.prefix}/{name}" if self.config.prefix else name

    def put(self, name: str, data: bytes) -> None:
        key = self.key(name)
        path = "/" + uri_encode(key, keep_slash=True)
        if self.config.addressing == "path":
            path = f"/{self.config.bucket}{path}"
        url = f"{urllib.parse.urlsplit(self.config.endpoint).scheme}://{self._host}{path}"
        sha256 = hashlib.sha256(data).hexdigest()
        for retry in (False, True):
            when = self.uplink_clock.now_ns() or clock.wall_ns()
            headers = {"Host": self._host, "Content-Type": "application/octet-stream"}
            headers.update(authorize(self.config.credentials, self.config.region, "PUT", path,
                                     "", headers, sha256, when))
            # unsigned, and named here so that http.client adds no header of its own
            headers.update({"Content-Length": str(len(data)), "Accept-Encoding": "identity"})
            reply, answer = self._http.send_put(url, self._where(key), data, headers)
            if 200 <= reply.status < 300:
                return self._check_etag(name, key, reply.getheader("ETag"), data)
            text = answer.decode(errors="replace")
            code, message = _tag(text, "Code"), _tag(text, "Message")
            server_ns = _date_ns(reply.getheader("Date"))
            skewed = code == "RequestTimeTooSkewed" or (
                reply.status in (400, 403) and server_ns is not None
                and abs(server_ns - when) > SKEW_S * 1_000_000_000)
            if skewed and not retry and server_ns is not None:
                lead = self.uplink_clock.learn(server_ns)
                log.warning("the S3 server refused a request signed at %s (%s): its clock "
                            "(Date: %s) is %+.0f s from this gateway's; signing with the "
                            "server's time from now on, carried forward on CLOCK_BOOTTIME",
                            rfc3339(when // 1_000_000), code or f"HTTP {reply.status}",
                            reply.getheader("Date"), lead)
                continue
            raise SinkError(self._refusal(name, key, reply, code, message, skewed))
        raise AssertionError("unreachable")  # the second try returns or raises

    def _check_etag(self, name: str, key: str, etag: str | None, data: bytes) -> None:
        md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
        got = (etag or "").strip().strip('"').lower()
        if self.config.verify_etag and got != md5:
            raise SinkError(f"PUT {self._where(key)}: answered 2xx with ETag "
                            f"{got or '(none)'}, not the MD5 of the {len(data)} bytes sent "
                            f"({md5}): not taken as landed (something that did not store "
                            f"them answered; for a bucket encrypted with SSE-KMS, whose "
                            f"ETags are no MD5, set sync.verify_etag = false)")

    def _where(self, key: str) -> str:
        return f"s3://{self.config.bucket}/{key}"

    def _refusal(self, name: str, key: str, reply: Any, code: str, message: str,
                 skewed: bool) -> str:
        c = self.config
        said = f"HTTP {reply.status} {code or reply.reason}" + (f": {message}" if message
                                                               else "")
        why = {
            "SignatureDoesNotMatch": f"the signature does not match: check "
                                     f"sync.secret_access_key (of access key "
                                     f"{c.credentials.access_key_id})",
            "InvalidAccessKeyId": f"the server knows no access key "
                                  f"{c.credentials.access_key_id}: check sync.access_key_id",
            "AccessDenied": f"access key {c.credentials.access_key_id} may not write "
                            f"{self._where(key)}: its policy must allow s3:PutObject on "
                            f"{c.bucket}/{self.key(name.split('/', 1)[0])}/* "
                            f"(docs/sync-and-spark.md: Landing in S3)",
            "NoSuchBucket": f"there is no bucket {c.bucket} at {c.endpoint} (check "
                            f"sync.sink and sync.endpoint; a gateway never creates one)",
            "SlowDown": "the server asks for fewer requests: retried with backoff",
            "PermanentRedirect": f"the bucket is in another region "
                                 f"({reply.getheader('x-amz-bucket-region') or 'see above'}): "
                                 f"set sync.region",
            "AuthorizationHeaderMalformed": "check sync.region (the bucket's region)",
            "XAmzContentSHA256Mismatch": "the body arrived damaged: sent again",
            "BadDigest": "the body arrived damaged: sent again",
        }.get(code, "")
        if skewed:
            why = (f"the request time differs from the server's "
                   f"({reply.getheader('Date')}) even signed with the server's own time")
        elif reply.status in (301, 307) and not why:
            why = "the endpoint sent it elsewhere: check sync.endpoint and sync.region"
        elif reply.status == 503 and not why:
            why = "the server is unavailable: retried with backoff"
        return f"PUT {self._where(key)}: {said}" + (f" ({why})" if why else "")


def _date_ns(value: str | None) -> int | None:
    """An HTTP ``Date`` (``Tue, 01 Dec 2026 23:41:11 GMT``) as ns, half a second on: the
    server's time is somewhere in that second."""
    if not value:
        return None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return int(when.timestamp()) * 1_000_000_000 + 500_000_000


def open_sink(url: str, config: Any) -> S3Sink:
    """The sink of ``url`` (``s3://BUCKET/PREFIX``) under ``config`` (sync.cli.SyncConfig):
    the settings :func:`parse` made of the url and its keys, the timeout, TLS check and
    bandwidth."""
    return S3Sink(config.sink_settings, timeout=config.timeout, verify_tls=config.verify_tls,
                  bandwidth=config.bandwidth)
