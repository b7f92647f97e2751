"""What a driver keeps for the router (drivers.backlog) and how much it keeps in flight
(drivers.in_flight), in memory. The same through a real router, Mosquitto and a pty:
tests/system/test_mqtt_bridge.py and tests/system/test_serial_driver.py."""

from __future__ import annotations

import weakref

from cairn.drivers.backlog import Backlog, Publication
from cairn.drivers.in_flight import InFlightWindow


def reading(device: str, n: int) -> Publication:
    return Publication(f"sensor.{device}", {"n": n}, device=device)


def status(device: str, state: str) -> Publication:
    return Publication(f"gateway.device.{device}.status", {"status": state}, status=True)


def sent(backlog: Backlog) -> list[tuple[str, object]]:
    """Take everything waiting, as the link sends it: (topic, n or status)."""
    out = []
    while backlog.next() is not None:
        pub = backlog.take()
        out.append((pub.topic, pub.kwargs.get("n", pub.kwargs.get("status"))))
    return out


# -- bounds per device -------------------------------------------------------------------


def test_a_full_device_drops_its_own_oldest_reading():
    backlog = Backlog(per_device=3)
    dropped = [d.kwargs["n"] for n in range(5) for d in backlog.add(reading("a", n))]
    assert dropped == [0, 1]
    assert sent(backlog) == [("sensor.a", 2), ("sensor.a", 3), ("sensor.a", 4)]


def test_a_noisy_device_cannot_push_out_another_devices_readings():
    backlog = Backlog(per_device=3)
    backlog.add(reading("quiet", 1))
    dropped = [d.device for n in range(100) for d in backlog.add(reading("noisy", n))]
    backlog.add(reading("quiet", 2))
    assert set(dropped) == {"noisy"} and len(dropped) == 97
    assert [x for x in sent(backlog) if x[0] == "sensor.quiet"] == \
        [("sensor.quiet", 1), ("sensor.quiet", 2)]


def test_the_total_bound_drops_from_the_device_with_the_most_waiting():
    backlog = Backlog(per_device=10, total=6)
    for n in range(2):
        backlog.add(reading("a", n))
    for n in range(4):
        backlog.add(reading("b", n))
    dropped = backlog.add(reading("a", 2))
    assert [(d.device, d.kwargs["n"]) for d in dropped] == [("b", 0)]
    assert backlog.waiting_of("a") == 3 and backlog.waiting_of("b") == 3


def test_a_flood_over_many_devices_stays_within_the_total_bound():
    backlog = Backlog(per_device=5, total=50)
    for n in range(10_000):
        backlog.add(reading(f"d{n}", n))
    assert backlog.waiting == 50


def test_readings_go_out_in_the_order_they_came_across_devices():
    backlog = Backlog(per_device=2)
    for device, n in [("a", 1), ("b", 1), ("a", 2), ("a", 3), ("b", 2)]:
        backlog.add(reading(device, n))
    assert sent(backlog) == [("sensor.b", 1), ("sensor.a", 2), ("sensor.a", 3),
                             ("sensor.b", 2)]


def test_dropped_readings_are_not_kept_in_memory():
    backlog = Backlog(per_device=1)
    first = reading("a", 0)
    kept = weakref.ref(first)
    backlog.add(first)
    del first
    for n in range(1, 1000):
        backlog.add(reading("a", n))
    assert kept() is None


# -- statuses ----------------------------------------------------------------------------


def test_a_status_is_never_dropped_for_room():
    backlog = Backlog(per_device=2, total=2)
    backlog.add(status("a", "ok"))
    for n in range(10):
        backlog.add(reading("a", n))
    assert ("gateway.device.a.status", "ok") in sent(backlog)


def test_a_newer_status_replaces_the_one_still_waiting():
    backlog = Backlog()
    backlog.add(status("a", "ok"))
    backlog.add(status("a", "error"))
    backlog.add(status("b", "ok"))
    assert sent(backlog) == [("gateway.device.a.status", "error"),
                             ("gateway.device.b.status", "ok")]


# -- in flight ---------------------------------------------------------------------------


def test_what_is_in_flight_is_never_dropped_for_room():
    backlog = Backlog(per_device=2)
    for n in range(2):
        backlog.add(reading("a", n))
    flying = [backlog.take(), backlog.take()]
    for n in range(2, 6):
        backlog.add(reading("a", n))
    assert not any(pub.gone for pub in flying) and len(backlog) == 4


def test_what_was_not_acknowledged_is_sent_again_first_in_its_order():
    backlog = Backlog()
    for n in range(4):
        backlog.add(reading("a", n))
    flying = [backlog.take(), backlog.take()]
    backlog.put_back(flying)
    assert sent(backlog) == [("sensor.a", n) for n in range(4)]


def test_put_back_readings_over_the_bound_are_the_oldest_dropped():
    backlog = Backlog(per_device=3)
    for n in range(3):
        backlog.add(reading("a", n))
    flying = [backlog.take(), backlog.take()]
    for n in range(3, 5):
        backlog.add(reading("a", n))
    dropped = backlog.put_back(flying)
    assert [d.kwargs["n"] for d in dropped] == [0, 1]
    assert sent(backlog) == [("sensor.a", 2), ("sensor.a", 3), ("sensor.a", 4)]


def test_a_status_put_back_behind_a_newer_one_is_not_sent_again():
    backlog = Backlog()
    backlog.add(status("a", "ok"))
    flying = backlog.take()
    backlog.add(status("a", "stale"))
    backlog.put_back([flying])
    assert sent(backlog) == [("gateway.device.a.status", "stale")]


def test_the_length_counts_what_waits_and_what_is_in_flight():
    backlog = Backlog()
    for n in range(3):
        backlog.add(reading("a", n))
    pub = backlog.take()
    assert len(backlog) == 3
    backlog.done(pub)
    assert len(backlog) == 2


# -- the in-flight window ----------------------------------------------------------------


def fill(window: InFlightWindow, size: int = 50) -> int:
    """Send while the window has room (more is always waiting); how many were sent."""
    n = 0
    while window.has_room(size):
        window.sent(size)
        n += 1
    return n


def round_trip(window: InFlightWindow, size: int = 50) -> int:
    """Acknowledge everything in flight, then fill again."""
    for _ in range(window.count):
        window.acknowledged(size)
    return fill(window, size)


def test_the_window_starts_with_a_full_group_commit():
    assert fill(InFlightWindow()) == InFlightWindow.initial


def test_the_window_doubles_each_round_trip_while_it_holds_the_sender_back():
    window = InFlightWindow(initial=16, most=1000)
    fill(window)
    assert [round_trip(window) for _ in range(3)] == [32, 64, 128]


def test_the_window_does_not_grow_while_the_backlog_is_what_holds_back():
    window = InFlightWindow(initial=16)
    for _ in range(5):
        window.sent(50)
    window.caught_up()
    for _ in range(5):
        window.acknowledged(50)
    assert window.limit == 16


def test_the_window_is_bounded_by_count():
    window = InFlightWindow(initial=16, most=40)
    fill(window)
    for _ in range(5):
        round_trip(window)
    assert window.limit == 40 and window.count == 40


def test_the_window_is_bounded_by_bytes_but_always_lets_one_through():
    window = InFlightWindow(initial=100, most_bytes=1000)
    assert fill(window, size=300) == 3
    assert fill(InFlightWindow(most_bytes=1000), size=5000) == 1


def test_a_congested_router_halves_the_window():
    window = InFlightWindow(initial=64)
    window.congested()
    assert window.limit == 32
    for _ in range(10):
        window.congested()
    assert window.limit == window.fewest
