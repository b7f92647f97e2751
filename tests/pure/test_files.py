"""base.files.write_atomically, the one way Cairn's modules replace a file, on real files:
the old file or the new one, never a part, with the mode and owner asked for, and no
temporary file left behind; and base.files.read_untrusted, the one way a root helper reads
what a less privileged process wrote."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from cairn.base.files import RefusedFile, read_untrusted, write_atomically


class SourceFailed(Exception):
    pass


def failing_midway(first: bytes) -> Iterator[bytes]:
    """Data whose source fails after its first chunk is written (a link dropped midway)."""
    yield first
    raise SourceFailed


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("durable", [True, False])
def test_a_write_replaces_the_file_whole_and_leaves_no_temporary_file(tmp_path, durable):
    target = tmp_path / "state.json"
    target.write_text("old")
    write_atomically(target, '{"new": "\u00e9t\u00e9"}', durable=durable)
    assert target.read_text(encoding="utf-8") == '{"new": "\u00e9t\u00e9"}'
    assert os.listdir(tmp_path) == ["state.json"]


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "batch.jsonl"
    target.write_bytes(b"old whole")
    with pytest.raises(SourceFailed):
        write_atomically(target, failing_midway(b"new, half"))
    assert target.read_bytes() == b"old whole"
    assert os.listdir(tmp_path) == ["batch.jsonl"]


def test_a_first_write_that_fails_midway_leaves_no_file(tmp_path):
    with pytest.raises(SourceFailed):
        write_atomically(tmp_path / "batch.jsonl", failing_midway(b"new, half"))
    assert os.listdir(tmp_path) == []


def test_chunks_are_written_in_order(tmp_path):
    write_atomically(tmp_path / "f", iter([b"one ", b"two ", b"three"]))
    assert (tmp_path / "f").read_bytes() == b"one two three"


def test_a_new_file_is_readable_by_its_owner_only_unless_told(tmp_path):
    write_atomically(tmp_path / "key", b"secret")
    write_atomically(tmp_path / "report", b"for all", mode=0o644)
    assert mode_of(tmp_path / "key") == 0o600
    assert mode_of(tmp_path / "report") == 0o644


def test_without_a_mode_a_file_has_the_umasks_default(tmp_path):
    old = os.umask(0o027)
    try:
        write_atomically(tmp_path / "status.json", "{}", mode=None)
    finally:
        os.umask(old)
    assert mode_of(tmp_path / "status.json") == 0o640


def test_a_rewrite_takes_the_mode_given_not_the_old_files(tmp_path):
    target = tmp_path / "secret"
    target.write_bytes(b"old")
    target.chmod(0o644)
    write_atomically(target, b"new", mode=0o640)
    assert mode_of(target) == 0o640


@pytest.mark.skipif(os.geteuid() != 0, reason="only root gives a file away")
def test_the_owner_given_is_the_files(tmp_path):
    write_atomically(tmp_path / "secret", b"s", mode=0o640, uid=1234, gid=4321)
    st = (tmp_path / "secret").stat()
    assert (st.st_uid, st.st_gid, mode_of(tmp_path / "secret")) == (1234, 4321, 0o640)


def test_like_gives_the_mode_and_group_of_that_file(tmp_path):
    like = tmp_path / "cairn.toml"
    like.write_text("[router]\n")
    like.chmod(0o640)
    if os.geteuid() == 0:   # a group other than this process's, as the router's is
        os.chown(like, -1, 4321)
    write_atomically(tmp_path / "0001.toml", "[router]\n", mode=None, like=like)
    st = (tmp_path / "0001.toml").stat()
    assert (mode_of(tmp_path / "0001.toml"), st.st_gid) == (0o640, like.stat().st_gid)


def test_like_that_does_not_exist_leaves_the_mode_given(tmp_path):
    write_atomically(tmp_path / "f", "x", mode=0o600, like=tmp_path / "absent")
    assert mode_of(tmp_path / "f") == 0o600


# -- read_untrusted ------------------------------------------------------------------------------


def test_read_untrusted_gives_a_regular_files_bytes_and_owner(tmp_path):
    path = tmp_path / "request.json"
    path.write_bytes(b"{}")
    os.chown(path, 987, 987)
    assert read_untrusted(path, {0, 987}, 10) == (b"{}", 987)


def test_read_untrusted_never_follows_a_symbolic_link(tmp_path):
    (tmp_path / "target").write_text("secret")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(RefusedFile, match="symbolic link"):
        read_untrusted(tmp_path / "link", None, 100)


def test_read_untrusted_refuses_a_fifo_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(RefusedFile, match="FIFO"):
        read_untrusted(tmp_path / "fifo", None, 100)


def test_read_untrusted_refuses_a_file_of_an_owner_not_named(tmp_path):
    path = tmp_path / "request.json"
    path.write_text("{}")
    os.chown(path, 987, 987)
    with pytest.raises(RefusedFile, match="owned by uid 987"):
        read_untrusted(path, {0}, 100)


def test_read_untrusted_refuses_a_file_over_its_cap(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(b"x" * 101)
    with pytest.raises(RefusedFile, match="larger than the 100 allowed"):
        read_untrusted(path, None, 100)
