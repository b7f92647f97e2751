"""URI patterns: exact, prefix and wildcard matching, shared by broker, dealer and authorizer.

WAMP prefix matching is on the string (``com.app`` matches ``com.apple``); a wildcard pattern
has empty components (``sensor..temp``) that match any one component.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


def wildcard_matches(pattern: str, uri: str) -> bool:
    pattern_parts = pattern.split(".")
    uri_parts = uri.split(".")
    if len(pattern_parts) != len(uri_parts):
        return False
    return all(p == "" or p == u for p, u in zip(pattern_parts, uri_parts, strict=True))


def matches(pattern: str, match: str, uri: str) -> bool:
    if match == "exact":
        return pattern == uri
    if match == "prefix":
        return uri.startswith(pattern)
    return wildcard_matches(pattern, uri)


# URIs a per-URI cache holds before it starts over. Sized for a gateway's topics; a client
# publishing to ever new ones (junk topics, a counter in the URI) then costs each cache at most
# this many entries, ~1 MiB, where 10,000-50,000 let the router climb by 15 MiB first.
CACHED_URIS = 4096


class FirstMatch:
    """Which of a list of rules (``(pattern, match policy)`` pairs, in order) is the first to
    match a URI, cached per URI: a config's rules, asked on every publication."""

    def __init__(self, patterns: Sequence[tuple[str, str]]) -> None:
        self.patterns = tuple(patterns)
        self._cache: dict[str, int | None] = {}

    def __call__(self, uri: str) -> int | None:
        try:
            return self._cache[uri]
        except KeyError:
            pass
        found = next((i for i, (pattern, match) in enumerate(self.patterns)
                      if matches(pattern, match, uri)), None)
        if len(self._cache) >= CACHED_URIS:
            self._cache.clear()
        self._cache[uri] = found
        return found


class PatternMap(Generic[T]):
    """Values keyed by (pattern, match policy), with fast lookup of all values matching a URI.

    Lookups of the same URI are cached until the set of patterns changes, so the publish
    path costs one dict lookup in the steady state.
    """

    def __init__(self) -> None:
        self._exact: dict[str, T] = {}
        self._prefix: dict[str, T] = {}
        self._wildcard: dict[str, T] = {}
        self._cache: dict[str, list[T]] = {}

    def _table(self, match: str) -> dict[str, T]:
        return {"exact": self._exact, "prefix": self._prefix, "wildcard": self._wildcard}[match]

    def get(self, pattern: str, match: str) -> T | None:
        return self._table(match).get(pattern)

    def add(self, pattern: str, match: str, value: T) -> None:
        self._table(match)[pattern] = value
        self._cache.clear()

    def remove(self, pattern: str, match: str) -> None:
        self._table(match).pop(pattern, None)
        self._cache.clear()

    def match(self, uri: str) -> list[T]:
        """Every value whose pattern matches ``uri``: exact first, then prefixes, then wildcards."""
        found = self._cache.get(uri)
        if found is None:
            found = list(self._compute_matches(uri))
            if len(self._cache) >= CACHED_URIS:
                self._cache.clear()
            self._cache[uri] = found
        return found

    def _compute_matches(self, uri: str) -> Iterator[T]:
        if uri in self._exact:
            yield self._exact[uri]
        if self._prefix:
            for end in range(len(uri), -1, -1):
                value = self._prefix.get(uri[:end])
                if value is not None:
                    yield value
        for pattern, value in self._wildcard.items():
            if wildcard_matches(pattern, uri):
                yield value

    def best(self, uri: str) -> T | None:
        """The most specific match: exact, else the longest prefix, else the wildcard with the
        most fixed components (ties broken lexically), as WAMP orders pattern registrations."""
        if uri in self._exact:
            return self._exact[uri]
        for end in range(len(uri), -1, -1):
            value = self._prefix.get(uri[:end])
            if value is not None:
                return value
        candidates = [p for p in self._wildcard if wildcard_matches(p, uri)]
        if not candidates:
            return None
        fixed_parts = lambda p: sum(1 for c in p.split(".") if c)  # noqa: E731
        return self._wildcard[min(candidates, key=lambda p: (-fixed_parts(p), p))]

    def items(self, match: str) -> Iterable[tuple[str, T]]:
        return self._table(match).items()

    def values(self) -> Iterator[T]:
        yield from self._exact.values()
        yield from self._prefix.values()
        yield from self._wildcard.values()
