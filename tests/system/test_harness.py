"""The test harness itself, where its behaviour is not obvious."""

from __future__ import annotations

import socket

from harness import process
from harness.config import open_realm
from harness.process import RouterProcess


def test_a_router_process_whose_free_port_was_taken_meanwhile_starts_on_another(
        tmp_path, monkeypatch):
    """free_port says what is free now; another test run may bind it before the router."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        real = process.free_port
        ports = iter([taken.getsockname()[1]])
        monkeypatch.setattr(process, "free_port", lambda: next(ports, None) or real())
        router = RouterProcess(tmp_path, open_realm())
        assert router.port == taken.getsockname()[1]
        try:
            router.start()
            assert router.port != taken.getsockname()[1]
            with socket.create_connection(("127.0.0.1", router.port), 2):
                pass
        finally:
            router.stop()
    assert any("address already in use" in line for line in router.log_lines())
