"""AWS Signature Version 4 of one S3 request (the ``Authorization`` header), and nothing
else: the uploader only PUTs, so no presigning, chunked payloads or session tokens.

Cairn's own signer rather than a library: botocore (the reference) is some 13 MB with
urllib3 and jmespath on a Pi that needs none of its services; ``requests-aws4auth`` brings
``requests`` for a transport Cairn already has (:mod:`http.client`, with the sinks' rules);
the small packages on PyPI are young or unmaintained. What is signed is small and
specified: the canonical request (method, URI, query, headers, the body's SHA-256), the
string to sign over its hash and the scope, and a key derived from the secret by four
HMACs. tests/pure/test_sigv4.py checks it against AWS's published S3 examples and, request
by request, against botocore's ``S3SigV4Auth`` (a test-only dependency); rclone's S3 server
checks it on every test PUT (tests/system/test_sync_s3.py).

S3's form of the canonical URI: each path segment URI-encoded once, never normalized
(``a//b`` and ``a/./b`` are keys of their own), unlike the other AWS services.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "s3"


@dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str = field(repr=False)  # never in a repr, a log line or a status


def amz_date(wall_ns: int) -> str:
    """``20130524T000000Z``: the request time as SigV4 names it (UTC, whole seconds)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(wall_ns // 1_000_000_000))


def uri_encode(text: str, keep_slash: bool) -> str:
    """RFC 3986's percent-encoding, as SigV4 wants it: only ``A-Za-z0-9-._~`` stay (and
    ``/`` in a path), the rest as UTF-8 bytes in upper-case ``%XX``."""
    return urllib.parse.quote(text, safe="/~" if keep_slash else "~")


def _canonical_query(query: str) -> str:
    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    return "&".join(f"{uri_encode(k, False)}={uri_encode(v, False)}" for k, v in sorted(pairs))


def _canonical_value(value: str) -> str:
    return " ".join(value.split())  # trimmed, inner runs of spaces as one


def signing_key(secret: str, date: str, region: str, service: str = SERVICE) -> bytes:
    key = f"AWS4{secret}".encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def canonical_request(method: str, path: str, query: str, headers: Mapping[str, str],
                      payload_sha256: str) -> tuple[str, str]:
    """(the canonical request, its signed headers) of a request whose ``path`` is already
    URI-encoded as it goes on the wire, with every header of ``headers`` signed."""
    named = sorted((k.lower(), _canonical_value(v)) for k, v in headers.items())
    signed = ";".join(k for k, _ in named)
    lines = "".join(f"{k}:{v}\n" for k, v in named)
    return "\n".join((method, path or "/", _canonical_query(query), lines, signed,
                      payload_sha256)), signed


def authorize(credentials: Credentials, region: str, method: str, path: str, query: str,
              headers: Mapping[str, str], payload_sha256: str, wall_ns: int) -> dict[str, str]:
    """The headers to add to a request of ``headers`` (``Host`` among them) signed for
    ``wall_ns``: ``x-amz-date``, ``x-amz-content-sha256`` and ``Authorization``."""
    stamp = amz_date(wall_ns)
    added = {"x-amz-date": stamp, "x-amz-content-sha256": payload_sha256}
    request, signed = canonical_request(method, path, query, {**headers, **added},
                                        payload_sha256)
    scope = f"{stamp[:8]}/{region}/{SERVICE}/aws4_request"
    to_sign = "\n".join((ALGORITHM, stamp, scope,
                         hashlib.sha256(request.encode()).hexdigest()))
    key = signing_key(credentials.secret_access_key, stamp[:8], region)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return {**added, "Authorization": f"{ALGORITHM} Credential={credentials.access_key_id}/"
                                      f"{scope}, SignedHeaders={signed}, Signature={signature}"}
