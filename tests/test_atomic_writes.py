"""Writes that a crash cannot leave half-done.

* Durability: ``atomic_write_bytes`` (and everything that writes through it:
  ``save_checkpoint``, the mmengine ``local_atomic`` backend) fsyncs the
  data before the rename and the folder after it. ``os.fsync`` is stubbed
  with a recorder that notes which file or folder each call synced.
* Kills: a process killed in the middle of writing a checkpoint leaves
  under the final name either the previous complete file or nothing. The
  kill is made exact by the kernel: the writer runs with a file-size limit
  (RLIMIT_FSIZE) of half the checkpoint and with SIGXFSZ at its default
  action, so the write that crosses the limit ends the process at once,
  with no Python cleanup (like SIGKILL), whatever code does the writing.
"""
from __future__ import annotations

import glob
import os
import os.path as osp
import signal
import stat
import subprocess
import sys

import pytest
import torch

from posmlp_dense import atomic_io
from posmlp_dense.checkpoint import read_checkpoint, save_checkpoint

from conftest import fixture_path, load_tool

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONVERTER = osp.join(ROOT, 'tools', 'convert_checkpoint.py')


# ------------------------------------------------------------ durability
@pytest.fixture
def sync_log(monkeypatch):
    """Records every fsync (file or folder, and which one) and rename."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        info = os.fstat(fd)
        kind = 'folder' if stat.S_ISDIR(info.st_mode) else 'file'
        events.append(('fsync', kind, (info.st_dev, info.st_ino)))
        return real_fsync(fd)

    def replace(src, dst, *args, **kwargs):
        events.append(('replace', osp.abspath(src), osp.abspath(dst)))
        return real_replace(src, dst, *args, **kwargs)
    monkeypatch.setattr(os, 'fsync', fsync)
    monkeypatch.setattr(os, 'replace', replace)
    return events


def _identity(path):
    info = os.stat(path)
    return info.st_dev, info.st_ino


def assert_synced_then_renamed(events, path):
    """The file's data was synced before it was renamed onto ``path``, and
    its folder was synced after the rename."""
    path = osp.abspath(path)
    renames = [i for i, e in enumerate(events)
               if e[0] == 'replace' and e[2] == path]
    assert len(renames) == 1, events
    rename = renames[0]
    file_syncs = [i for i, e in enumerate(events)
                  if e == ('fsync', 'file', _identity(path))]
    folder_syncs = [i for i, e in enumerate(events)
                    if e == ('fsync', 'folder', _identity(osp.dirname(path)))]
    assert any(i < rename for i in file_syncs), \
        f'the data of {path} was not fsynced before the rename: {events}'
    assert any(i > rename for i in folder_syncs), \
        f'the folder of {path} was not fsynced after the rename: {events}'


def test_atomic_write_bytes_syncs_file_and_folder(tmp_path, sync_log):
    target = tmp_path / 'sub' / 'weights.bin'
    atomic_io.atomic_write_bytes(b'first', target)
    assert_synced_then_renamed(sync_log, target)
    sync_log.clear()
    atomic_io.atomic_write_bytes(b'second version', target)
    assert_synced_then_renamed(sync_log, target)
    assert target.read_bytes() == b'second version'
    assert glob.glob(str(tmp_path / 'sub' / '.*')) == []  # no temporary left


@pytest.mark.parametrize('suffix', ['.pth', '.safetensors'])
def test_save_checkpoint_syncs_file_and_folder(tmp_path, sync_log, suffix):
    state = {'w': torch.arange(6.0).view(2, 3)}
    target = tmp_path / f'weights{suffix}'
    save_checkpoint(state, str(target))
    assert_synced_then_renamed(sync_log, target)
    loaded = read_checkpoint(str(target))
    assert torch.equal(loaded.get('state_dict', loaded)['w'], state['w'])


def test_mmengine_atomic_backend_syncs_file_and_folder(tmp_path, sync_log):
    pytest.importorskip('mmengine')
    from posmlp_dense.openmmlab.runtime.atomic_backend import \
        AtomicLocalBackend
    target = tmp_path / 'epoch_1.pth'
    AtomicLocalBackend().put(b'checkpoint bytes', target)
    assert_synced_then_renamed(sync_log, target)
    sync_log.clear()
    AtomicLocalBackend().put_text('/runs/epoch_1.pth',
                                  tmp_path / 'last_checkpoint')
    assert_synced_then_renamed(sync_log, tmp_path / 'last_checkpoint')


# ------------------------------------------------------------------ kills
# Runs ``code`` (with ``args`` in sys.argv[1:]) in a fresh interpreter that
# the kernel kills as soon as it writes past ``limit`` bytes into any file.
KILLED_WRITER = r'''
import resource
import signal
import sys

limit = int(sys.argv.pop(1))
code = sys.argv.pop(1)
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
exec(compile(code, '<killed writer>', 'exec'))
'''

SAVE = r'''
import sys
from posmlp_dense.checkpoint import save_checkpoint
from test_atomic_writes import big_state

save_checkpoint(big_state(int(sys.argv[2])), sys.argv[1], overwrite=True)
'''


def big_state(seed):
    """8 MiB of weights, the same for the same seed in any process."""
    gen = torch.Generator().manual_seed(seed)
    return {'levels.0.weight': torch.randn(1 << 20, generator=gen),
            'levels.1.weight': torch.randn(1 << 20, generator=gen)}


CONVERT = r'''
import runpy
import sys
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name='__main__')
'''


def run_killed(code, args, limit, tmp_path):
    """Run ``code`` under the file-size limit; returns (returncode, log)."""
    pytest.importorskip('resource')
    if not hasattr(signal, 'SIGXFSZ'):
        pytest.skip('no SIGXFSZ on this system')
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE='1', OMP_NUM_THREADS='1',
               PYTHONPATH=os.pathsep.join(
                   [ROOT, osp.join(ROOT, 'tests'),
                    os.environ.get('PYTHONPATH', '')]))
    proc = subprocess.run(
        [sys.executable, '-c', KILLED_WRITER, str(limit), code, *args],
        cwd=str(tmp_path), env=env, capture_output=True, text=True,
        timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def _leftovers(folder, name):
    """Files in ``folder`` other than ``name`` and the hidden temporaries a
    kill may leave beside it."""
    return sorted(f for f in os.listdir(folder) if f != name and not (
        f.startswith(f'.{name}.') and f.endswith(atomic_io.PARTIAL_SUFFIX)))


@pytest.mark.parametrize('suffix', ['.pth', '.safetensors'])
def test_save_checkpoint_killed_mid_write_keeps_the_previous_file(
        tmp_path, suffix):
    target = tmp_path / 'out' / f'weights{suffix}'
    save_checkpoint(big_state(1), str(target))
    before = target.read_bytes()
    probe = tmp_path / f'probe{suffix}'  # the size of the new file
    save_checkpoint(big_state(2), str(probe))
    size = probe.stat().st_size
    code, log = run_killed(SAVE, [str(target), '2'], size // 2, tmp_path)
    assert code == -signal.SIGXFSZ, \
        f'the writer was not stopped in the middle of the write: {log}'
    assert target.read_bytes() == before  # byte for byte
    assert _leftovers(target.parent, target.name) == []


def _convert(args):
    return load_tool('convert_checkpoint').main(args)


def test_converter_killed_mid_write_leaves_no_partial_file(tmp_path):
    src = fixture_path('tiny_gqpe_official.pth')
    complete = tmp_path / 'complete.safetensors'
    assert _convert([src, str(complete)]) == 0
    size = complete.stat().st_size
    dst = tmp_path / 'out' / 'backbone.safetensors'
    code, log = run_killed(CONVERT, [CONVERTER, src, str(dst)], size // 2,
                           tmp_path)
    assert code == -signal.SIGXFSZ, \
        f'the converter was not stopped in the middle of the write: {log}'
    assert not dst.exists()  # nothing under the final name
    assert _leftovers(dst.parent, dst.name) == []
    # the next run is not disturbed by what the killed one left behind
    assert _convert([src, str(dst)]) == 0
    state, ref = read_checkpoint(str(dst)), read_checkpoint(str(complete))
    assert state.keys() == ref.keys()
    assert all(torch.equal(state[k], ref[k]) for k in ref)
