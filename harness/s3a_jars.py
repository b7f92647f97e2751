"""Spark's ``s3a://`` for the tests, without Maven Central: PySpark 4.3 bundles Hadoop 3.5's
client but not ``hadoop-aws``. PyPI's ``sagemaker-pyspark`` 1.4.5 (an sdist of 181 MB)
ships ``hadoop-aws-3.3.1.jar`` and the ``aws-java-sdk-bundle-1.11.901.jar`` it was built
against; :func:`fetch` takes those two out of it once, into ``~/.cache/cairn/s3a-jars/``
(checked by SHA-256), and the Spark session of the tests loads them (tests/conftest.py).

A version mix fit for testing that the job works on S3's semantics, not for production
(Hadoop wants hadoop-aws to match hadoop-common exactly: there, ``--packages
org.apache.hadoop:hadoop-aws:<Spark's Hadoop version>``). What the mix needs, found by its
failures: Hadoop 3.5 writes its defaults as durations ("60s"), which hadoop-aws 3.3.1
reads as numbers (NumberFormatException), and names SDK-v2 credential providers that the
1.11 bundle lacks: :data:`HADOOP_3_3_OVERRIDES`.

    .venv/bin/python -m harness.s3a_jars    # fetch them unless they are there (~20 s)
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cairn" / "s3a-jars"
SDIST = "sagemaker-pyspark==1.4.5"
JARS = {  # in the sdist's deps/jars/, with their SHA-256
    "hadoop-aws-3.3.1.jar": "6be50ad8a8b445d2802381b085b2a3ede5c29d353450a6a21f16b2fefa962b6e",
    "aws-java-sdk-bundle-1.11.901.jar":
        "b87175b32a16544cc1b37cf40390eb375833e62bed67f8ce6cde4b7ad6429ead",
}
# hadoop-aws 3.3.1 under Hadoop 3.5's defaults: numbers where 3.5 writes durations, and the
# SDK-v1 provider of a key and secret
HADOOP_3_3_OVERRIDES = {
    "fs.s3a.threads.keepalivetime": "60",
    "fs.s3a.connection.timeout": "200000",
    "fs.s3a.connection.establish.timeout": "30000",
    "fs.s3a.multipart.purge.age": "86400",
    "fs.s3a.connection.ttl": "300000",
    "fs.s3a.connection.idle.time": "60000",
    "fs.s3a.connection.acquisition.timeout": "60000",
    "fs.s3a.connection.request.timeout": "0",
    "fs.s3a.aws.credentials.provider": "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider",
}


def jars() -> list[Path] | None:
    """The cached jars, or None when they are not (all) there."""
    paths = [CACHE / name for name in JARS]
    return paths if all(p.exists() for p in paths) else None


def fetch() -> list[Path] | None:
    """The jars, taken out of the sdist unless they are cached; None (and why, on stderr)
    when PyPI cannot be reached or the sdist is not what it was."""
    found = jars()
    if found is not None:
        return found
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "--quiet", "--dest", work, SDIST], capture_output=True, text=True, timeout=900)
        sdists = list(Path(work).glob("sagemaker_pyspark-*.tar.gz"))
        if done.returncode != 0 or not sdists:
            print(f"harness.s3a_jars: cannot download {SDIST}: {done.stderr[-1000:]}",
                  file=sys.stderr)
            return None
        with tarfile.open(sdists[0]) as sdist:
            for member in sdist:
                name = member.name.rsplit("/", 1)[-1]
                if name not in JARS or "/deps/jars/" not in member.name:
                    continue
                source = sdist.extractfile(member)
                if source is None:
                    continue
                temp = Path(work) / name
                with source, open(temp, "wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
                digest = hashlib.sha256(temp.read_bytes()).hexdigest()
                if digest != JARS[name]:
                    print(f"harness.s3a_jars: {name} in {SDIST} has SHA-256 {digest}, not "
                          f"{JARS[name]}: not used", file=sys.stderr)
                    return None
                os.replace(temp, CACHE / name)  # whole or not at all
    return jars()


def hadoop_conf(endpoint: str, key: str, secret: str) -> dict[str, str]:
    """The ``fs.s3a.*`` settings that reach an S3 server at ``endpoint`` (http, path-style),
    with :data:`HADOOP_3_3_OVERRIDES`."""
    return {**HADOOP_3_3_OVERRIDES, "fs.s3a.endpoint": endpoint,
            "fs.s3a.access.key": key, "fs.s3a.secret.key": secret,
            "fs.s3a.path.style.access": "true",
            "fs.s3a.connection.ssl.enabled": str(endpoint.startswith("https")).lower(),
            # never delete directory markers after a write (rclone's folders are no
            # objects: each such DeleteObjects failed and was retried for minutes)
            "fs.s3a.directory.marker.retention": "keep",
            # a refusal surfaces in seconds, not after minutes of S3A's and the SDK's retries
            "fs.s3a.retry.limit": "2", "fs.s3a.attempts.maximum": "2"}


if __name__ == "__main__":
    print(fetch() or "harness.s3a_jars: no jars")
