"""Which publications a realm keeps as history: its ``[[realms.history]]`` rules.

Publications are stored once, under the first rule whose pattern matches their topic. A
subscription "has history" when a rule covers every topic its pattern can match.
"""

from __future__ import annotations

from cairn.gateway.core.config import HistoryRule
from cairn.gateway.core.patterns import FirstMatch, matches


class HistoryRules:
    def __init__(self, rules: tuple[HistoryRule, ...]) -> None:
        self.rules = rules
        # index of the rule that stores publications to a topic, or None
        self.rule_for = FirstMatch([(r.uri, r.match) for r in rules])

    def is_rule(self, uri: str, match: str) -> bool:
        return any((rule.uri, rule.match) == (uri, match) for rule in self.rules)

    def covers(self, uri: str, match: str) -> bool:
        """Does some rule store every publication a subscription (uri, match) can match?"""
        for rule in self.rules:
            if (rule.uri, rule.match) == (uri, match):
                return True
            if match == "exact":
                if matches(rule.uri, rule.match, uri):
                    return True
            elif rule.match == "prefix" and _fixed_start(uri, match).startswith(rule.uri):
                return True
        return False


def _fixed_start(uri: str, match: str) -> str:
    """The text every topic matched by a pattern subscription starts with."""
    if match == "prefix":
        return uri
    fixed = []
    for part in uri.split("."):
        if not part:
            break
        fixed.append(part)
    return ".".join(fixed)
