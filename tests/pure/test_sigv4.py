"""The S3 sink's SigV4 signer (sync.sinks.sigv4) against AWS's published S3 examples and,
request by request, against botocore's ``S3SigV4Auth`` (a test-only dependency; skipped
without it). A real S3 server checks it on every PUT of tests/system/test_sync_s3.py."""

from __future__ import annotations

import calendar
import datetime
import hashlib
import urllib.parse

import pytest

from cairn.sync.sinks.sigv4 import Credentials, authorize
from harness.s3_server import KEY, SECRET

AWS_EXAMPLE = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
EXAMPLE_HOST = "examplebucket.s3.amazonaws.com"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize(("method", "path", "query", "headers", "payload", "signature"), [
    # the S3 API reference's examples of a signed Authorization header (single chunk)
    ("GET", "/test.txt", "", {"Range": "bytes=0-9"}, EMPTY_SHA256,
     "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"),
    ("PUT", "/test%24file.text", "", {"Date": "Fri, 24 May 2013 00:00:00 GMT",
                                      "x-amz-storage-class": "REDUCED_REDUNDANCY"},
     hashlib.sha256(b"Welcome to Amazon S3.").hexdigest(),
     "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"),
    ("GET", "/", "lifecycle", {}, EMPTY_SHA256,
     "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"),
    ("GET", "/", "max-keys=2&prefix=J", {}, EMPTY_SHA256,
     "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"),
])
def test_the_signer_gives_awss_published_s3_signatures(method, path, query, headers, payload,
                                                       signature):
    when = calendar.timegm((2013, 5, 24, 0, 0, 0)) * 10**9
    signed = authorize(AWS_EXAMPLE, "us-east-1", method, path, query,
                       {"Host": EXAMPLE_HOST, **headers}, payload, when)
    assert signed["Authorization"].endswith(f"Signature={signature}")
    assert signed["x-amz-date"] == "20130524T000000Z"


@pytest.mark.parametrize(("url", "headers", "region", "when"), [
    ("http://127.0.0.1:9000/cairn-landing/fleet/gw-7/000000000001-000000000100.jsonl.bz2",
     {}, "us-east-1", (2026, 11, 30, 23, 59, 59)),
    ("https://cairn-landing.s3.eu-central-1.amazonaws.com/p/gw/0001-0002.manifest.json",
     {"Content-Type": "application/octet-stream"}, "eu-central-1", (2031, 1, 1, 0, 0, 0)),
    ("https://b.s3.amazonaws.com/a%20b/%C3%A9t%C3%A9/x%2Ay%21%28%29.txt",
     {"x-amz-meta-note": "  two   spaces "}, "us-west-2", (2019, 2, 28, 12, 30, 1)),
    ("http://[::1]:8333/b/k?uploads=&partNumber=3", {"X-Amz-Storage-Class": "STANDARD"},
     "auto", (2026, 6, 15, 6, 0, 0)),
])
def test_the_signer_agrees_with_botocore(monkeypatch, url, headers, region, when):
    botocore_auth = pytest.importorskip("botocore.auth")
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCredentials

    at = datetime.datetime(*when, tzinfo=datetime.UTC)
    monkeypatch.setattr(botocore_auth, "get_current_datetime", lambda *a, **k: at)
    body = b"a batch's bytes"
    payload = hashlib.sha256(body).hexdigest()
    parts = urllib.parse.urlsplit(url)
    host = parts.netloc
    theirs = AWSRequest("PUT", url, data=body, headers={"x-amz-content-sha256": payload,
                                                        **headers})
    botocore_auth.S3SigV4Auth(BotoCredentials(KEY, SECRET), "s3", region).add_auth(theirs)
    ours = authorize(Credentials(KEY, SECRET), region, "PUT", parts.path, parts.query,
                     {"Host": host, **headers}, payload, int(at.timestamp()) * 10**9)
    assert ours["x-amz-date"] == theirs.headers["X-Amz-Date"]
    assert ours["Authorization"] == theirs.headers["Authorization"]
