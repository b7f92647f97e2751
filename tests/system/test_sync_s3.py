"""The S3 sink (``sink = "s3://BUCKET/PREFIX"``, sync.sinks.s3, issue 48) against a real S3
server: rclone's ``serve s3`` on loopback (harness.s3_server), which checks every signature
and the request time, with a fault proxy in front of it for what rclone never does by itself
(a 503 SlowDown, a connection cut mid-PUT, a 200 with another ETag, AWS's AccessDenied of a
key whose policy does not allow the PUT); the wrong-clock path with the gateway's wall clock
years off in a process of its own (tests/fakeclock).

The signer (sync.sinks.sigv4) against AWS's published S3 examples and botocore:
tests/pure/test_sigv4.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cairn.base.config_tools import ConfigError
from cairn.formats.batch import manifest_name
from cairn.gateway.shell.health import sync_section
from cairn.sync.cli import make_sink, parse_sync
from cairn.sync.sinks import SinkError, s3
from cairn.sync.sinks.sigv4 import Credentials, authorize
from harness.landing import landed
from harness.s3_server import BUCKET, KEY, SECRET, FaultProxy, S3Server
from tests.system.test_sync import (
    GATEWAY,
    fill_store,
    status_of,
    until_synced,
    uploader_for,
    uploading,
)

ROOT = Path(__file__).resolve().parents[2]
YEAR_S = 365 * 86400
PREFIX = "fleet/landing"
# s: a PUT's bound, never what a test waits to see happen (every fault here answers or closes
# at once): rclone serve s3 took up to 24 s a PUT on a machine at load 10
SINK_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One rclone S3 server for the module (a bucket per test: its folder)."""
    started = S3Server(tmp_path_factory.mktemp("s3") / "root")
    yield started
    started.close()


@pytest.fixture
def bucket(server, request) -> tuple[str, Path]:
    """A fresh bucket: (its name, its folder on the server's side)."""
    return server.bucket_for(request.node.name)


@pytest.fixture
def proxy(server):
    front = FaultProxy(server.port)
    yield front
    front.close()


def sink_for(endpoint: str, bucket: str, secret: str = SECRET, **kwargs: Any) -> s3.S3Sink:
    config = s3.S3Config(bucket, PREFIX, endpoint, "us-east-1", "path",
                         Credentials(KEY, secret))
    return s3.S3Sink(config, timeout=kwargs.pop("timeout", SINK_TIMEOUT), **kwargs)


# -- the signer against a real server ------------------------------------------------------

def test_a_real_s3_server_takes_a_signed_put_and_refuses_a_wrong_secret(server, bucket):
    name, folder = bucket
    sink = sink_for(server.endpoint, name)
    sink.put("gw/one.txt", b"landed")
    assert (folder / PREFIX / "gw" / "one.txt").read_bytes() == b"landed"
    with pytest.raises(SinkError, match="SignatureDoesNotMatch.*check sync.secret_access_key"):
        sink_for(server.endpoint, name, secret="not-the-secret").put("gw/two.txt", b"x")
    assert not (folder / PREFIX / "gw" / "two.txt").exists()


# -- configuration -------------------------------------------------------------------------

def config_of(tmp_path: Path, sync: str) -> dict[str, Any]:
    import tomllib

    return tomllib.loads(f'[router]\ndata_dir = "{tmp_path / "data"}"\n\n[sync]\n{sync}')


GOOD = (f'sink = "s3://{BUCKET}/{PREFIX}"\nendpoint = "http://127.0.0.1:9000"\n'
        f'access_key_id = "{KEY}"\n')


def test_an_s3_sink_config_reads_its_secret_from_a_file_or_the_environment(tmp_path,
                                                                            monkeypatch):
    secret_file = tmp_path / "s3-secret"
    secret_file.write_text(SECRET + "\n")
    config = parse_sync(config_of(tmp_path, GOOD + f'secret_access_key_file = "{secret_file}"'),
                        "cairn.toml")
    assert config.sink_settings == s3.S3Config(BUCKET, PREFIX, "http://127.0.0.1:9000", "us-east-1",
                                    "path", Credentials(KEY, SECRET))
    monkeypatch.setenv("CAIRN_S3_SECRET", SECRET)
    config = parse_sync(config_of(tmp_path, GOOD + 'secret_access_key_env = "CAIRN_S3_SECRET"'),
                        "cairn.toml")
    assert config.sink_settings.credentials.secret_access_key == SECRET
    sink = make_sink(config)
    assert isinstance(sink, s3.S3Sink)
    assert sink.describe() == f"s3://{BUCKET}/{PREFIX} at http://127.0.0.1:9000"
    assert SECRET not in repr(sink) and SECRET not in repr(config)
    aws = parse_sync(config_of(tmp_path, f'sink = "s3://{BUCKET}"\nregion = "eu-west-1"\n'
                                         f'access_key_id = "{KEY}"\n'
                                         f'secret_access_key = "{SECRET}"'), "cairn.toml")
    assert (aws.sink_settings.endpoint, aws.sink_settings.addressing,
            aws.sink_settings.prefix) == \
        ("https://s3.eu-west-1.amazonaws.com", "virtual", "")


@pytest.mark.parametrize(("sync", "key", "problem"), [
    (GOOD, "sync.secret_access_key", "missing"),
    (GOOD.replace(f'access_key_id = "{KEY}"\n', "") + 'secret_access_key = "s"',
     "sync.access_key_id", "missing"),
    (GOOD + 'secret_access_key = " "', "sync.secret_access_key", "empty"),
    (GOOD + 'secret_access_key_env = "CAIRN_NOT_SET_ANYWHERE"', "sync.secret_access_key_env",
     "not set"),
    (GOOD + 'secret_access_key = "s"\nsecret_access_key_file = "/x"',
     "sync.secret_access_key_file", "only one"),
    (GOOD.replace(BUCKET, "Not_A_Bucket") + 'secret_access_key = "s"', "sync.sink",
     "not an S3 bucket name"),
    (GOOD.replace(PREFIX, "a/../b") + 'secret_access_key = "s"', "sync.sink", "prefix"),
    (GOOD.replace("http://127.0.0.1:9000", "127.0.0.1:9000") + 'secret_access_key = "s"',
     "sync.endpoint", "http(s)://HOST[:PORT]"),
    (GOOD + 'secret_access_key = "s"\naddressing = "dns"', "sync.addressing", "virtual"),
    (GOOD + 'secret_access_key = "s"\nregion = "EU Central"', "sync.region", "region name"),
    ('sink = "dir:/tmp/x"\naccess_key_id = "k"', "sync.access_key_id", "only for an s3://"),
])
def test_a_bad_s3_sink_config_names_the_file_the_key_and_the_problem(tmp_path, sync, key,
                                                                     problem):
    with pytest.raises(ConfigError) as caught:
        parse_sync(config_of(tmp_path, sync), "cairn.toml")
    assert (caught.value.source, caught.value.key) == ("cairn.toml", key)
    assert problem in caught.value.problem
    assert SECRET not in str(caught.value)


# -- batches landing -----------------------------------------------------------------------

class Recorded(s3.S3Sink):
    """The sink under test, noting what it was given to put."""

    def put(self, name: str, data: bytes) -> None:
        super().put(name, data)
        self.given = [*getattr(self, "given", []), (name, data)]


def test_batches_land_byte_for_byte_under_the_gateways_prefix_manifest_last(
        server, bucket, proxy, tmp_path, caplog):
    name, folder = bucket
    data_dir = tmp_path / "data"
    seqs = fill_store(data_dir, 2500, retained_every=100)
    sink = Recorded(sink_for(proxy.endpoint, name).config)
    uploader = uploader_for(data_dir, sink, batch_events=1000)
    with caplog.at_level(logging.DEBUG):
        assert uploader.once() == 2500
    landing = folder / PREFIX
    assert [n for n, _ in sink.given][:2] == [sink.given[0][0],
                                              manifest_name(sink.given[0][0])]
    for given_name, data in sink.given:  # byte for byte where the landing reader looks
        assert (landing / given_name).read_bytes() == data
    assert {p.parent.name for p in landing.glob("*/*")} == {GATEWAY}
    manifests, rows = landed(landing)
    assert sorted(r["seq"] for r in rows) == seqs and len(manifests) == 3
    assert [seen.mode for seen in proxy.seen] == ["pass"] * 6
    assert all(seen.line.startswith(f"PUT /{name}/{PREFIX}/{GATEWAY}/") for seen in proxy.seen)
    status = status_of(data_dir)
    assert status["synced_seq"] == seqs[-1] and status["state"] == "ok"
    assert status["sink"] == f"s3://{name}/{PREFIX} at {proxy.endpoint}"
    # what the budget counts is what S3 was sent, heads included (the proxy's count)
    assert status["bytes_sent"] == proxy.sent > sum(len(d) for _, d in sink.given)
    assert status["uplink_clock"] is None  # the clock was right: nothing measured
    assert SECRET not in caplog.text and SECRET not in json.dumps(status)


def test_the_data_budget_counts_what_s3_is_sent(server, bucket, proxy, tmp_path):
    name, _ = bucket
    data_dir = tmp_path / "data"
    fill_store(data_dir, 300)
    uploader = uploader_for(data_dir, sink_for(proxy.endpoint, name), batch_events=100,
                            daily_bytes=10**9)
    assert uploader.once() == 300
    status = status_of(data_dir)
    assert status["budget_used"] == status["bytes_sent"] == proxy.sent


def test_a_manifest_s3_refused_still_counts_against_the_budget(server, bucket, proxy,
                                                               tmp_path):
    """The data PUT landed, the manifest's got a 503: both were sent (issue 45, B1)."""
    name, _ = bucket
    data_dir = tmp_path / "data"
    fill_store(data_dir, 300)
    proxy.fail("slowdown", 1, matching=".manifest.json")
    uploader = uploader_for(data_dir, sink_for(proxy.endpoint, name), batch_events=100,
                            daily_bytes=10**9)
    with pytest.raises(SinkError, match="SlowDown"):
        uploader.once()
    status = status_of(data_dir)
    assert [seen.mode for seen in proxy.seen] == ["pass", "slowdown"]
    assert status["synced_seq"] == 0
    assert status["budget_used"] == status["bytes_sent"] == proxy.sent > 0


# -- refusals and faults: a clear reason, the watermark stays ------------------------------

def failed_once(data_dir: Path, sink: s3.S3Sink, match: str) -> dict[str, Any]:
    uploader = uploader_for(data_dir, sink, batch_events=100)
    with pytest.raises(SinkError, match=match):
        uploader.once()
    status = status_of(data_dir)
    assert status["state"] == "retrying" and status["synced_seq"] == 0
    assert status["backlog"] == 250
    assert uploader.reader.synced_seq() == 0
    uploader.reader.close()
    return status


def test_a_wrong_secret_an_unknown_key_or_bucket_say_so_and_the_watermark_stays(
        server, bucket, tmp_path):
    name, folder = bucket
    data_dir = tmp_path / "data"
    fill_store(data_dir, 250)
    status = failed_once(data_dir, sink_for(server.endpoint, name, secret="wrong"),
                         "SignatureDoesNotMatch")
    assert f"check sync.secret_access_key (of access key {KEY})" in status["last_error"]
    assert "wrong" not in status["last_error"]
    unknown = s3.S3Sink(s3.S3Config(name, PREFIX, server.endpoint, "us-east-1", "path",
                                    Credentials("gw-unknown", SECRET)))
    status = failed_once(data_dir, unknown, "InvalidAccessKeyId")
    assert "no access key gw-unknown: check sync.access_key_id" in status["last_error"]
    status = failed_once(data_dir, sink_for(server.endpoint, "no-such-bucket"), "NoSuchBucket")
    assert "there is no bucket no-such-bucket at" in status["last_error"]
    assert not list(folder.rglob("*.json"))
    assert not (server.root / "no-such-bucket").exists()  # never created


def test_a_key_whose_policy_refuses_the_put_names_the_prefix_it_needs(server, bucket, proxy,
                                                                      tmp_path):
    """rclone has no bucket policies: the proxy answers as AWS S3 does for such a key."""
    name, _ = bucket
    data_dir = tmp_path / "data"
    fill_store(data_dir, 250)
    proxy.fail("denied", 1)
    status = failed_once(data_dir, sink_for(proxy.endpoint, name), "AccessDenied")
    assert status["last_error"] == (
        f"PUT s3://{name}/{PREFIX}/{GATEWAY}/000000000001-000000000100.jsonl.bz2: HTTP 403 "
        f"AccessDenied: Access Denied (access key {KEY} may not write s3://{name}/{PREFIX}/"
        f"{GATEWAY}/000000000001-000000000100.jsonl.bz2: its policy must allow s3:PutObject "
        f"on {name}/{PREFIX}/{GATEWAY}/* (docs/sync-and-spark.md: Landing in S3))")


@pytest.mark.parametrize(("mode", "reason"), [
    ("slowdown", "HTTP 503 SlowDown: Please reduce your request rate. (the server asks for "
                 "fewer requests: retried with backoff)"),
    # a cut while the body is still going out is a reset, after it a closed connection
    ("cut", ("RemoteDisconnected", "ConnectionResetError")),
    ("etag", "answered 2xx with ETag 00000000000000000000000000000000, not the MD5"),
])
def test_a_fault_on_the_way_is_a_clear_reason_and_backoff_until_it_lands(
        server, bucket, proxy, tmp_path, mode, reason):
    name, folder = bucket
    data_dir = tmp_path / "data"
    seqs = fill_store(data_dir, 250)
    proxy.fail(mode, 3)  # three PUTs in a row meet it
    errors = []
    with uploading(data_dir, sink_for(proxy.endpoint, name), interval=2.0,
                   max_backoff=2.0, batch_events=100) as worker:
        deadline = time.monotonic() + SINK_TIMEOUT * 4
        while proxy.times > 0 and time.monotonic() < deadline:
            status = json.loads((data_dir / "sync-status.json").read_text()) \
                if (data_dir / "sync-status.json").exists() else {}
            if status.get("last_error"):
                errors.append(status["last_error"])
                assert status["synced_seq"] == 0  # nothing past the first batch confirmed
            time.sleep(0.02)
        until_synced(data_dir, seqs[-1], worker, timeout=SINK_TIMEOUT * 4)
    reasons = (reason,) if isinstance(reason, str) else reason
    assert errors and any(r in errors[0] for r in reasons), errors
    faulted = [at for at, seen in enumerate(proxy.seen) if seen.mode == mode]
    assert faulted == [0, 1, 2]  # the first batch's PUT, tried again after each failure
    times = [seen.at for seen in proxy.seen]
    gaps = [b - a for a, b in zip(times, times[1:4], strict=False)]
    assert all(g >= 0.4 for g in gaps), gaps  # backoff with jitter: 1 s, 2 s (x 0.5-1)
    manifests, rows = landed(folder / PREFIX)
    assert set(r["seq"] for r in rows) == set(seqs)
    assert status_of(data_dir)["last_error"] is None


# -- a wrong clock -------------------------------------------------------------------------

def run_sync(tmp_path: Path, data_dir: Path, endpoint: str, bucket: str, offset_s: float
             ) -> subprocess.CompletedProcess[str]:
    """``cairn sync --once`` in a process whose wall clock is ``offset_s`` off
    (tests/fakeclock: CLOCK_BOOTTIME and the monotonic clock are left alone)."""
    offset = tmp_path / "clock-offset"
    offset.write_text(str(offset_s))
    config = tmp_path / "cairn.toml"
    config.write_text(f'[router]\ndata_dir = "{data_dir}"\n\n[sync]\n'
                      f'sink = "s3://{bucket}/{PREFIX}"\nendpoint = "{endpoint}"\n'
                      f'access_key_id = "{KEY}"\nsecret_access_key = "{SECRET}"\n'
                      f'gateway_id = "{GATEWAY}"\nbatch_events = 100\n')
    env = {**os.environ, "CAIRN_FAKE_CLOCK_FILE": str(offset),
           "PYTHONPATH": f"{ROOT / 'tests' / 'fakeclock'}:{ROOT}"}
    return subprocess.run([sys.executable, "-m", "cairn.app.cli", "sync", "--once",
                           "--config", str(config)], env=env, capture_output=True, text=True,
                          timeout=SINK_TIMEOUT * 5)


@pytest.mark.parametrize("years", [-3, 5])
def test_a_clock_years_off_signs_with_the_servers_time_and_says_so(server, bucket, proxy,
                                                                   tmp_path, years):
    name, folder = bucket
    data_dir = tmp_path / "data"
    seqs = fill_store(data_dir, 250)
    done = run_sync(tmp_path, data_dir, proxy.endpoint, name, years * YEAR_S)
    assert done.returncode == 0, done.stderr
    assert "signing with the server's time from now on" in done.stderr
    assert SECRET not in done.stderr
    status = status_of(data_dir)
    assert status["synced_seq"] == seqs[-1]
    view = status["uplink_clock"]
    assert abs(view["offset_s"] + years * YEAR_S) < 5, view  # the server's lead
    assert view["source"] == "the S3 server's Date"
    assert sync_section(status)["uplink_clock"] == view  # rides the health record
    # the first PUT was refused (rclone: 400 AccessDenied, the request time), and each
    # later one was signed with the server's time: 6 accepted PUTs, one refusal
    assert len(proxy.seen) == 7
    assert len(landed(folder / PREFIX)[1]) == 250

    fill_store(data_dir, 100, first_index=250)  # a later run of the same boot
    before = len(proxy.seen)
    done = run_sync(tmp_path, data_dir, proxy.endpoint, name, years * YEAR_S)
    assert done.returncode == 0, done.stderr
    assert len(proxy.seen) - before == 2  # data and manifest, no refusal first
    assert "signing with the server's time" not in done.stderr


def test_the_clock_refusal_is_told_apart_from_a_wrong_secret(server, bucket, tmp_path):
    """With the clock years off and the wrong secret, the retry on the server's time
    meets SignatureDoesNotMatch: that is the reason given, not the clock."""
    name, _ = bucket
    offset = tmp_path / "clock-offset"
    offset.write_text(str(-3 * YEAR_S))
    code = ("from cairn.sync.sinks import s3\n"
            "from cairn.sync.sinks.sigv4 import Credentials\n"
            f"c = s3.S3Config({name!r}, 'p', {server.endpoint!r}, 'us-east-1', 'path', "
            f"Credentials({KEY!r}, 'wrong'))\n"
            "sink = s3.S3Sink(c)\n"
            "try:\n    sink.put('gw/x', b'x')\nexcept Exception as e:\n    print(e)\n"
            "print(sink.uplink_clock.view()['offset_s'])\n")
    env = {**os.environ, "CAIRN_FAKE_CLOCK_FILE": str(offset),
           "PYTHONPATH": f"{ROOT / 'tests' / 'fakeclock'}:{ROOT}"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=SINK_TIMEOUT * 5)
    error, offset_s = done.stdout.splitlines()
    assert "SignatureDoesNotMatch" in error and "check sync.secret_access_key" in error
    assert abs(float(offset_s) - 3 * YEAR_S) < 5


def test_rclone_ignores_if_none_match(server, bucket):
    """AWS S3 (since 2024) and MinIO refuse a PUT with ``If-None-Match: *`` over an existing
    key (412): a lock could rest on it. rclone's server overwrites the key: on it the
    central table lock is the documented one-ingest-at-a-time rule (tests/spark/test_spark_s3)."""
    name, folder = bucket
    sink = sink_for(server.endpoint, name)
    sink.put("lock/_lock", b"first")
    host = f"127.0.0.1:{server.port}"
    path = f"/{name}/{PREFIX}/lock/_lock"
    body = b"second"
    headers = {"Host": host, "If-None-Match": "*"}
    headers.update(authorize(Credentials(KEY, SECRET), "us-east-1", "PUT", path, "", headers,
                             hashlib.sha256(body).hexdigest(), time.time_ns()))
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=SINK_TIMEOUT)
    connection.request("PUT", path, body=body, headers=headers)
    assert connection.getresponse().status == 200  # not 412 Precondition Failed
    connection.close()
    assert (folder / PREFIX / "lock" / "_lock").read_bytes() == b"second"
