"""The folder a command writes its files into (``rank -o``, ``report -o``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hpcdl.errors import InputError


@contextmanager
def output_dir(field: str, path: Path) -> Iterator[None]:
    """Make ``path`` a directory for the block that writes into it. A path that cannot be
    written (under a regular file, in a read-only directory, on a full disk) is one
    :class:`InputError` naming ``field`` and the path, whether making the folder or writing a
    file in it failed."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        yield
    except OSError as e:
        raise InputError(
            field, str(path), f"a directory files can be written in ({e.strerror or e})"
        ) from None
