"""Files that a crash or a kill cannot leave half-written.

``atomic_write_bytes`` is the package's one way of writing a file whose name
must only ever hold a complete version: weights (``save_checkpoint``) and,
through the opt-in mmengine runtime, training checkpoints and their
``last_checkpoint`` marker. It needs nothing but the standard library.
"""
from __future__ import annotations

import os
import os.path as osp
import uuid
from typing import Union

PARTIAL_SUFFIX = '.partial'


def partial_name(path: str) -> str:
    """The hidden temporary file ``.<name>.<random>.partial`` beside
    ``path``. Only a kill during a write leaves one behind; it is never
    read and can be deleted."""
    folder, name = osp.split(osp.abspath(path))
    return osp.join(folder, f'.{name}.{uuid.uuid4().hex[:12]}{PARTIAL_SUFFIX}')


def fsync_folder(folder: str):
    """Make a rename in ``folder`` durable.

    Best effort: some systems (Windows, a few network file systems) cannot
    open or sync a folder, and the rename is still atomic there.
    """
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, 'O_DIRECTORY', 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(data: bytes, path: Union[str, os.PathLike]):
    """Write ``data`` to ``path`` so that ``path`` never holds a part of it.

    The bytes go to a temporary file in the same folder (same file system,
    so the rename cannot turn into a copy), are flushed and fsynced, and the
    file is renamed onto ``path`` with ``os.replace`` (atomic on POSIX and
    Windows); the folder is then fsynced so that the rename survives a power
    loss. Under ``path`` there is always either the previous file or the
    complete new one. Missing folders are created; the file gets the
    permissions ``open(path, 'wb')`` would give. On any error the temporary
    file is removed and ``path`` is left as it was.
    """
    path = os.fspath(path)
    folder = osp.dirname(osp.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = partial_name(path)
    # 0o666 filtered by the umask, as open() does; O_EXCL: never another
    # writer's temporary file
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                 | getattr(os, 'O_BINARY', 0), 0o666)
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    fsync_folder(folder)
