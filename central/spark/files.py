"""Files through Hadoop's FileSystem (local, HDFS, S3A: whatever the cluster reads), and the
path and time helpers every step of the jobs names things with."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from pyspark.sql import SparkSession


class Files:
    """A Hadoop file system seen from the driver, by path (any scheme the cluster reads)."""

    def __init__(self, spark: SparkSession) -> None:
        # the classes looked up once: py4j asks the JVM for each part of a dotted name on
        # every use, and a part that is a package costs the JVM a search of every jar
        jvm = spark._jvm
        self._Path = getattr(jvm, "org.apache.hadoop.fs.Path")
        self._FileUtil = getattr(jvm, "org.apache.hadoop.fs.FileUtil")
        self._IOUtils = getattr(jvm, "org.apache.commons.io.IOUtils")
        self._conf = spark._jsc.hadoopConfiguration()

    def _path(self, path: str) -> Any:
        return self._Path(path)

    def _fs(self, path: Any) -> Any:
        return path.getFileSystem(self._conf)

    def qualify(self, path: str) -> str:
        """``landing`` -> ``file:/work/landing``: the form Spark reports paths in."""
        p = self._path(path)
        return self._fs(p).makeQualified(p).toString().rstrip("/")

    @staticmethod
    def from_uri(uri: str) -> str:
        """A path as Spark's ``_metadata.file_path`` gives it (URL-encoded) -> plain, as
        Hadoop's ``Path(URI).toString()`` has it (decoded in Python: a call into the JVM
        per file cost seconds per thousand batches)."""
        return unquote(uri)

    @staticmethod
    def local(path: str) -> str | None:
        """``file:/x/y`` (any number of slashes) -> ``/x/y``; None for a path of another file
        system (``hdfs://``, ``s3a://``, ...)."""
        if not path.startswith("file:"):
            return None
        return "/" + path.removeprefix("file:").lstrip("/")

    def exists(self, path: str) -> bool:
        p = self._path(path)
        return bool(self._fs(p).exists(p))

    def glob(self, pattern: str) -> list[str]:
        p = self._path(pattern)
        found = self._fs(p).globStatus(p)
        return [] if found is None else [s.getPath().toString() for s in found]

    def matches(self, pattern: str) -> bool:
        """Whether anything matches ``pattern`` (without a call per match, as glob makes)."""
        p = self._path(pattern)
        found = self._fs(p).globStatus(p)
        return found is not None and len(found) > 0

    def children(self, path: str) -> list[str]:
        p = self._path(path)
        fs = self._fs(p)
        if not fs.exists(p):
            return []
        return [s.getPath().toString() for s in fs.listStatus(p)]

    def mkdirs(self, path: str) -> None:
        p = self._path(path)
        self._fs(p).mkdirs(p)

    def delete(self, path: str) -> None:
        p = self._path(path)
        fs = self._fs(p)
        if fs.exists(p):
            fs.delete(p, True)

    def move(self, source: str, target: str) -> None:
        src, dst = self._path(source), self._path(target)
        src_fs, dst_fs = self._fs(src), self._fs(dst)
        if not target.startswith("s3a:"):
            # S3A renames (COPY, DELETE) and creates without a parent directory, and its
            # mkdirs leaves a marker object (rclone's serve s3 stores one as an empty file,
            # after which no key can go under it)
            dst_fs.mkdirs(dst.getParent())
        if dst_fs.exists(dst):
            dst_fs.delete(dst, True)
        if src_fs.getUri().equals(dst_fs.getUri()) and src_fs.rename(src, dst):
            return
        ok = self._FileUtil.copy(src_fs, src, dst_fs, dst, True, self._conf)
        if not ok:
            raise OSError(f"cannot move {source} to {target}")

    def create_new(self, path: str, text: str) -> bool:
        """Create ``path`` holding ``text`` unless it exists (atomic on HDFS); False if it
        did."""
        p = self._path(path)
        try:
            out = self._fs(p).create(p, False)
        except Exception as e:  # py4j wraps FileAlreadyExistsException
            if "FileAlreadyExists" in str(e) or "already exists" in str(e):
                return False
            raise
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()
        return True

    def write_text(self, path: str, text: str) -> None:
        p = self._path(path)
        out = self._fs(p).create(p, True)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()

    def read_text(self, path: str) -> str:
        p = self._path(path)
        stream = self._fs(p).open(p)
        try:
            data = self._IOUtils.toByteArray(stream)
        finally:
            stream.close()
        return bytes(data).decode()


def utc_now() -> Any:
    """Now in UTC, naive: how the table's TIMESTAMP columns hold times (session zone UTC)."""
    from datetime import UTC, datetime

    return datetime.now(UTC).replace(tzinfo=None)
