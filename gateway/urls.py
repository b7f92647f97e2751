"""URLs as they may be shown: here, in the base package, so ``cairn doctor`` (gateway.ops)
and the uploader's sinks (sync) share one redaction without gateway importing sync."""

from __future__ import annotations

import urllib.parse


def redact_url(url: str) -> str:
    """``url`` as it may be shown and logged: without a user, password or query values
    (a presigned URL's signature, a token), which only the uploader needs."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    netloc = ("***@" if parts.username or parts.password else "") + \
        (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    query = "&".join(f"{key}=***" if value else key
                     for key, value in urllib.parse.parse_qsl(parts.query, True))
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, ""))
