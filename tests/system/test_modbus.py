"""Modbus RTU master: the wire format on its own, then real exchanges over a pty with the
simulated bus, including every fault the simulator can inject."""

from __future__ import annotations

import asyncio
import time

import pytest

from cairn.drivers.modbus import (
    XY_MD02,
    CRCError,
    ExceptionResponse,
    FrameError,
    ModbusBus,
    ModbusMaster,
    NoAnswer,
    PollTarget,
    Register,
    crc16,
    crc_ok,
    decode,
    find_response,
    frame_gap,
    parse_response,
    read_request,
    register_block,
    with_crc,
)
from cairn.drivers.serial_port import PortError, SerialPort
from cairn.drivers.simulator import Simulator
from harness.waiting import until

BAUD = 115200


# --- wire format ------------------------------------------------------------------------------

def test_crc16_matches_the_catalogued_check_value():
    assert crc16(b"123456789") == 0x4B37  # CRC-16/MODBUS check value


def test_read_input_registers_request_matches_the_xy_md02_data_sheet():
    assert read_request(1, 4, 1, 2) == bytes.fromhex("01 04 00 01 00 02 20 0B")


def test_read_holding_registers_request_matches_the_xy_md02_data_sheet():
    assert read_request(1, 3, 0x101, 1) == bytes.fromhex("01 03 01 01 00 01 D4 36")


def test_a_frame_with_its_crc_appended_checks_out_and_a_flipped_bit_does_not():
    frame = with_crc(bytes.fromhex("01 04 04 00 D7 01 E3"))
    assert crc_ok(frame)
    assert not crc_ok(frame[:3] + bytes([frame[3] ^ 0x01]) + frame[4:])


@pytest.mark.parametrize("address, function, start, count", [
    (0, 4, 1, 2), (248, 4, 1, 2), (1, 6, 1, 2), (1, 4, 1, 0), (1, 4, 1, 126),
    (1, 4, 0xFFFF, 2), (1, 4, -1, 1),
])
def test_read_request_refuses_what_modbus_cannot_express(address, function, start, count):
    with pytest.raises(ValueError):
        read_request(address, function, start, count)


def test_find_response_skips_noise_before_the_answer():
    answer = with_crc(bytes.fromhex("01 04 04 00 D7 01 E3"))
    scan = find_response(b"\x00\xff\x01\x99" + answer, 1, 4, 2)
    assert scan.frame == answer and scan.skipped == 4


def test_find_response_waits_for_the_rest_of_a_frame():
    answer = with_crc(bytes.fromhex("01 04 04 00 D7 01 E3"))
    scan = find_response(answer[:6], 1, 4, 2)
    assert scan.frame is None and scan.waiting


def test_find_response_flags_a_complete_frame_with_a_bad_crc():
    answer = with_crc(bytes.fromhex("01 04 04 00 D7 01 E3"))
    scan = find_response(answer[:-1] + bytes([answer[-1] ^ 0xFF]), 1, 4, 2)
    assert scan.frame is None and scan.bad_crc and not scan.waiting


def test_find_response_ignores_an_answer_from_another_address():
    other = with_crc(bytes.fromhex("02 04 04 00 D7 01 E3"))
    assert find_response(other, 1, 4, 2).frame is None


def test_exception_response_raises_with_the_code_name():
    frame = with_crc(bytes.fromhex("01 84 02"))
    with pytest.raises(ExceptionResponse) as caught:
        parse_response(frame, 4, 2)
    assert caught.value.code == 2 and caught.value.name == "ILLEGAL DATA ADDRESS"
    assert "ILLEGAL DATA ADDRESS" in str(caught.value)


def test_frame_gap_is_three_and_a_half_characters_up_to_19200_baud_then_1750_us():
    assert frame_gap(9600, 11 / 9600) == pytest.approx(3.5 * 11 / 9600)
    assert frame_gap(115200, 11 / 115200) == 0.00175


def test_xy_md02_map_decodes_signed_tenths():
    assert decode(XY_MD02, 1, [0x00D7, 0x01E3]) == {"temperature": 21.5, "humidity": 48.3}
    assert decode(XY_MD02, 1, [0xFFCB, 0x0000])["temperature"] == -5.3


def test_unsigned_register_reads_the_same_word_as_a_large_positive_value():
    assert Register("t", 1, signed=False).decode(0xFFCB) == 6548.3


def test_scale_and_offset_apply_and_round_to_their_precision():
    assert Register("t", 0, scale=0.01, offset=-0.5).decode(2153) == 21.03
    assert Register("p", 0, signed=False, scale=1).decode(1013) == 1013


def test_register_map_with_a_gap_is_read_as_one_block():
    registers = (Register("temperature", 0x10), Register("humidity", 0x14))
    assert register_block(registers) == (0x10, 5)
    assert decode(registers, 0x10, [215, 0, 0, 0, 483]) == {"temperature": 21.5,
                                                            "humidity": 48.3}


# --- over a pty -------------------------------------------------------------------------------

@pytest.fixture
async def sim(tmp_path):
    async with Simulator(tmp_path, modbus=3, line=0, baudrate=BAUD, seed=7) as sim:
        yield sim


@pytest.fixture
async def master(sim):
    port = SerialPort(str(sim.bus.link), BAUD)
    await port.open()
    yield ModbusMaster(port, timeout=0.2, retries=2)
    port.close()


async def test_reads_temperature_and_humidity_from_input_registers(sim, master):
    sim.bus.devices[1].hold(temperature=21.5, humidity=48.3)
    words = await master.read_registers(1, 4, 1, 2)
    assert decode(XY_MD02, 1, words) == {"temperature": 21.5, "humidity": 48.3}


async def test_reads_holding_registers_with_function_3(sim, master):
    assert await master.read_registers(2, 3, 0x101, 1) == [2]


async def test_bad_crc_is_retried_and_counted(sim, master):
    sim.bus.inject("bad_crc", times=1, address=1)
    sim.bus.devices[1].hold(temperature=20.0, humidity=40.0)
    assert await master.read_registers(1, 4, 1, 2) == [200, 400]
    assert master.stats[1].bad_crc == 1 and master.stats[1].retries == 1


async def test_bad_crc_on_every_try_raises_crc_error(sim, master):
    sim.bus.inject("bad_crc", times=3, address=1)
    with pytest.raises(CRCError, match=r"address 1 \(3 tries\)"):
        await master.read_registers(1, 4, 1, 2)
    assert master.stats[1].requests == 3


async def test_no_answer_times_out_after_the_response_timeout(sim, master):
    sim.bus.inject("no_answer", times=1)
    started = time.monotonic()
    with pytest.raises(NoAnswer, match="no answer from address 1 within 0.1 s"):
        await master.read_registers(1, 4, 1, 2, timeout=0.1, retries=0)
    assert 0.1 <= time.monotonic() - started < 0.5


async def test_no_answer_then_an_answer_succeeds_on_retry(sim, master):
    sim.bus.inject("no_answer", times=2)
    assert len(await master.read_registers(1, 4, 1, 2, timeout=0.05)) == 2
    assert master.stats[1].no_answer == 2 and master.stats[1].ok == 1


async def test_garbage_instead_of_an_answer_is_a_frame_error(sim, master):
    sim.bus.inject("garbage", times=1)
    with pytest.raises((FrameError, CRCError)):
        await master.read_registers(1, 4, 1, 2, timeout=0.1, retries=0)
    assert len(await master.read_registers(1, 4, 1, 2)) == 2  # resynchronised


async def test_noise_before_the_answer_is_skipped_without_a_retry(sim, master):
    sim.bus.inject("noise", times=1)
    assert len(await master.read_registers(1, 4, 1, 2)) == 2
    assert master.stats[1].retries == 0 and master.stats[1].noise_bytes > 0


async def test_exception_response_is_final_and_names_the_code(sim, master):
    sim.bus.inject("exception", times=1, code=6)
    with pytest.raises(ExceptionResponse, match="0x06 SERVER DEVICE BUSY"):
        await master.read_registers(1, 4, 1, 2)
    assert master.stats[1].requests == 1 and master.stats[1].exception == 1


async def test_unmapped_register_gets_illegal_data_address(sim, master):
    with pytest.raises(ExceptionResponse) as caught:
        await master.read_registers(1, 4, 100, 2)
    assert caught.value.code == 2


async def test_an_address_nobody_has_gets_no_answer(sim, master):
    with pytest.raises(NoAnswer):
        await master.read_registers(9, 4, 1, 2, timeout=0.05, retries=0)


async def test_a_device_at_another_baud_rate_does_not_answer(sim):
    port = SerialPort(str(sim.bus.link), 9600)
    await port.open()
    try:
        with pytest.raises(NoAnswer):
            await ModbusMaster(port).read_registers(1, 4, 1, 2, timeout=0.1, retries=0)
    finally:
        port.close()
    assert sim.bus.baud_mismatch == 1


async def test_the_master_keeps_the_inter_frame_gap(tmp_path):
    async with Simulator(tmp_path, modbus=1, line=0, baudrate=9600) as sim:
        answers: list[float] = []
        requests: list[float] = []
        write, received = sim.bus.write, sim.bus.received
        sim.bus.write = lambda data: (answers.append(time.monotonic()), write(data))
        sim.bus.received = lambda data: (requests.append(time.monotonic()), received(data))
        port = SerialPort(str(sim.bus.link), 9600, parity="E")
        await port.open()
        master = ModbusMaster(port)
        for _ in range(5):
            await master.read_registers(1, 4, 1, 2)
        port.close()
    gaps = [request - answer for answer, request in zip(answers, requests[1:], strict=False)]
    assert len(gaps) == 4 and min(gaps) >= 3.5 * 11 / 9600


async def test_a_transaction_takes_at_least_the_bus_time(tmp_path):
    async with Simulator(tmp_path, modbus=1, line=0, baudrate=9600) as sim:
        port = SerialPort(str(sim.bus.link), 9600, parity="E")
        await port.open()
        master = ModbusMaster(port)
        started = time.monotonic()
        for _ in range(5):
            await master.read_registers(1, 4, 1, 2)
        elapsed = time.monotonic() - started
        port.close()
    assert elapsed >= 5 * (8 + 9) * 11 / 9600


async def test_a_port_another_program_holds_is_refused(sim, master):
    with pytest.raises(PortError, match="in use by another program"):
        await SerialPort(str(sim.bus.link), BAUD).open()


async def test_port_error_when_the_adapter_is_unplugged(sim, master):
    sim.bus.unplug()
    with pytest.raises(PortError, match="disconnected"):
        await master.read_registers(1, 4, 1, 2)


# --- the bus poller ---------------------------------------------------------------------------

class Recorder:
    def __init__(self) -> None:
        self.readings: list[tuple[str, dict]] = []
        self.errors: list[tuple[str, str]] = []

    def reading(self, key: str, values: dict) -> None:
        self.readings.append((key, values))

    def error(self, key: str, reason: str) -> None:
        self.errors.append((key, reason))



async def run_bus(sim, targets, seconds: float | None = None, until_=None) -> Recorder:
    rec = Recorder()
    bus = ModbusBus(SerialPort(str(sim.bus.link), BAUD), targets, rec.reading, rec.error)
    task = asyncio.create_task(bus.run())
    try:
        if until_ is not None:
            await until(lambda: until_(rec))
        else:
            await asyncio.sleep(seconds)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return rec


async def test_several_devices_on_one_bus_are_polled_in_turn(sim):
    for address in (1, 2, 3):
        sim.bus.devices[address].hold(temperature=20.0 + address, humidity=40.0 + address)
    targets = [PollTarget(f"d{a}", a, interval=0.05) for a in (1, 2, 3)]
    rec = await run_bus(sim, targets, until_=lambda r: len(r.readings) >= 9)
    assert [key for key, _ in rec.readings[:6]] == ["d1", "d2", "d3"] * 2
    assert dict(rec.readings) == {f"d{a}": {"temperature": 20.0 + a, "humidity": 40.0 + a}
                                  for a in (1, 2, 3)}
    assert not rec.errors


async def test_each_device_is_polled_on_its_own_interval(sim):
    targets = [PollTarget("fast", 1, interval=0.05), PollTarget("slow", 2, interval=0.4)]
    rec = await run_bus(sim, targets, seconds=0.9)
    fast = sum(key == "fast" for key, _ in rec.readings)
    slow = sum(key == "slow" for key, _ in rec.readings)
    assert slow in (2, 3) and fast >= 3 * slow


async def test_a_clone_register_map_with_holding_registers_and_hundredths(sim):
    clone = ((3, Register("humidity", 0, signed=False, scale=0.01)),
             (3, Register("temperature", 1, scale=0.01)))
    device = sim.bus.add_device(5, layout=clone)
    device.hold(temperature=-3.21, humidity=48.27)
    registers = (Register("temperature", 1, scale=0.01),
                 Register("humidity", 0, signed=False, scale=0.01))
    rec = await run_bus(sim, [PollTarget("clone", 5, function=3, registers=registers)],
                        until_=lambda r: r.readings)
    assert rec.readings[0] == ("clone", {"temperature": -3.21, "humidity": 48.27})


async def test_a_failed_poll_reports_the_device_and_the_others_carry_on(sim):
    targets = [PollTarget("here", 1, interval=0.05),
               PollTarget("gone", 9, interval=0.05, timeout=0.05, retries=1)]
    rec = await run_bus(sim, targets, until_=lambda r: r.errors and len(r.readings) >= 3)
    assert rec.errors[0] == ("gone", f"no answer from address 9 within 0.05 s (2 tries) on "
                                     f"{sim.bus.link}")


async def test_an_exception_response_is_reported_with_the_registers(sim):
    target = PollTarget("wrong-map", 1, registers=(Register("temperature", 100),))
    rec = await run_bus(sim, [target], until_=lambda r: r.errors)
    assert "exception 0x02 ILLEGAL DATA ADDRESS" in rec.errors[0][1]
    assert rec.errors[0][1].endswith("(registers 100..100)")


async def test_the_bus_reopens_the_port_after_an_unplug(sim):
    targets = [PollTarget("d1", 1, interval=0.05)]
    rec = Recorder()
    bus = ModbusBus(SerialPort(str(sim.bus.link), BAUD), targets, rec.reading, rec.error)
    task = asyncio.create_task(bus.run())
    try:
        await until(lambda: rec.readings)
        sim.bus.unplug()
        await until(lambda: rec.errors)
        assert "disconnected" in rec.errors[0][1] or "cannot open" in rec.errors[0][1]
        count = len(rec.readings)
        sim.bus.plug()
        await until(lambda: len(rec.readings) > count)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert bus.port_failures >= 1
