"""Files written atomically: the store's readable by their owner only, a user's own with the
umask's mode."""

from __future__ import annotations

import json
import os
from typing import Any

from .errors import ConfigError, show

__all__ = ["atomic_write", "check_target", "file_path", "read_json"]


def atomic_write(path: str | os.PathLike[str], data: bytes, *, overwrite: bool = False,
                 mode: int = 0o600) -> None:
    """Write *data* to *path* through a temporary file, fsync and `os.replace`, with *mode* less
    the umask, as ``open()`` makes a file: 0600 (the owner's only) unless told, 0666 for a
    file that is the user's own (an executed notebook), as any program would write it.

    Refuses to replace an existing file unless *overwrite* is true, so nothing is silently
    rewritten. An `OSError` names *path*, never the temporary file beside it.
    """
    target = os.fspath(path)
    if not overwrite and os.path.exists(target):
        raise FileExistsError(f"{target!r} exists; pass overwrite=True to replace it")
    folder = os.path.dirname(os.path.abspath(target))
    tmp = os.path.join(folder, f".{os.path.basename(target)}.{os.getpid()}.tmp")
    try:
        _write_replace(tmp, target, data, mode)
    except OSError as exc:
        if exc.errno is None:  # no system error to name the file in
            raise
        raise type(exc)(exc.errno, exc.strerror, target) from None
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _write_replace(tmp: str, target: str, data: bytes, mode: int) -> None:
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
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


def check_target(path: str) -> None:
    """Check, before any work is done, that a file can be written at *path*: its folder exists
    and is writable, and *path* is not a folder. A `ConfigError` names *path* and the fix."""
    if not path or "\0" in path:
        why = "it holds a null character" if path else "it is empty"
        raise ConfigError(f"{path!r} is not a file path: {why}")
    if os.path.isdir(path):
        inside = os.path.join(path, "trace.json")
        raise ConfigError(f"{path!r} is a folder; name a file in it, e.g. {inside!r}")
    folder = os.path.dirname(path) or os.curdir
    if not os.path.exists(folder):
        raise ConfigError(f"{path!r}: the folder {folder!r} does not exist; create it or "
                          f"choose another path")
    if not os.path.isdir(folder):
        raise ConfigError(f"{path!r}: {folder!r} is not a folder; choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{path!r}: the folder {folder!r} is not writable; choose another "
                          f"path")


def file_path(path: object, what: str) -> str:
    """*path* as a str; anything that is not a file path (not a str, bytes or `os.PathLike`, or
    with a null character) is a `ConfigError` naming it and *what* it was to be."""
    try:
        where = os.fsdecode(path)  # type: ignore[arg-type]  # checked right here
    except TypeError:
        where = None
    if where is None or "\0" in where:
        raise ConfigError(f"{what} path {show(path)} is not a file path; give a str or a "
                          f"pathlib.Path without null characters")
    return where


def read_json(path: object, what: str, shape: str) -> Any:
    """The JSON value of the file at *path*, a *what* ("manifest", "trace"). A file that is not
    there, cannot be read, is not UTF-8, nests too deep or is not JSON is a `ConfigError` that
    names it; *shape* tells what such a file holds."""
    where = file_path(path, what)
    try:
        with open(where, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {where!r}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {where!r} is not UTF-8 text (byte 0x{raw[exc.start]:02x} "
                          f"at offset {exc.start}); save it as UTF-8") from None
    try:
        return json.loads(text)
    except RecursionError:  # Python's reader stops at about a thousand levels
        raise ConfigError(f"{what} {where!r} nests deeper than JSON can be read here; "
                          f"{shape}") from None
    except ValueError as exc:
        raise ConfigError(f"{what} {where!r} is not valid JSON: {exc}") from None
