"""The transport layer's own pieces: unmasking what WebSocket clients send."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from gateway.transport import XorMasker


def masked(data: bytes, mask: bytes) -> bytes:
    """RFC 6455, 5.3: octet i of the payload is XORed with octet i modulo 4 of the mask."""
    return bytes(byte ^ mask[i % 4] for i, byte in enumerate(data))


@given(data=st.binary(max_size=2000), mask=st.binary(min_size=4, max_size=4),
       cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=6))
def test_a_frame_is_unmasked_whatever_the_pieces_its_payload_arrives_in(data, mask, cuts):
    masker = XorMasker(mask, len(data))
    wire = masked(data, mask)
    bounds = [0, *sorted(min(cut, len(data)) for cut in cuts), len(data)]
    pieces = [masker.process(wire[a:b]) for a, b in itertools.pairwise(bounds)]
    assert b"".join(pieces) == data
    assert masker.pointer() == len(data)


def test_the_websocket_parser_uses_the_masker():
    from autobahn.websocket import protocol

    assert protocol.create_xor_masker is XorMasker
