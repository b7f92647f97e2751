"""Line-oriented text sensors: the $THS sentence, regex formats, and everything a serial
line can deliver instead of a clean line, counted and skipped; then a pty with the
simulated sensor."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cairn.drivers.line import (
    ChecksumError,
    LineParser,
    LinePort,
    LineTarget,
    MalformedLine,
    RegexFormat,
    Sentence,
    nmea_checksum,
    parse_ths,
    ths_sentence,
)
from cairn.drivers.serial_port import SerialPort
from cairn.drivers.simulator import Simulator
from harness.waiting import until

GOOD = ths_sentence("shed", 7, 21.5, 48.3)


def test_checksum_matches_a_published_nmea_sentence():
    sentence = "GPGGA,123519,4807.038,N,01131.000,E,1,08,0.9,545.4,M,46.9,M,,"
    assert nmea_checksum(sentence) == 0x47


def test_ths_sentence_parses_to_id_seq_and_values():
    assert ths_sentence("shed", 7, 21.5, 48.3) == "$THS,shed,7,21.5,48.3*6B"
    assert parse_ths(GOOD) == Sentence("shed", {"temperature": 21.5, "humidity": 48.3}, 7)


def test_lowercase_hex_checksum_is_accepted():
    assert parse_ths(GOOD[:-2] + GOOD[-2:].lower()).seq == 7


def test_checksum_mismatch_raises_checksum_error():
    with pytest.raises(ChecksumError):
        parse_ths(GOOD.replace("21.5", "27.5"))


@pytest.mark.parametrize("line", [
    "$THS,shed,7,21.5,48.3",                        # no checksum
    "$THS,shed,7,21.5,48.3*4",                      # one hex digit
    "$THS,shed,7,21.5,48.3*ZZ",                     # not hex
])
def test_a_missing_or_unreadable_checksum_is_malformed(line):
    with pytest.raises(MalformedLine):
        parse_ths(line)


@pytest.mark.parametrize("body", [
    "THS,shed,7,21.5", "THS,shed,7,21.5,48.3,1", "THX,shed,7,21.5,48.3",
    "THS,shed,x,21.5,48.3", "THS,shed,7,warm,48.3", "THS,,7,21.5,48.3", "THS,shed,7,nan,48.3",
])
def test_wrong_fields_with_a_good_checksum_are_malformed(body):
    with pytest.raises(MalformedLine):
        parse_ths(f"${body}*{nmea_checksum(body):02X}")


def parsed(parser: LineParser, data: bytes) -> list[dict]:
    return [s.values for s in parser.feed(data)]


def opened() -> LineParser:
    """A parser past its first line (which may be the tail of one)."""
    parser = LineParser()
    parser.feed(b"\n")
    return parser


def test_a_line_split_across_reads_is_reassembled():
    parser = opened()
    data = (GOOD + "\r\n").encode()
    out = [v for i in range(len(data)) for v in parsed(parser, data[i:i + 1])]
    assert out == [{"temperature": 21.5, "humidity": 48.3}]


@pytest.mark.parametrize("ending", [b"\r\n", b"\n", b"\r"])
def test_any_line_ending_ends_a_line(ending):
    parser = opened()
    assert len(parsed(parser, (GOOD.encode() + ending) * 3)) == 3
    assert parser.stats.malformed == 0


def test_a_bad_checksum_is_counted_and_the_next_line_still_read():
    parser = opened()
    bad = GOOD.replace("21.5", "27.5")
    assert len(parsed(parser, f"{bad}\r\n{GOOD}\r\n".encode())) == 1
    assert parser.stats.checksum_errors == 1 and parser.stats.sentences == 1


def test_the_first_fragment_after_opening_counts_as_partial():
    parser = LineParser()
    assert len(parsed(parser, f"3,48.3*1F\r\n{GOOD}\r\n".encode())) == 1
    assert parser.stats.partial == 1 and parser.stats.malformed == 0


def test_a_sentence_cut_off_by_the_next_keeps_the_next():
    parser = opened()
    out = parsed(parser, f"{GOOD[:12]}{GOOD}\r\n".encode())
    assert out == [{"temperature": 21.5, "humidity": 48.3}]
    assert parser.stats.partial == 1


def test_an_over_long_line_is_dropped_up_to_its_end():
    parser = LineParser(max_line=64)
    parser.feed(b"\n")
    assert parsed(parser, b"#" * 50) == []
    assert parsed(parser, b"#" * 50) == []          # past the limit: dropped, once
    assert parsed(parser, b"#" * 500 + f"\r\n{GOOD}\r\n".encode()) == [
        {"temperature": 21.5, "humidity": 48.3}]
    assert parser.stats.overlong == 1 and parser.stats.malformed == 0


def test_an_over_long_line_that_arrives_whole_is_dropped():
    parser = LineParser(max_line=64)
    parser.feed(b"\n")
    assert parsed(parser, b"$" + b"9" * 100 + b"\r\n") == []
    assert parser.stats.overlong == 1


def test_binary_garbage_is_counted_as_malformed():
    parser = opened()
    assert parsed(parser, b"\x00\xff\xfe$\x81*\x7f\r\n" + f"{GOOD}\r\n".encode()) == [
        {"temperature": 21.5, "humidity": 48.3}]
    assert parser.stats.malformed + parser.stats.checksum_errors == 1


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600), st.integers(min_value=1, max_value=64))
def test_no_input_makes_the_parser_raise_or_lose_the_next_good_line(noise, chunk):
    parser = LineParser()
    data = noise + b"\n" + f"{GOOD}\r\n".encode()
    out = []
    for i in range(0, len(data), chunk):
        out += parser.feed(data[i:i + chunk])
    assert out and out[-1].values == {"temperature": 21.5, "humidity": 48.3}


def test_gaps_in_seq_are_counted_as_missed():
    parser = opened()
    lines = [ths_sentence("a", seq, 20.0, 50.0) for seq in (1, 2, 5, 6)]
    parser.feed("\n".join(lines + [""]).encode())
    assert parser.stats.missed == 2


def test_regex_named_groups_become_fields():
    parser = LineParser(RegexFormat(r"^T=(?P<temperature>-?\d+\.\d+) H=(?P<humidity>\d+)%$"))
    parser.feed(b"\n")
    assert parsed(parser, b"T=-4.25 H=81%\n") == [{"temperature": -4.25, "humidity": 81.0}]


def test_regex_id_group_names_the_sensor():
    fmt = RegexFormat(r"(?P<id>\w+): (?P<pressure>\d+) hPa")
    assert fmt.parse("roof: 1013 hPa") == Sentence("roof", {"pressure": 1013.0})


def test_a_line_the_regex_does_not_match_is_malformed():
    parser = LineParser(RegexFormat(r"^T=(?P<temperature>-?\d+\.\d+)$"))
    parser.feed(b"\n")
    assert parsed(parser, b"hello\nT=1.5\n") == [{"temperature": 1.5}]
    assert parser.stats.malformed == 1


def test_a_regex_group_that_is_not_a_number_is_malformed():
    parser = LineParser(RegexFormat(r"^T=(?P<temperature>\S+)$"))
    parser.feed(b"\n")
    assert parsed(parser, b"T=warm\n") == [] and parser.stats.malformed == 1


def test_a_regex_without_named_groups_is_refused():
    with pytest.raises(ValueError, match="named group"):
        RegexFormat(r"T=(\d+)")


def test_several_sensors_on_one_port_get_their_own_sentences():
    got = []
    port = LinePort(SerialPort("/dev/null"), LineParser(),
                    [LineTarget("a", "ths-a"), LineTarget("b", "ths-b")],
                    lambda key, values: got.append((key, values["temperature"])),
                    lambda key, reason: None)
    for source, t in (("ths-b", 2.0), ("ths-a", 1.0), ("ths-c", 3.0)):
        port.dispatch(Sentence(source, {"temperature": t}))
    assert got == [("b", 2.0), ("a", 1.0)] and port.unmatched == 1


# --- over a pty -------------------------------------------------------------------------------


@pytest.fixture
async def line_sim(tmp_path):
    async with Simulator(tmp_path, modbus=0, line=1, line_interval=0.02, seed=3) as sim:
        yield sim


@pytest.fixture
async def reader(line_sim):
    readings, errors = [], []
    port = LinePort(SerialPort(str(line_sim.lines[0].link)), LineParser(),
                    [LineTarget("shed", "ths0")],
                    lambda key, values: readings.append(values),
                    lambda key, reason: errors.append(reason))
    task = asyncio.create_task(port.run())
    port.readings, port.errors = readings, errors
    yield port
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_sentences_from_a_pty_become_readings(line_sim, reader):
    line_sim.lines[0].hold(temperature=19.5, humidity=61.0)
    await until(lambda: len(reader.readings) >= 3)
    assert reader.readings[-1] == {"temperature": 19.5, "humidity": 61.0}


async def test_every_simulated_line_fault_is_counted_and_skipped(line_sim, reader):
    sensor = line_sim.lines[0]
    await until(lambda: reader.readings)
    for fault in ("partial", "bad_checksum", "garbage", "overlong", "split", "silence"):
        sensor.inject(fault)
    await until(lambda: not sensor.faults and len(reader.readings) >= 12)
    stats = reader.parser.stats
    assert stats.overlong == 1 and stats.checksum_errors >= 1
    # the cut-off sentence, the bad checksum and the garbage (which, when it holds a "$",
    # counts as a cut-off sentence)
    assert stats.partial >= 1 and stats.partial + stats.checksum_errors + stats.malformed == 3
    assert stats.missed == 5   # every fault but the split cost a sentence


async def test_unplug_reports_an_error_and_replug_brings_readings_back(line_sim, reader):
    sensor = line_sim.lines[0]
    await until(lambda: reader.readings)
    sensor.unplug()
    await until(lambda: reader.errors)
    assert reader.errors[0] == f"{sensor.link} disconnected"
    count = len(reader.readings)
    sensor.plug()
    await until(lambda: len(reader.readings) > count)
