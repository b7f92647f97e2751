"""Line-oriented text sensors: one reading per line of text on a serial port.

Two formats:

- ``ths``: an NMEA-style sentence ``$THS,<id>,<seq>,<t>,<rh>*<xor-hex>\\r\\n`` where the
  checksum is the XOR of every character between ``$`` and ``*``, as two hex digits;
- a regular expression whose named groups become the reading's fields (a group named
  ``id`` is the sensor's id instead, for ports that carry several sensors), for any other
  sensor that prints text, e.g. ``T=(?P<temperature>-?\\d+\\.\\d) H=(?P<humidity>\\d+\\.\\d)``.

A serial line delivers whatever it likes: the tail of a line when the port was opened
mid-sentence, a sentence cut short by a sensor reset, noise, a line that never ends. The
:class:`LineParser` counts each of these and skips it; nothing in the input can raise out
of :meth:`LineParser.feed`.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cairn.drivers.serial_port import SerialPort, keep_open

log = logging.getLogger("cairn.line")

THS = "ths"
MAX_LINE = 256
_TERMINATOR = re.compile(rb"[\r\n]")


def nmea_checksum(body: str) -> int:
    """XOR of the characters between ``$`` and ``*``."""
    checksum = 0
    for char in body.encode("ascii"):
        checksum ^= char
    return checksum


def ths_sentence(sensor_id: str, seq: int, temperature: float, humidity: float) -> str:
    """The sentence a THS sensor sends (without the line ending)."""
    body = f"THS,{sensor_id},{seq},{temperature:.1f},{humidity:.1f}"
    return f"${body}*{nmea_checksum(body):02X}"


class LineError(ValueError):
    kind = "malformed"


class ChecksumError(LineError):
    kind = "checksum_errors"


class MalformedLine(LineError):
    kind = "malformed"


@dataclass(frozen=True)
class Sentence:
    """One good reading: who sent it (the id field, if the format has one) and its values."""

    source: str | None
    values: dict[str, float]
    seq: int | None = None


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise MalformedLine(f"{what} is not a number: {text[:20]!r}") from None
    if not math.isfinite(value):
        raise MalformedLine(f"{what} is not a finite number: {text[:20]!r}")
    return value


def parse_ths(text: str) -> Sentence:
    """Parse ``$THS,<id>,<seq>,<t>,<rh>*<xor-hex>``; raises ChecksumError or
    MalformedLine."""
    if not text.startswith("$"):
        raise MalformedLine("does not start with $")
    body, star, checksum = text[1:].partition("*")
    if not star:
        raise MalformedLine("no *checksum")
    if len(checksum) != 2 or any(c not in "0123456789abcdefABCDEF" for c in checksum):
        raise MalformedLine(f"checksum is not two hex digits: {checksum[:8]!r}")
    if not body.isascii() or int(checksum, 16) != nmea_checksum(body):
        raise ChecksumError("checksum mismatch")
    fields = body.split(",")
    if fields[0] != "THS":
        raise MalformedLine(f"not a THS sentence: {fields[0][:10]!r}")
    if len(fields) != 5:
        raise MalformedLine(f"expected 5 fields, got {len(fields)}")
    _, sensor_id, seq, temperature, humidity = fields
    if not sensor_id:
        raise MalformedLine("empty id")
    if not seq.isdigit():
        raise MalformedLine(f"seq is not a number: {seq[:20]!r}")
    return Sentence(sensor_id, {"temperature": _number(temperature, "temperature"),
                                "humidity": _number(humidity, "humidity")}, int(seq))


class RegexFormat:
    """Named groups become fields (numbers); a group named ``id`` names the sensor."""

    def __init__(self, pattern: str | re.Pattern[str]) -> None:
        self.pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
        self.fields = [name for name in self.pattern.groupindex if name != "id"]
        if not self.fields:
            raise ValueError("the regex needs at least one named group, e.g. "
                             "(?P<temperature>-?\\d+\\.\\d+)")

    def parse(self, text: str) -> Sentence:
        match = self.pattern.search(text)
        if match is None:
            raise MalformedLine("does not match the regex")
        groups = match.groupdict()
        values = {name: _number(groups[name], name) for name in self.fields
                  if groups[name] is not None}
        if not values:
            raise MalformedLine("no field matched")
        return Sentence(groups.get("id"), values)


@dataclass
class LineStats:
    sentences: int = 0        # good readings
    checksum_errors: int = 0
    malformed: int = 0        # lines that are not a reading (garbage, wrong fields)
    partial: int = 0          # cut-off lines: the first fragment after opening, a line
    #                           cut short by the next sentence
    overlong: int = 0         # lines longer than the limit, dropped up to their end
    missed: int = 0           # gaps in a THS sensor's seq numbers


class LineParser:
    """Bytes in, sentences out. ``fmt`` is ``"ths"`` or a :class:`RegexFormat`."""

    def __init__(self, fmt: str | RegexFormat = THS, max_line: int = MAX_LINE) -> None:
        self.format = fmt
        self.max_line = max_line
        self.stats = LineStats()
        self._buf = bytearray()
        self._discarding = False
        self._first = True
        self._last_seq: dict[str | None, int] = {}

    def reset(self) -> None:
        """The port was (re)opened: what comes first may be the tail of a line."""
        self._buf.clear()
        self._discarding = False
        self._first = True

    def feed(self, data: bytes) -> list[Sentence]:
        self._buf += data
        sentences = []
        while True:
            match = _TERMINATOR.search(self._buf)
            if match is None:
                if len(self._buf) > self.max_line:
                    if not self._discarding:
                        self.stats.overlong += 1
                    self._discarding = True
                    self._buf.clear()
                return sentences
            line = bytes(self._buf[:match.start()])
            del self._buf[:match.end()]
            # a fragment before the first line end may be the tail of a line
            first, self._first = self._first, False
            if self._discarding:  # the end of an over-long line
                self._discarding = False
                continue
            if not line.strip():
                continue
            if len(line) > self.max_line:
                self.stats.overlong += 1
                continue
            sentence = self._parse(line, first)
            if sentence is not None:
                sentences.append(sentence)

    def _parse(self, line: bytes, first: bool) -> Sentence | None:
        text = line.decode("ascii", errors="replace").strip()
        try:
            if self.format == THS:
                start = text.rfind("$")
                if start < 0:
                    raise MalformedLine("no $")
                if start > 0:  # a sentence cut short by this one: skip to this one
                    self.stats.partial += 1
                    first, text = False, text[start:]
                sentence = parse_ths(text)
            else:
                sentence = self.format.parse(text)
        except LineError as e:
            kind = "partial" if first else e.kind
            setattr(self.stats, kind, getattr(self.stats, kind) + 1)
            log.debug("skipped %s line %r: %s", kind, text[:80], e)
            return None
        self.stats.sentences += 1
        if sentence.seq is not None:
            last = self._last_seq.get(sentence.source)
            if last is not None and sentence.seq > last + 1:
                self.stats.missed += sentence.seq - last - 1
            self._last_seq[sentence.source] = sentence.seq
        return sentence


@dataclass
class LineTarget:
    """One sensor on a line port; ``match_id`` picks its sentences by id (None: all)."""

    key: str
    match_id: str | None = None


class LinePort:
    """A serial port of text sentences feeding one or more sensors, reopened when it
    fails. ``on_reading(key, values)`` and ``on_error(key, reason)`` as for
    :class:`~drivers.modbus.ModbusBus`."""

    def __init__(self, port: SerialPort, parser: LineParser, targets: Sequence[LineTarget],
                 on_reading: Callable[[str, dict[str, float]], None],
                 on_error: Callable[[str, str], None], *, max_backoff: float = 2.0) -> None:
        self.port = port
        self.parser = parser
        self.targets = list(targets)
        self.on_reading = on_reading
        self.on_error = on_error
        self.max_backoff = max_backoff
        self.unmatched = 0    # good sentences from a sensor id nobody configured

    async def run(self) -> None:
        await keep_open(self.port, self._read, self._port_down, log,
                        max_backoff=self.max_backoff)

    async def _read(self) -> None:
        self.parser.reset()
        while True:
            for sentence in self.parser.feed(await self.port.read(None)):
                self.dispatch(sentence)

    def _port_down(self, reason: str) -> None:
        for target in self.targets:
            self.on_error(target.key, reason)

    def dispatch(self, sentence: Sentence) -> None:
        matched = False
        for target in self.targets:
            if target.match_id is None or target.match_id == sentence.source:
                matched = True
                try:
                    self.on_reading(target.key, sentence.values)
                except Exception:  # a broken callback must not stop the port
                    log.exception("reading from %s on %s", target.key, self.port.path)
        if not matched:
            self.unmatched += 1
            if self.unmatched in (1, 10, 100) or self.unmatched % 1000 == 0:
                log.warning("%s: %d sentences from sensor ids no [[sensors]] entry takes "
                            "(latest: %r)", self.port.path, self.unmatched, sentence.source)
