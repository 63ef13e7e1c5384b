"""Files written atomically and readable by their owner only."""

from __future__ import annotations

import os

__all__ = ["atomic_write"]


def atomic_write(path: str | os.PathLike[str], data: bytes, *, overwrite: bool = False) -> None:
    """Write *data* to *path* through a temporary file, fsync and `os.replace`, mode 0600.

    Refuses to replace an existing file unless *overwrite* is true, so nothing is silently
    rewritten.
    """
    target = os.fspath(path)
    if not overwrite and os.path.exists(target):
        raise FileExistsError(f"{target!r} exists; pass overwrite=True to replace it")
    folder = os.path.dirname(os.path.abspath(target))
    tmp = os.path.join(folder, f".{os.path.basename(target)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
