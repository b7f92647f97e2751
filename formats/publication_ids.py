"""Publication ids of stored publications: a keyed permutation of ``seq`` onto [1, 2**53].

WAMP draws publication ids at random from [1, 2**53]. A stored publication is later named by
its id (``get_events`` with ``after_publication`` and the like), and finding a random id among
a million rows takes an index, and an index on random keys costs the SD card pages on every
commit. So a stored publication's id is computed from its seq by a bijection that looks
random (keyed, per database, multiply-xorshift steps, each invertible on 53 bits), and its seq
is computed back from the id: no index, one row lookup. Ids never repeat, since seqs do not.
This guards nothing (publication ids are not secrets); it only has to look uniform.
"""

from __future__ import annotations

import secrets

BITS = 53
_MASK = (1 << BITS) - 1
SHIFT = 27  # 2 * 27 >= 53: x ^= x >> 27 is its own inverse
# odd constants (from the golden ratio and splitmix64), so multiplying is a bijection mod 2**53
MULTIPLIERS = (0x9E3779B97F4A7C15 & _MASK, 0xBF58476D1CE4E5B9 & _MASK,
                0x94D049BB133111EB & _MASK)
_INVERSES = tuple(pow(c, -1, 1 << BITS) for c in MULTIPLIERS)


def new_key() -> bytes:
    return secrets.token_bytes(16)


class PublicationIds:
    def __init__(self, key: bytes) -> None:
        if len(key) != 16:
            raise ValueError("a publication id key is 16 bytes")
        self._k0 = int.from_bytes(key[:8], "big") & _MASK
        self._k1 = int.from_bytes(key[8:], "big") & _MASK

    def of_seq(self, seq: int) -> int:
        """The publication id of the stored publication ``seq`` (0 <= seq < 2**53)."""
        c1, c2, c3 = MULTIPLIERS
        x = (seq + self._k0) & _MASK
        x = (x * c1) & _MASK
        x ^= x >> SHIFT
        x = ((x + self._k1) * c2) & _MASK
        x ^= x >> SHIFT
        x = (x * c3) & _MASK
        x ^= x >> SHIFT
        return x + 1

    def seq_of(self, publication: int) -> int:
        """The seq whose publication id this is (any id in [1, 2**53] has one; whether
        such a row is stored is for the store to say)."""
        i1, i2, i3 = _INVERSES
        x = (publication - 1) & _MASK
        x ^= x >> SHIFT
        x = (x * i3) & _MASK
        x ^= x >> SHIFT
        x = ((x * i2) - self._k1) & _MASK
        x ^= x >> SHIFT
        x = (x * i1) & _MASK
        return (x - self._k0) & _MASK
