"""Files replaced whole: written to a temporary file beside their place and renamed over
it once complete, so a reader, a full disk or a crash never meets half a file."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from typing import IO, Any


@contextlib.contextmanager
def replaced(
    path: str | os.PathLike[str], *, binary: bool = False, umask_mode: bool = False
) -> Iterator[IO[Any]]:
    """`with replaced(path) as f: f.write(...)`: `path` changes only when the block ends
    without an error; else the temporary file is removed and `path` is as it was.

    The new file is private (0600) unless `umask_mode`: then as open() would make it.
    """
    folder, name = os.path.split(os.fspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder or ".")
    try:
        if umask_mode:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb" if binary else "w") as fh:
            yield fh
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


__all__ = ["replaced"]
