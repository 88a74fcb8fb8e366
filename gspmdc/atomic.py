"""Atomic output files: write to a temporary file beside the target, rename into place when done.

- All or nothing: the data is flushed to disk before the rename, so the target holds either its
  old contents or the complete new ones (also after a crash); a failed or interrupted writer
  leaves no partial file behind (the temporary file is removed).
- Permissions as if the file were written in place: a new file gets `0666` minus the process's
  umask (the kernel applies the umask when the temporary file is created); an existing file keeps
  its permission bits. A symbolic link is followed: the file it names is replaced, the link stays.
- A target that exists and is not a regular file (`/dev/null`, `/dev/stdout`, a named pipe) is
  written directly: renaming over it would replace the device or pipe with a regular file.
- A target that is a directory, or whose directory cannot be created, is a `GspmdcError` (exit
  code 2); a failure while writing (a full disk) is a `RuntimeFailure` (exit code 3).
"""
from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from gspmdc.errors import GspmdcError, RuntimeFailure

#: flags of the temporary file: created here and now, by this process only
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, mode: str = "wb"):
    """`with atomic_output("out.npz") as f: ...` — `f` is a file opened with `mode`."""
    target = Path(os.path.realpath(path))
    try:
        existing = target.stat()
    except FileNotFoundError:
        existing = None
    except OSError as e:
        raise GspmdcError(f"cannot write {path}: {e.strerror}") from None
    if existing is not None and stat.S_ISDIR(existing.st_mode):
        raise GspmdcError(f"cannot write {path}: it is a directory")
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        with _reported(path), open(target, mode) as f:
            yield f
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GspmdcError(f"cannot create the directory of {path}: {e.strerror}") from None
    fd, tmp = _temporary(target, path)
    try:
        with _reported(path):
            if existing is not None:
                os.fchmod(fd, stat.S_IMODE(existing.st_mode))
            with os.fdopen(fd, mode) as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _temporary(target: Path, shown) -> tuple[int, Path]:
    """A new file `.<name>.<random>.tmp` beside `target`, created `0666` minus the umask."""
    while True:
        tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, _CREATE, 0o666), tmp
        except FileExistsError:
            continue
        except OSError as e:
            raise GspmdcError(f"cannot write {shown}: {e.strerror}") from None


@contextlib.contextmanager
def _reported(shown):
    """An operating-system error while writing `shown` as a RuntimeFailure naming it (a closed
    pipe stays a BrokenPipeError: the reader has gone, nothing failed)."""
    try:
        yield
    except OSError as e:
        if e.strerror is None or isinstance(e, BrokenPipeError):
            raise
        raise RuntimeFailure(f"cannot write {shown}: {e.strerror}") from e
