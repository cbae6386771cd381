"""Checkpoints that a kill cannot leave half-written.

mmengine's ``LocalBackend.put`` opens the final path and writes into it, so a
run killed while a checkpoint is being written (SIGKILL, OOM killer, a
preempted node) leaves a truncated ``epoch_N.pth`` under the real name.
``AtomicLocalBackend`` writes to a temporary file in the same folder, flushes
and fsyncs it, and only then renames it onto the final name with
``os.replace`` (atomic on POSIX and Windows within one file system). Under
the final name there is always either the previous file or the complete new
one. Configs select it with::

    default_hooks = dict(
        checkpoint=dict(backend_args=dict(backend='local_atomic')))

The ``last_checkpoint`` marker that ``--resume`` reads is written by
mmengine 0.10's ``CheckpointHook`` with a plain ``open(path, 'w')``, not
through the file backend, so a kill between that open (which truncates the
file) and the write would leave an empty marker and ``--resume`` would fail.
``install_atomic_marker`` routes exactly that write through
``AtomicLocalBackend.put_text`` (for every ``CheckpointHook``; the marker is
always a local file). The marker is written only after the checkpoint it
names is complete, so a checkpoint that was being written when the kill
landed never becomes the latest one.

mmengine's hook also deletes the oldest checkpoint *before* it writes the
new one (``max_keep_ckpts``). With ``max_keep_ckpts=1`` that oldest one is
the checkpoint ``last_checkpoint`` names, and a kill during the write would
leave nothing to resume from. ``AtomicLocalBackend.remove`` therefore keeps
a checkpoint the marker still names until the marker names another one; any
other file is removed at once.

A kill during a write can leave a hidden temporary file
``.<name>.<random>.partial`` next to the checkpoints; it is never read and
can be deleted.
"""
from __future__ import annotations

import builtins
import io
import os
import os.path as osp
import uuid
from pathlib import Path
from typing import List, Optional, Union

import mmengine
from mmengine.fileio import LocalBackend, register_backend

BACKEND_NAME = 'local_atomic'
MARKER_NAME = 'last_checkpoint'
PARTIAL_SUFFIX = '.partial'


def _fsync_folder(folder: str):
    """Make the rename itself durable (best effort: not on every OS)."""
    flags = os.O_RDONLY | getattr(os, 'O_DIRECTORY', 0)
    try:
        fd = os.open(folder, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(data: bytes, filepath: Union[str, Path]):
    """Write ``data`` to ``filepath`` so that the name never holds a part.

    The bytes go to ``.<name>.<random>.partial`` in the same folder, are
    flushed and fsynced, and the file is then renamed onto ``filepath``.
    On any error the temporary file is removed and ``filepath`` is left as
    it was.
    """
    filepath = os.fspath(filepath)
    folder = osp.dirname(osp.abspath(filepath))
    mmengine.mkdir_or_exist(folder)
    tmp = osp.join(folder, f'.{osp.basename(filepath)}.'
                           f'{uuid.uuid4().hex[:12]}{PARTIAL_SUFFIX}')
    # mode 0o666 filtered by the umask: the same permissions as open() gives
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                 | getattr(os, 'O_BINARY', 0), 0o666)
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, filepath)
    except BaseException:
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    _fsync_folder(folder)


# Checkpoints whose removal waits for the marker to name another file, and
# what the marker last written by this process names.
_deferred_removals: List[str] = []
_marked: Optional[str] = None


def _named_by_marker(filepath: str) -> bool:
    """Whether ``last_checkpoint`` names ``filepath``: the marker this
    process wrote last, or before the first one (a resumed run) the marker
    beside the file."""
    marked = _marked
    if marked is None:
        marker = osp.join(osp.dirname(filepath), MARKER_NAME)
        if osp.isfile(marker):
            with builtins.open(marker, encoding='utf-8') as f:
                marked = f.read().strip()
    return marked is not None and osp.abspath(marked) == osp.abspath(filepath)


def _marker_written(text: str):
    """The marker now names ``text``: the checkpoints kept for the previous
    marker can go."""
    global _marked
    _marked = text.strip()
    while _deferred_removals:
        path = _deferred_removals.pop()
        if osp.abspath(path) != osp.abspath(_marked) and osp.isfile(path):
            os.remove(path)


class AtomicLocalBackend(LocalBackend):
    """mmengine's local backend with atomic ``put`` and ``put_text``, and a
    ``remove`` that keeps the checkpoint ``last_checkpoint`` names."""

    def put(self, obj: bytes, filepath: Union[str, Path]) -> None:
        atomic_write_bytes(obj, filepath)

    def put_text(self, obj: str, filepath: Union[str, Path],
                 encoding: str = 'utf-8') -> None:
        atomic_write_bytes(obj.encode(encoding), filepath)

    def remove(self, filepath: Union[str, Path]) -> None:
        filepath = os.fspath(filepath)
        if _named_by_marker(filepath):
            _deferred_removals.append(filepath)
            return
        super().remove(filepath)


register_backend(BACKEND_NAME, AtomicLocalBackend, force=True)


class _AtomicMarkerFile(io.StringIO):
    """What ``open(marker, 'w')`` returns: a buffer stored on close.

    The text reaches the file in one atomic rename when the ``with`` block
    ends normally; if the block raises, nothing is written.
    """

    def __init__(self, path: str, encoding: str):
        super().__init__()
        self._path = path
        self._encoding = encoding

    def close(self):
        if not self.closed:
            text = self.getvalue()
            super().close()
            AtomicLocalBackend().put_text(text, self._path, self._encoding)
            _marker_written(text)

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            super().close()  # discard: keep the previous marker
            return None
        self.close()
        return None


def _marker_open(file, mode='r', buffering=-1, encoding=None, *args,
                 **kwargs):
    """``open`` for mmengine's checkpoint hook: atomic for the marker only."""
    if (mode == 'w' and isinstance(file, (str, Path))
            and osp.basename(os.fspath(file)) == MARKER_NAME
            and buffering == -1 and not args and not kwargs):
        return _AtomicMarkerFile(os.fspath(file), encoding or 'utf-8')
    return builtins.open(file, mode, buffering, encoding, *args, **kwargs)


def install_atomic_marker():
    """Make ``CheckpointHook`` write ``last_checkpoint`` atomically.

    The hook's module looks ``open`` up in its own globals before the
    builtins; only its ``open(<work_dir>/last_checkpoint, 'w')`` call is
    changed, every other use of ``open`` there goes to the builtin.
    """
    from mmengine.hooks import checkpoint_hook
    checkpoint_hook.open = _marker_open


def atomic_marker_installed() -> bool:
    from mmengine.hooks import checkpoint_hook
    return getattr(checkpoint_hook, 'open', None) is _marker_open


install_atomic_marker()

__all__ = ['AtomicLocalBackend', 'BACKEND_NAME', 'atomic_write_bytes',
           'install_atomic_marker', 'atomic_marker_installed']
