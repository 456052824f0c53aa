"""File md5s: read every time, except inside `remembering()`, where a file unchanged since it was hashed (same
device, inode, size and mtime, DVC's rule) is not read again, even after a rename."""

from __future__ import annotations

import hashlib
import os

from roboloop import hashing


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _rot(path, data: bytes) -> None:
    """Change the bytes but not the size or the mtime (what bit rot looks like to stat)."""
    st = os.stat(path)
    path.write_bytes(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_outside_remembering_every_call_reads_the_file(tmp_path):
    f = tmp_path / "a.bin"
    f.write_bytes(b"x" * 1000)
    assert hashing.file_md5(f) == _md5(b"x" * 1000)
    _rot(f, b"y" * 1000)
    assert hashing.file_md5(f) == _md5(b"y" * 1000)  # a verification sees the changed bytes


def test_remembering_spares_a_second_read_across_a_rename_and_forgets_on_exit(tmp_path):
    folder = tmp_path / "tmp-out"
    folder.mkdir()
    (folder / "a.bin").write_bytes(b"a" * 4096)
    (folder / "b.bin").write_bytes(b"b" * 10)
    plain = hashing.dir_md5(folder)
    with hashing.remembering():
        hashing.dir_entries(folder)
        published = tmp_path / "out"
        os.rename(folder, published)
        assert hashing.dir_md5(published) == plain
        _rot(published / "a.bin", b"c" * 4096)
        assert hashing.dir_md5(published) == plain  # remembered: the same inode, size and mtime
        (published / "b.bin").write_bytes(b"b" * 11)  # a real change (size, mtime) is read again
        assert hashing.file_md5(published / "b.bin") == _md5(b"b" * 11)
    assert hashing.file_md5(published / "a.bin") == _md5(b"c" * 4096)  # the memo ended with the block
