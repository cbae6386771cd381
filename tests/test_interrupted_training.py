"""Interrupted training loses nothing.

* A detector run (the demo RetinaNet config, shrunk) killed with SIGKILL in
  the middle of an epoch, resumed with ``tools/train.py --resume``, killed
  again while it writes a checkpoint, and resumed again, ends with exactly
  the weights, optimizer state and ``tools/test.py`` metrics of a run that
  was never interrupted (a deterministic CPU run: fixed seed, one data
  worker re-created and re-seeded identically every epoch, deterministic
  algorithms on, one thread).
* A checkpoint (or the ``last_checkpoint`` marker) being written when the
  kill lands never appears under its final name and never becomes the
  latest one: the ``local_atomic`` file backend and ``AtomicCheckpointHook``
  (the opt-in runtime the shipped configs name) leave the previous file
  intact. The same kill on mmengine's plain writes leaves a half-written
  file under the final name (the controls).

Kills are placed exactly: a hook (written to a temporary module) stops the
run at the chosen point and waits; the test then sends SIGKILL to the run's
process group (the trainer and its data worker).
"""
from __future__ import annotations

import glob
import json
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest
import torch

pytest.importorskip('mmdet')

from mmengine.config import Config  # noqa: E402
from mmengine.runner.checkpoint import (_load_checkpoint,  # noqa: E402
                                        find_latest_checkpoint)

from posmlp_dense import atomic_io  # noqa: E402
from posmlp_dense.data import shapes as demo_data  # noqa: E402
from posmlp_dense.openmmlab.runtime import (  # noqa: E402
    AtomicCheckpointHook, AtomicLocalBackend)

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DEMO_DET = osp.join(ROOT, 'configs', 'demo',
                    'retinanet_posmlp_t_fpn_demo-shapes.py')
EPOCHS = 3
WAIT_S = 600  # generous: the machine may be shared and slow

# A module the runs import (custom_imports): stops the run at a chosen
# point, signals the test through a file, and waits to be killed.
KILL_POINT = r'''
import builtins
import os
import time

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


def signal_and_wait(ready_file, text):
    with open(ready_file + '.tmp', 'w') as f:
        f.write(text)
    os.replace(ready_file + '.tmp', ready_file)
    while True:  # SIGKILL comes from the test
        time.sleep(0.2)


class HalfWrite:
    """A file whose next write stores half of the data, then stops."""

    def __init__(self, f, ready_file):
        self._f, self._ready = f, ready_file

    def write(self, data):
        half = len(data) // 2
        self._f.write(data[:half])
        self._f.flush()
        os.fsync(self._f.fileno())
        signal_and_wait(self._ready, f'{half} of {len(data)}')

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._f.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self._f, name)


def trap_next_write(ready_file, via):
    """Stop in the middle of the next file written through os.fdopen (the
    atomic writer) or through open(..., 'w'/'wb') (mmengine's own)."""
    if via == 'fdopen':
        real = os.fdopen

        def fdopen(fd, *args, **kwargs):
            os.fdopen = real
            return HalfWrite(real(fd, *args, **kwargs), ready_file)
        os.fdopen = fdopen
    else:
        real = builtins.open

        def opener(file, mode='r', *args, **kwargs):
            f = real(file, mode, *args, **kwargs)
            if 'w' in mode:
                builtins.open = real
                return HalfWrite(f, ready_file)
            return f
        builtins.open = opener


@HOOKS.register_module()
class KillPoint(Hook):
    priority = 'LOWEST'  # the iteration is complete, logged, scheduled

    def __init__(self, ready_file, epoch, batch_idx=None, during_save=False):
        self.ready_file, self.epoch = ready_file, epoch
        self.batch_idx, self.during_save = batch_idx, during_save

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None):
        if (not self.during_save and runner.epoch == self.epoch
                and batch_idx == self.batch_idx):
            signal_and_wait(self.ready_file, f'iter {runner.iter}')

    def before_save_checkpoint(self, runner, checkpoint):
        if self.during_save and runner.epoch == self.epoch:
            trap_next_write(self.ready_file, 'fdopen')
'''

# Writes through one of the backends / marker writers and is killed
# half-way through the data.
WRITER = r'''
import sys

import kill_point

case, target, ready = sys.argv[1:4]
data = bytes(range(256)) * (4 << 12)  # 4 MiB
marked = '/runs/det/epoch_13.pth'
if case == 'atomic put':
    from posmlp_dense.openmmlab.runtime import AtomicLocalBackend
    kill_point.trap_next_write(ready, 'fdopen')
    AtomicLocalBackend().put(data, target)
elif case == 'plain put':
    from mmengine.fileio import LocalBackend
    kill_point.trap_next_write(ready, 'open')
    LocalBackend().put(data, target)
elif case == 'atomic marker':
    from posmlp_dense.openmmlab.runtime import AtomicCheckpointHook
    kill_point.trap_next_write(ready, 'fdopen')
    AtomicCheckpointHook.write_marker(target, marked)
elif case == 'plain marker':
    # what mmengine's CheckpointHook runs, with the builtin open (its
    # module has no ``open`` of its own: nothing is patched)
    from mmengine.hooks import checkpoint_hook
    assert 'open' not in vars(checkpoint_hook)
    kill_point.trap_next_write(ready, 'open')
    with open(target, 'w') as f:
        f.write(marked)
raise SystemExit('not stopped')
'''


def _env(*paths):
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=os.pathsep.join(
        [ROOT, *map(str, paths), os.environ.get('PYTHONPATH', '')]))
    return env


def _start(args, env, log):
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _kill_when_ready(proc, ready_file, log_path):
    """Wait until the run reached its kill point, then SIGKILL its group."""
    deadline = time.monotonic() + WAIT_S
    while not osp.exists(ready_file):
        if proc.poll() is not None:
            raise AssertionError(
                f'the run ended (rc {proc.returncode}) before its kill '
                f'point:\n' + open(log_path).read()[-4000:])
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError('the run did not reach its kill point')
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    return open(ready_file).read()


def _finish(proc, log_path):
    rc = proc.wait(timeout=WAIT_S)
    assert rc == 0, open(log_path).read()[-4000:]


# ------------------------------------------------ kills during file writes
@pytest.fixture(scope='module')
def kill_module(tmp_path_factory):
    folder = tmp_path_factory.mktemp('kill_point')
    (folder / 'kill_point.py').write_text(KILL_POINT)
    return folder


def _partials(folder, name):
    return glob.glob(osp.join(str(folder), f'.{name}.*.partial'))


def test_kill_during_a_write_leaves_the_previous_file(tmp_path, kill_module):
    old = {'put': b'complete old checkpoint' * 1000,
           'marker': b'/runs/det/epoch_12.pth'}
    cases = {}
    for case in ('atomic put', 'plain put', 'atomic marker', 'plain marker'):
        folder = tmp_path / case.replace(' ', '_')
        folder.mkdir()
        kind = case.split()[1]
        target = folder / ('epoch_13.pth' if kind == 'put'
                           else 'last_checkpoint')
        target.write_bytes(old[kind])
        ready = str(folder / 'READY')
        log = str(folder / 'log.txt')
        with open(log, 'w') as f:  # all four at once: one start-up's wait
            proc = _start(['-c', WRITER, case, str(target), ready],
                          _env(kill_module), f)
        cases[case] = (proc, target, ready, log, old[kind])
    for case, (proc, target, ready, log, before) in cases.items():
        stopped_at = _kill_when_ready(proc, ready, log)
        half, total = map(int, stopped_at.split(' of '))
        assert 0 < half < total  # killed in the middle of the data
        partials = _partials(target.parent, target.name)
        if case.startswith('atomic'):
            # the final name still holds the previous file, byte for byte;
            # the half-written data sits in a temporary file beside it
            assert target.read_bytes() == before, case
            assert len(partials) == 1, case
            assert os.path.getsize(partials[0]) == half
        else:
            # control: mmengine's own write leaves a torn file behind
            assert target.read_bytes() != before, case
            assert os.path.getsize(target) == half
            assert partials == []


def test_atomic_writes_replace_completely_and_keep_permissions(tmp_path):
    backend = AtomicLocalBackend()
    target = tmp_path / 'sub' / 'epoch_1.pth'
    backend.put(b'first', target)  # creates the folder, like LocalBackend
    backend.put(b'second version', target)
    assert target.read_bytes() == b'second version'
    backend.put_text('/runs/epoch_1.pth', tmp_path / 'last_checkpoint')
    assert (tmp_path / 'last_checkpoint').read_text() == '/runs/epoch_1.pth'
    assert _partials(target.parent, target.name) == []
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(target).st_mode & 0o777 == 0o666 & ~umask
    # a failed write removes its temporary file and keeps the old one

    class Unwritable:
        pass
    with pytest.raises(TypeError):
        backend.put(Unwritable(), target)
    assert target.read_bytes() == b'second version'
    assert _partials(target.parent, target.name) == []


def test_a_failed_marker_write_keeps_the_previous_marker(tmp_path,
                                                        monkeypatch):
    marker = tmp_path / 'last_checkpoint'
    marker.write_text('/runs/epoch_1.pth')

    def disk_full(fd):
        raise OSError(28, 'No space left on device')
    with monkeypatch.context() as m:
        m.setattr(os, 'fsync', disk_full)
        with pytest.raises(OSError, match='No space left'):
            AtomicCheckpointHook.write_marker(str(marker), '/runs/epoch_2.pth')
    assert marker.read_text() == '/runs/epoch_1.pth'
    assert _partials(tmp_path, 'last_checkpoint') == []
    AtomicCheckpointHook.write_marker(str(marker), '/runs/epoch_2.pth')
    assert marker.read_text() == '/runs/epoch_2.pth'
    # mmengine's own hook module is left alone: it has no ``open`` of its
    # own, so its code uses the builtin one
    from mmengine.hooks import checkpoint_hook
    assert 'open' not in vars(checkpoint_hook)


def _train_toy(work_dir, max_epochs, resume=False, **checkpoint_options):
    """A tiny real Runner with ``AtomicCheckpointHook`` on the
    ``local_atomic`` backend, as the shipped configs set it up
    (``checkpoint_options`` override them)."""
    from mmengine.model import BaseModel
    from mmengine.runner import Runner

    class Toy(BaseModel):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 1)

        def forward(self, inputs, data_samples=None, mode='tensor'):
            out = self.linear(torch.stack(inputs))
            return dict(loss=out.square().mean()) if mode == 'loss' else out

    data = [dict(inputs=torch.full((2,), float(i))) for i in range(4)]
    runner = Runner(
        model=Toy(), work_dir=str(work_dir),
        experiment_name=f'toy_{os.getpid()}_{time.time_ns()}',
        train_dataloader=dict(dataset=data, batch_size=2,
                              sampler=dict(type='DefaultSampler',
                                           shuffle=False),
                              collate_fn=dict(type='pseudo_collate')),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        train_cfg=dict(by_epoch=True, max_epochs=max_epochs),
        default_hooks=dict(checkpoint=dict(
            dict(type='AtomicCheckpointHook', interval=1,
                 backend_args=dict(backend='local_atomic')),
            **checkpoint_options)),
        resume=resume,
        # leave mmdet, not mmengine, as the current default scope: the
        # OpenMMLab tests build unscoped ``type='PosMLP'``
        default_scope='mmdet')
    runner.train()


@pytest.mark.parametrize('backend_args', ['as shipped', None])
def test_real_checkpoint_hook_writes_both_files_atomically(
        tmp_path, monkeypatch, backend_args):
    """The checkpoint hook, configured as the shipped configs do (or with
    no backend named), writes the .pth through the atomic backend and the
    marker atomically: every file it writes is renamed into place."""
    written = []
    real = atomic_io.atomic_write_bytes

    def recording(data, filepath):
        written.append(osp.basename(os.fspath(filepath)))
        real(data, filepath)
    monkeypatch.setattr(atomic_io, 'atomic_write_bytes', recording)
    options = {} if backend_args == 'as shipped' else dict(backend_args=None)
    _train_toy(tmp_path / 'toy', max_epochs=2, **options)
    assert written == ['epoch_1.pth', 'last_checkpoint',
                       'epoch_2.pth', 'last_checkpoint']
    work = tmp_path / 'toy'
    assert find_latest_checkpoint(str(work)) == str(work / 'epoch_2.pth')
    assert _load_checkpoint(str(work / 'epoch_2.pth'))['meta']['epoch'] == 2
    assert glob.glob(str(work / '.*.partial')) == []


@pytest.mark.parametrize('hook', ['AtomicCheckpointHook', 'CheckpointHook'])
def test_max_keep_one_keeps_the_latest_until_a_new_one_is_marked(
        tmp_path, monkeypatch, hook):
    """With max_keep_ckpts=1 mmengine's CheckpointHook removes the previous
    checkpoint before it writes the next one (the control). The checkpoint
    the marker names must survive until the new checkpoint is complete and
    marked, so that a kill during the write still leaves something to
    resume from; afterwards only the newest one is left."""
    work = tmp_path / 'keep_one'
    seen_while_writing = {}
    real = atomic_io.atomic_write_bytes

    def recording(data, filepath):
        name = osp.basename(os.fspath(filepath))
        if name.startswith('epoch_'):
            marker = work / 'last_checkpoint'
            seen_while_writing[name] = (
                sorted(p.name for p in work.glob('epoch_*.pth')),
                osp.basename(marker.read_text()) if marker.exists() else None)
        real(data, filepath)
    monkeypatch.setattr(atomic_io, 'atomic_write_bytes', recording)
    _train_toy(work, max_epochs=3, type=hook, max_keep_ckpts=1)
    if hook == 'CheckpointHook':  # mmengine's: nothing left to resume from
        assert seen_while_writing['epoch_2.pth'] == ([], 'epoch_1.pth')
        return
    assert seen_while_writing == {
        'epoch_1.pth': ([], None),
        'epoch_2.pth': (['epoch_1.pth'], 'epoch_1.pth'),
        'epoch_3.pth': (['epoch_2.pth'], 'epoch_2.pth')}
    assert sorted(p.name for p in work.glob('epoch_*.pth')) == ['epoch_3.pth']
    assert find_latest_checkpoint(str(work)) == str(work / 'epoch_3.pth')


def test_a_checkpoint_a_kill_left_behind_is_removed_on_resume(tmp_path):
    """A kill after the marker names the new checkpoint but before the
    outdated one is removed leaves that one on disk. The new checkpoint
    still lists it, so the resumed run removes it."""
    work = tmp_path / 'keep_one'
    _train_toy(work, max_epochs=2, max_keep_ckpts=1)
    saved = _load_checkpoint(str(work / 'epoch_2.pth'))
    assert saved['message_hub']['runtime_info']['keep_ckpt_ids'] == [1, 2]
    assert sorted(p.name for p in work.glob('epoch_*.pth')) == ['epoch_2.pth']
    (work / 'epoch_1.pth').write_bytes(b'left by a kill')
    _train_toy(work, max_epochs=3, resume=True, max_keep_ckpts=1)
    assert sorted(p.name for p in work.glob('epoch_*.pth')) == ['epoch_3.pth']
    assert find_latest_checkpoint(str(work)) == str(work / 'epoch_3.pth')


# ------------------------------------------------------ interrupted runs
@pytest.fixture(scope='module')
def data_root(tmp_path_factory):
    root = tmp_path_factory.mktemp('interrupted_data')
    demo_data.make_detection_set(str(root / 'coco'), num_train=8, num_val=4,
                                 seed=3)
    return root / 'coco'


def _config(data_root, path, kill=None):
    """The demo detector, shrunk to 3 epochs of 2 iterations, and made
    deterministic; ``kill`` adds the KillPoint hook."""
    cfg = Config.fromfile(DEMO_DET)
    root = str(data_root) + '/'
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        loader = cfg[key]
        loader.batch_size = 4
        loader.num_workers = 0
        loader.persistent_workers = False
        loader.dataset.data_root = root
    # one worker, created anew each epoch and seeded by mmengine from the
    # run's seed: the augmentation (RandomFlip) draws the same numbers in
    # an epoch whether or not the run was resumed before it
    cfg.train_dataloader.num_workers = 1
    cfg.val_evaluator.ann_file = root + 'annotations/instances_val.json'
    cfg.test_evaluator = cfg.val_evaluator
    cfg.train_cfg.max_epochs = EPOCHS
    cfg.train_cfg.val_interval = EPOCHS
    cfg.default_hooks.checkpoint.interval = 1
    cfg.default_hooks.logger.interval = 1
    cfg.model.test_cfg.score_thr = 0.0  # keep detections: mAP is computed
    cfg.randomness = dict(seed=0, deterministic=True)
    # as shipped: the opt-in runtime, its hook and its backend
    assert cfg.custom_imports.imports == ['posmlp_dense',
                                          'posmlp_dense.openmmlab.runtime']
    assert cfg.default_hooks.checkpoint.type == 'AtomicCheckpointHook'
    assert cfg.default_hooks.checkpoint.backend_args == dict(
        backend='local_atomic')
    if kill is not None:
        cfg.custom_imports.imports.append('kill_point')
        cfg.custom_hooks = [dict(type='KillPoint', **kill)]
    cfg.dump(str(path))
    return str(path)


def _marker(work):
    return open(osp.join(work, 'last_checkpoint')).read().strip()


def test_killed_training_resumes_to_the_uninterrupted_result(
        data_root, tmp_path, kill_module):
    env = _env(kill_module)
    plain_cfg = _config(data_root, tmp_path / 'cfg.py')
    straight = str(tmp_path / 'straight')
    broken = str(tmp_path / 'broken')
    logs = {name: str(tmp_path / f'{name}.log') for name in
            ('straight', 'kill1', 'resume1', 'resume2', 'test_a', 'test_b')}

    # the uninterrupted run, alongside the interrupted one
    with open(logs['straight'], 'w') as log:
        reference = _start(['tools/train.py', plain_cfg, '--work-dir',
                            straight], env, log)

    # 1. SIGKILL in the middle of epoch 2 (after its first iteration)
    ready = str(tmp_path / 'READY1')
    cfg1 = _config(data_root, tmp_path / 'kill1.py',
                   kill=dict(ready_file=ready, epoch=1, batch_idx=0))
    with open(logs['kill1'], 'w') as log:
        run = _start(['tools/train.py', cfg1, '--work-dir', broken], env, log)
    # stopped after the run's third iteration (runner.iter counts from 0)
    assert _kill_when_ready(run, ready, logs['kill1']) == 'iter 2'
    assert _marker(broken) == osp.join(broken, 'epoch_1.pth')
    assert not osp.exists(osp.join(broken, 'epoch_2.pth'))

    # 2. --resume continues from epoch 1; SIGKILL while epoch_3.pth is
    # being written (half of its bytes are on disk)
    ready = str(tmp_path / 'READY2')
    cfg2 = _config(data_root, tmp_path / 'kill2.py',
                   kill=dict(ready_file=ready, epoch=2, during_save=True))
    with open(logs['resume1'], 'w') as log:
        run = _start(['tools/train.py', cfg2, '--work-dir', broken,
                      '--resume'], env, log)
    stopped = _kill_when_ready(run, ready, logs['resume1'])
    half, total = map(int, stopped.split(' of '))
    assert total > 1_000_000 and 0 < half < total  # the .pth, mid-write
    text = open(logs['resume1']).read()
    assert f'Auto resumed from the latest checkpoint ' \
           f'{osp.join(broken, "epoch_1.pth")}' in text
    assert 'resumed epoch: 1, iter: 2' in text
    # the checkpoint being written is not under its name, not the latest
    assert not osp.exists(osp.join(broken, 'epoch_3.pth'))
    assert [os.path.getsize(p) for p in _partials(broken, 'epoch_3.pth')] \
        == [half]
    assert _marker(broken) == osp.join(broken, 'epoch_2.pth')
    assert _load_checkpoint(_marker(broken))['meta']['epoch'] == 2

    # 3. --resume again: finishes from epoch 2
    with open(logs['resume2'], 'w') as log:
        run = _start(['tools/train.py', plain_cfg, '--work-dir', broken,
                      '--resume'], env, log)
    _finish(run, logs['resume2'])
    assert 'resumed epoch: 2, iter: 4' in open(logs['resume2']).read()
    _finish(reference, logs['straight'])
    assert _marker(broken) == osp.join(broken, f'epoch_{EPOCHS}.pth')

    # the same weights, optimizer state and schedule, bit for bit
    ours = _load_checkpoint(osp.join(broken, f'epoch_{EPOCHS}.pth'))
    theirs = _load_checkpoint(osp.join(straight, f'epoch_{EPOCHS}.pth'))
    assert ours['meta']['epoch'] == theirs['meta']['epoch'] == EPOCHS
    assert ours['meta']['iter'] == theirs['meta']['iter'] == EPOCHS * 2
    assert ours['state_dict'].keys() == theirs['state_dict'].keys()
    for key, value in theirs['state_dict'].items():
        assert torch.equal(ours['state_dict'][key], value), key
    _assert_same_state(ours['optimizer'], theirs['optimizer'], 'optimizer')
    _assert_same_state(ours['param_schedulers'],
                       theirs['param_schedulers'], 'param_schedulers')
    # the weights did train: not equal to the first epoch's
    first = _load_checkpoint(osp.join(straight, 'epoch_2.pth'))['state_dict']
    assert not all(torch.equal(first[k], v)
                   for k, v in theirs['state_dict'].items())

    # tools/test.py gives the same metrics for both final checkpoints
    outs = []
    procs = []
    for name, work in (('test_a', straight), ('test_b', broken)):
        out = str(tmp_path / f'{name}.json')
        outs.append(out)
        with open(logs[name], 'w') as log:
            procs.append(_start(['tools/test.py', plain_cfg,
                                 osp.join(work, f'epoch_{EPOCHS}.pth'),
                                 '--work-dir', str(tmp_path / name),
                                 '--out', out], env, log))
    for name, proc in zip(('test_a', 'test_b'), procs):
        _finish(proc, logs[name])
    metrics = [json.load(open(out)) for out in outs]
    assert 'coco/bbox_mAP' in metrics[0]
    assert metrics[0] == metrics[1]


def _assert_same_state(a, b, where):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_same_state(a[key], b[key], f'{where}/{key}')
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same_state(x, y, f'{where}[{i}]')
    else:
        assert a == b, f'{where}: {a!r} != {b!r}'
