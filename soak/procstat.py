"""Resource samples of a process (RSS, open fds) and the "no growth trend" verdict on them."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

MIB = 1024 * 1024


@dataclass(frozen=True)
class Sample:
    t: float       # seconds since sampling started
    rss: int       # bytes (VmRSS)
    fds: int       # entries in /proc/PID/fd
    cpu: float     # seconds of user + system CPU so far


def sample(pid: int, t0: float) -> Sample:
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kb = next(int(line.split()[1]) for line in status.splitlines()
                  if line.startswith("VmRSS:"))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime
    return Sample(round(time.monotonic() - t0, 2), rss_kb * 1024,
                  len(os.listdir(f"/proc/{pid}/fd")), cpu)


@dataclass(frozen=True)
class Trend:
    """Growth of one quantity between the second fifth of the run (warm-up, the first
    fifth, excluded) and the last fifth, and its least-squares slope after warm-up."""

    name: str
    early: float           # median of the second fifth
    late: float            # median of the last fifth
    slope_per_min: float   # linear fit over the four fifths after warm-up
    span_min: float        # minutes those four fifths cover
    tolerance: float

    @property
    def growth(self) -> float:
        return self.late - self.early

    @property
    def fitted_growth(self) -> float:
        return self.slope_per_min * self.span_min

    def problems(self) -> list[str]:
        out = []
        if self.growth > self.tolerance:
            out.append(f"{self.name}: median of the last fifth {self.late:.1f} exceeds the "
                       f"second fifth's {self.early:.1f} by {self.growth:.1f} "
                       f"(tolerance {self.tolerance:.1f})")
        if self.fitted_growth > self.tolerance:
            out.append(f"{self.name}: fitted slope {self.slope_per_min:.2f}/min over "
                       f"{self.span_min:.1f} min = {self.fitted_growth:.1f} "
                       f"(tolerance {self.tolerance:.1f})")
        return out


def trend(name: str, times: list[float], values: list[float],
          tolerance: Callable[[float], float]) -> Trend:
    """``tolerance`` maps the second fifth's median to the growth allowed."""
    n = len(values)
    assert n >= 10, f"too few samples for a trend: {n}"
    fifth = n // 5
    early = statistics.median(values[fifth:2 * fifth])
    late = statistics.median(values[n - fifth:])
    xs, ys = [t / 60 for t in times[fifth:]], values[fifth:]
    slope = statistics.linear_regression(xs, ys).slope
    return Trend(name, early, late, slope, xs[-1] - xs[0], tolerance(early))


def rss_tolerance_mib(early_mib: float) -> float:
    """4 MiB + 5 %: room for pymalloc arenas that are not handed back, SQLite's page caches
    (2 MiB per connection by default) filling as the file grows, and the WAL index. Over the
    eight minutes after warm-up of a full run that is under 1 MiB/min: a leak of 100 bytes
    per publication (140/s come in), or 8 kB per reconnect (~120/min), crosses it."""
    return 4 + 0.05 * early_mib


def fd_tolerance(_early: float) -> float:
    """Sockets of the few churning dashboards that may be between connections at a sample;
    medians absorb most of that already."""
    return 4


def verdict(samples: list[Sample]) -> list[Trend]:
    times = [s.t for s in samples]
    return [trend("RSS (MiB)", times, [s.rss / MIB for s in samples], rss_tolerance_mib),
            trend("open fds", times, [s.fds for s in samples], fd_tolerance)]


def write_json(path: Path, meta: dict, samples: list[Sample]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**meta, "samples": [asdict(s) for s in samples]}, indent=1))


def summary(samples: list[Sample]) -> str:
    rss = [s.rss / MIB for s in samples]
    fds = [s.fds for s in samples]
    return (f"{samples[-1].t:.0f} s, {len(samples)} samples: RSS first {rss[0]:.1f} MiB, last "
            f"{rss[-1]:.1f}, max {max(rss):.1f}; fds first {fds[0]}, last {fds[-1]}, min "
            f"{min(fds)}, max {max(fds)}; router CPU {samples[-1].cpu - samples[0].cpu:.0f} s")


def table(samples: list[Sample], rows: int = 21) -> str:
    """A compact table: about ``rows`` evenly spaced samples, always the first and last."""
    step = max(1, (len(samples) - 1) // (rows - 1))
    picked = samples[::step]
    if picked[-1] is not samples[-1]:
        picked.append(samples[-1])
    lines = [f"{'t (s)':>8} {'RSS (MiB)':>10} {'fds':>5} {'CPU (s)':>8}"]
    lines += [f"{s.t:8.1f} {s.rss / MIB:10.1f} {s.fds:5d} {s.cpu:8.1f}" for s in picked]
    return "\n".join(lines)
