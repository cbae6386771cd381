"""tools/benchmark.py and benchmarks in a tiny configuration (no
assertions on speed; the stem clock's test checks where known pauses are
counted, with lower bounds only)."""
from __future__ import annotations

import json
import mmap
import time

import pytest
import torch
from torch import nn

from posmlp_dense import PosMLP
from benchmarks.measure import (Job, PeakMemory, SavedActivations,
                                fit_exponent, make_step,
                                minor_page_faults, run_jobs,
                                timed_call)
from benchmarks.models import build_models
from benchmarks.published_port import PublishedPort
from benchmarks.training import (StemClock, TrainingCase,
                                 build_detector, footprint,
                                 footprint_in_fresh_process,
                                 run_training, stem_modules,
                                 stem_split, step_flops,
                                 training_job)

from conftest import load_tool, randomize_


# Windows that tile every level of a 112 x 112 input: maps 28, 14, 7, 4.
ARCH = dict(embed_dims=[16, 32, 64, 128], depths=[1, 1, 2, 1],
            mlp_ratio=[4, 4, 4, 2], gamma=[4, 8, 16, 32],
            window_size=[7, 7, 7, 4])
SIZE = 112


@pytest.fixture(scope='module')
def bench():
    return load_tool('benchmark')


def level_maps(size: int):
    """Map side of each level: stem /4 (two stride-2 convs), then /2."""
    def down(s):
        return (s + 2 - 3) // 2 + 1
    side = down(down(size))
    sides = [side]
    for _ in ARCH['embed_dims'][1:]:
        sides.append(down(sides[-1]))
    return sides


def expected_macs(size: int):
    """(convolutions + channel MLPs, token mixing) multiply-adds at batch 1.

    The mixing is the range [T n K, T' n K + weights] per block: T tokens,
    n tokens per window, K gate channels; an implementation may mix the
    windows padded to whole ones (T' tokens), and compute the gate's
    weights with matmuls (groups x n x n times the 6 score features, and
    the key scale of windows x n keys, done twice).
    """
    dims, sides = ARCH['embed_dims'], level_maps(size)
    c0 = dims[0]
    half = size // 2 + size % 2
    dense = half * half * (c0 // 2) * 3 * 9          # stem conv 3x3/2
    dense += sides[0] ** 2 * c0 * (c0 // 2) * 9       # stem conv 3x3/2
    dense += sides[0] ** 2 * c0 * c0                  # stem conv 1x1
    mix_lo = mix_hi = 0
    for i, dim in enumerate(dims):
        tokens = sides[i] ** 2
        if i:  # depthwise-grouped conv 3x3/2: one input channel per output
            dense += tokens * dim * 9
        hidden = int(ARCH['mlp_ratio'][i] * dim)
        k = hidden // 2
        n = ARCH['window_size'][i] ** 2
        side = ARCH['window_size'][i]
        windows = (-(-sides[i] // side)) ** 2
        groups = ARCH['gamma'][i]
        for _ in range(ARCH['depths'][i]):
            dense += tokens * (dim * hidden + k * dim)
            mix_lo += tokens * n * k
            mix_hi += windows * n * n * k + groups * n * n * (6 + 2 * windows)
    return dense, mix_lo, mix_hi


@pytest.fixture
def one_thread():
    """One torch thread: on a small, busy machine two threads per process
    can stall for seconds; the benchmark itself keeps torch's default."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_benchmark_main_tiny(bench, tmp_path, one_thread):
    out = tmp_path / 'bench' / 'b.json'
    report = bench.main([
        '--device', 'cpu', '--models', 'posmlp_t,published_port',
        '--fwdbwd-models', 'posmlp_t,published_port',
        '--posmlp-arch', json.dumps(ARCH), '--sizes', str(SIZE),
        '--batches', '1', '--modes', 'fwd,fwdbwd', '--repeats', '1',
        '--warmup', '1', '--scaling-sizes', '64,96',
        '--scaling-models', 'posmlp_t', '--scaling-repeats', '1',
        '--check-size', str(SIZE), '--calib-size', '256', '--no-training',
        '--out', str(out)])
    data = json.loads(out.read_text())
    assert (tmp_path / 'bench' / 'b.md').read_text().startswith('###')
    assert data['training'] == [] and data['targets']['training'] == []
    assert (tmp_path / 'bench' / 'b.png').stat().st_size > 0

    env = data['environment']
    for key in ('torch', 'threads', 'device', 'time', 'allocator'):
        assert key in env
    assert env['threads'] >= 1
    # a run under malloc settings says so in its Markdown
    from benchmarks.report import markdown
    env['allocator'] = {'GLIBC_TUNABLES': 'glibc.malloc.trim_threshold=1'}
    assert '`GLIBC_TUNABLES=glibc.malloc.trim_threshold=1`' in markdown(data)
    env['allocator'] = {}
    assert 'Memory allocator settings' not in markdown(data)
    assert data['calibration']['peak_gflops'] > 0

    got = {(r['model'], r['mode']) for r in data['results']}
    assert got == {('posmlp_t', 'fwd'), ('published_port', 'fwd'),
                   ('posmlp_t', 'fwdbwd'), ('published_port', 'fwdbwd')}
    for r in data['results']:
        assert r['size'] == [SIZE, SIZE] and r['batch'] == 1
        assert len(r['times']) == 1 and len(r['warmup_times']) == 1
        for key in ('median_s', 'images_per_s', 'params', 'gmacs_per_image',
                    'gflops_per_s', 'fraction_of_matmul'):
            assert r[key] > 0, (r['model'], key)
        assert r['peak_mem_mb'] is not None and r['peak_mem_mb'] >= 0
        assert r['page_faults'] is None or r['page_faults'] >= 0

    # the published port reproduces PosMLP at a size the windows tile
    assert data['port_check']['ok'], data['port_check']
    # targets and scaling lines exist
    assert data['targets']['posmlp_vs_port']
    fit = data['scaling']['posmlp_t']
    assert fit['sizes'] == [[64, 64], [96, 96]]
    assert all(s > 0 for s in fit['median_s'])
    assert isinstance(fit['exponent'], float)

    # the MAC counter sees the token mixing, not only the channel MLPs
    dense, mix_lo, mix_hi = expected_macs(SIZE)
    macs = data['macs']['posmlp_t']['fwd'][f'{SIZE}x{SIZE}']['gmacs'] * 1e9
    assert dense + mix_lo <= macs <= dense + mix_hi + 1e-3 * dense
    assert macs - dense >= 0.99 * mix_lo
    port = data['macs']['published_port']['fwd'][f'{SIZE}x{SIZE}']['gmacs']
    # the port also computes its posmaps in every forward: per block, the
    # (n, n, 5) offset features times (5, groups) score coefficients, and
    # the groups' 2x2 spreads times their transposes
    posmaps = sum((ARCH['window_size'][i] ** 4 * 5 + 8) * ARCH['gamma'][i]
                  * depth for i, depth in enumerate(ARCH['depths']))
    assert port * 1e9 == pytest.approx(dense + mix_lo + posmaps, rel=1e-9)
    # forward + backward counts the backward matmuls too
    fb = data['macs']['posmlp_t']['fwdbwd'][f'{SIZE}x{SIZE}']['gmacs'] * 1e9
    assert fb > 2 * macs
    assert report['results'][0]['model'] == data['results'][0]['model']


@pytest.mark.parametrize('gate', ['gqpe', 'lrpe'])
def test_published_port_matches(gate):
    torch.manual_seed(0)
    model = randomize_(PosMLP(ARCH, gate=gate,
                              out_indices=(0, 1, 2, 3))).eval()
    port = PublishedPort(model)
    x = torch.randn(2, 3, SIZE, SIZE)
    with torch.no_grad():
        ref, got = model(x), port(x)
    for a, b in zip(ref, got):
        assert a.shape == b.shape
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
    # any other size runs on zero-padded windows (not masked: no equality)
    with torch.no_grad():
        ref, got = model(torch.randn(1, 3, 100, 90)), port(
            torch.randn(1, 3, 100, 90))
    assert [a.shape for a in ref] == [b.shape for b in got]
    # train mode: gradients reach the shared parameters
    model.train()
    sum(o.mean() for o in port(x[:1])).backward()
    pos = model.levels[0].encoder[0].gate_unit.pos
    assert all(p.grad is not None for p in pos.parameters())


def test_fit_exponent():
    px = [512 ** 2, 1024 ** 2, 1600 ** 2]
    fit = fit_exponent(px, [3e-7 * p for p in px])
    assert abs(fit['exponent'] - 1.0) < 1e-9 and fit['r2'] > 0.999
    fit = fit_exponent(px, [1e-9 * p ** 1.5 for p in px])
    assert abs(fit['exponent'] - 1.5) < 1e-9


def test_peak_memory_sees_an_allocation():
    mem = PeakMemory(torch.device('cpu'))
    with mem:
        x = torch.ones(64 * 2 ** 20 // 4)  # 64 MiB, touched
        del x
    if mem.peak is None:
        pytest.skip('no /proc on this system')
    assert mem.peak >= 48 * 2 ** 20, (mem.method, mem.peak)


def test_backbone_step_backpropagates_a_real_gradient():
    """The training step's loss must not be constant while the output
    LayerNorms are at their initial values (a sum of squares is: its
    gradient reaches the stem as rounding residue, here about 0.007 against
    several hundred)."""
    torch.manual_seed(0)
    model = PosMLP(dict(embed_dims=(16, 32), depths=(1, 1),
                        mlp_ratio=(4, 4), gamma=(4, 8),
                        window_size=((5, 5), (4, 4))),
                   out_indices=(0, 1)).train()
    assert model.out_norm
    make_step(model, 'fwdbwd')(torch.randn(2, 3, 40, 40))
    assert model.patch_embed.projs[0].weight.grad.abs().max() > 1.0


def test_timed_calls_run_outside_the_memory_measurement(monkeypatch):
    """PeakMemory has glibc return freed memory to the OS first, so a call
    timed inside it pays for faulting its working set in again: the timed
    rounds must run without it, and the peak comes from one extra call."""
    trims = []
    monkeypatch.setattr(PeakMemory, 'trim', classmethod(
        lambda cls: trims.append(1)))
    calls = []

    def step():
        calls.append(1)
        torch.ones(4 * 2 ** 20 // 4)  # 4 MiB, touched

    runs = run_jobs([Job(('a',), 'a', step)], repeats=3, warmup=1,
                    device=torch.device('cpu'), mem_interval=0.001,
                    label=str, start=time.perf_counter())
    entry = runs[('a',)]
    assert len(calls) == 1 + 3 + 1
    assert len(entry['times']) == 3 and len(entry['peaks']) == 1
    if minor_page_faults() is None:
        pytest.skip('no page-fault count on this system')
    assert all(isinstance(f, int) and f >= 0 for f in entry['faults'])
    if entry['peaks'][0] is not None:  # /proc present: measured once
        assert len(trims) == 1
    # A fresh anonymous mapping is faulted in page by page. (Not a fresh
    # tensor: whether malloc maps one anew depends on what the process
    # freed before, so that count can be 0 after other tests.)
    size = 16 * 2 ** 20
    with mmap.mmap(-1, size) as block:
        try:  # one fault per 4 KiB page, not per 2 MiB huge page
            block.madvise(mmap.MADV_NOHUGEPAGE)
        except (AttributeError, OSError):
            pass  # no transparent huge pages here: 4 KiB pages anyway

        def touch_every_page():
            for offset in range(0, size, mmap.PAGESIZE):
                block[offset] = 1

        _, faults = timed_call(touch_every_page, torch.device('cpu'))
    assert faults >= size // mmap.PAGESIZE // 2


# ------------------------------------------------------------ training part
TRAIN_SHAPE = (1, 64, 64)
DETECTOR_SHAPE = (1, 64, 96)


def test_benchmark_training_rows_tiny(bench, tmp_path, one_thread):
    """--training-only: backbone steps with and without with_cp, measured
    in this process (the fresh-process measurement has its own test)."""
    out = tmp_path / 'train.json'
    report = bench.main([
        '--device', 'cpu', '--training-only', '--posmlp-arch',
        json.dumps(ARCH), '--train-models', 'posmlp_t,swin_t',
        '--train-shapes', 'x'.join(map(str, TRAIN_SHAPE)),
        '--train-cp', 'off,on', '--detectors', 'none',
        '--train-repeats', '1', '--train-warmup', '0',
        '--train-memory', 'inprocess', '--calib-size', '256',
        '--out', str(out)])
    data = json.loads(out.read_text())
    assert data['results'] == [] and data['scaling'] == {}
    assert 'port_check' not in data
    # nothing to draw without inference rows
    assert 'chart' not in report['files']
    rows = {(r['model'], r['with_cp']): r for r in data['training']}
    assert set(rows) == {('posmlp_t', False), ('posmlp_t', True),
                         ('swin_t', False), ('swin_t', True)}
    for key, r in rows.items():
        assert r['kind'] == 'backbone' and r['shape'] == list(TRAIN_SHAPE)
        assert len(r['times']) == 1 and r['median_s'] > 0, key
        assert r['page_faults'] is None or r['page_faults'] >= 0, key
        assert r['memory'] == 'inprocess' and r['peak_mb'] is not None
        assert r['peak_first_step_mb'] is None  # only a fresh process has it
        assert r['saved_activation_mb_per_image'] > 0, key
        assert r['params'] > 0
        # the stem's share of the same (single) timed step
        assert len(r['stem_times']) == 1, key
        assert 0 < r['stem_median_s'] < r['median_s'], key
        assert r['without_stem_median_s'] == pytest.approx(
            r['median_s'] - r['stem_median_s']), key
        # FLOPs per image (step_flops has its own test), and their rate
        assert r['gflop_per_image'] > 0, key
        assert r['achieved_gflops'] == pytest.approx(
            r['gflop_per_image'] * TRAIN_SHAPE[0] / r['median_s']), key
    for model in ('posmlp_t', 'swin_t'):
        # checkpointing keeps fewer activations for the backward
        assert (rows[model, True]['saved_activation_mb_per_image']
                < rows[model, False]['saved_activation_mb_per_image']), model
    targets = data['targets']['training']
    assert [e['with_cp'] for e in targets] == [False, True]
    for e in targets:
        assert e['kind'] == 'backbone' and e['time_ratio'] > 0
        swin = rows['swin_t', e['with_cp']]['saved_activation_mb_per_image']
        assert e['saved_ratio'] == pytest.approx(
            rows['posmlp_t', e['with_cp']]['saved_activation_mb_per_image']
            / swin)
        assert 'met' in e  # backbone steps have a target
        mine = rows['posmlp_t', e['with_cp']]
        assert e['time_ratio_without_stem'] == pytest.approx(
            mine['without_stem_median_s']
            / rows['swin_t', e['with_cp']]['without_stem_median_s'])
        assert e['stem_s'] == mine['stem_median_s']
        assert e['flop_ratio'] == pytest.approx(
            mine['gflop_per_image']
            / rows['swin_t', e['with_cp']]['gflop_per_image'])
        # one timed round: the paired ratio is that round's ratio
        assert e['time_ratio_paired'] == pytest.approx(e['time_ratio'])
    md = (tmp_path / 'train.md').read_text()
    assert '### Training cost' in md
    assert 'step time without the stem' in md
    assert '| backbone | Swin-T (with_cp) |' in md


def test_benchmark_detector_iteration_tiny(bench, tmp_path, one_thread):
    """RetinaNet-PosMLP (tiny arch) and RetinaNet-Swin-T: one whole
    train_step each, measured in this process."""
    out = tmp_path / 'det.json'
    bench.main([
        '--device', 'cpu', '--training-only', '--posmlp-arch',
        json.dumps(ARCH), '--train-models', 'none', '--train-cp', 'off',
        '--detectors', 'posmlp_t,swin_t',
        '--detector-shape', 'x'.join(map(str, DETECTOR_SHAPE)),
        '--train-repeats', '1', '--train-warmup', '0',
        '--train-memory', 'inprocess', '--calib-size', '256',
        '--out', str(out)])
    data = json.loads(out.read_text())
    rows = {r['model']: r for r in data['training']}
    assert set(rows) == {'posmlp_t', 'swin_t'}
    for r in rows.values():
        assert r['kind'] == 'detector' and not r['with_cp']
        assert r['shape'] == list(DETECTOR_SHAPE) and r['median_s'] > 0
        assert r['saved_activation_mb_per_image'] > 0
        assert r['peak_mb'] is not None
        # a detector is its backbone, an FPN and a RetinaNet head
        assert 0 < r['backbone_params'] < r['params']
    (e,) = data['targets']['training']
    assert e['kind'] == 'detector' and e['time_ratio'] > 0
    assert 'met' not in e  # reported, no target
    assert 'RetinaNet-Swin-T' in (tmp_path / 'det.md').read_text()


class _Pause(torch.autograd.Function):
    """Identity that sleeps ``seconds`` in its forward and its backward."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


class _SlowStage(nn.Module):
    def __init__(self, seconds):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.seconds = seconds

    def forward(self, x):
        return _Pause.apply(self.conv(x), self.seconds)


class _PausingBackbone(nn.Module):
    """A stem and a level whose forward and backward each take a known
    least time."""

    def __init__(self, stem_s, level_s):
        super().__init__()
        self.patch_embed = _SlowStage(stem_s)
        self.level = _SlowStage(level_s)

    def forward(self, x):
        return (self.level(self.patch_embed(x)),)


@pytest.mark.parametrize('model_name', ['posmlp_t', 'swin_t'])
def test_step_flops_counts_a_real_training_step(model_name):
    """The count (on fake tensors, at batch 1) equals FlopCounterMode's
    count of a real training step of the same model at batch 1, and the
    model is left in train mode for the steps measured after it."""
    from torch.utils.flop_counter import FlopCounterMode
    models = build_models([model_name], posmlp_arch=ARCH)
    model = models[model_name]
    model.train()
    x = torch.randn(1, 3, 48, 64)
    step = make_step(model, 'fwdbwd')
    step(x)
    with FlopCounterMode(display=False) as counter:
        step(x)
    counted = step_flops(model, (2, 48, 64), 0.5, torch.device('cpu'))
    assert counted['gflop_per_image'] == pytest.approx(
        counter.get_total_flops() / 1e9, rel=1e-9)
    assert counted['gflop_counted'] == 'fake'
    assert counted['achieved_gflops'] == pytest.approx(
        counted['gflop_per_image'] * 2 / 0.5)
    assert all(m.training for m in model.modules())


def test_training_rows_without_flop_counting(one_thread):
    """--no-count (flop_count=None, e.g. for a short CUDA run) skips
    the FLOP count of the training rows; the report shows a dash."""
    from benchmarks.report import training_markdown
    case = TrainingCase('backbone', 'posmlp_t', False, (1, 32, 32))
    rows = run_training([case], repeats=1, warmup=0,
                        device=torch.device('cpu'), memory='none',
                        posmlp_arch=ARCH, flop_count=None)
    assert 'gflop_per_image' not in rows[0] and rows[0]['median_s'] > 0
    report = dict(training=rows, targets=dict(training=[]),
                  config=dict(train_repeats=1, train_warmup=0))
    row_line = [line for line in training_markdown(report)
                if line.startswith('| backbone | PosMLP-T |')]
    assert len(row_line) == 1 and '| - | - |' in row_line[0]


def test_stem_clock_splits_a_step_between_stem_and_levels():
    """Each part's forward and backward are counted to it: the stem (first
    forward, last backward) gets at least its two pauses, the rest at
    least the level's two."""
    stem_s, level_s = 0.03, 0.05
    model = _PausingBackbone(stem_s, level_s)
    clock = StemClock(model, torch.device('cpu'))
    x = torch.randn(1, 3, 8, 8)
    step = make_step(model, 'fwdbwd')
    steps = []
    for _ in range(2):
        t = time.perf_counter()
        clock.timing(lambda: step(x))()
        steps.append(time.perf_counter() - t)
    assert len(clock.times) == 2
    for stem, whole in zip(clock.times, steps):
        assert stem >= 2 * stem_s
        assert whole - stem >= 2 * level_s
    split = stem_split(clock.times, steps)
    assert split['without_stem_median_s'] >= 2 * level_s
    # a stem that did not run leaves no time, rather than a wrong one
    clock.timing(lambda: None)()
    assert clock.times[-1] is None
    assert stem_split(clock.times[-1:], [1.0])['stem_median_s'] is None


def test_stem_modules_of_the_compared_backbones():
    models = build_models(['posmlp_t', 'swin_t', 'resnet50'],
                          posmlp_arch=ARCH)
    assert stem_modules(models['posmlp_t'])[0] is \
        models['posmlp_t'].patch_embed
    assert type(stem_modules(models['swin_t'])[0]).__name__ == 'PatchEmbed'
    first, last = stem_modules(models['resnet50'])
    assert isinstance(first, nn.Conv2d) and isinstance(last, nn.MaxPool2d)
    with pytest.raises(ValueError, match='no known stem'):
        stem_modules(nn.Linear(2, 2))


def test_retinanets_differ_by_their_backbones_only():
    dets = {name: build_detector(name) for name in ('posmlp_t', 'swin_t')}
    for part in ('neck', 'bbox_head'):
        shapes = [{k: tuple(v.shape) for k, v in
                   getattr(det, part).state_dict().items()}
                  for det in dets.values()]
        assert shapes[0] == shapes[1] and shapes[0], part
    assert isinstance(dets['posmlp_t'].backbone, PosMLP)
    assert type(dets['swin_t'].backbone).__name__ == 'SwinTransformer'
    assert dets['posmlp_t'].backbone.out_indices == (1, 2, 3)


def test_training_footprint_in_a_fresh_process(one_thread):
    """The fresh process measures the same model as this one: equal saved
    activation bytes (they depend only on the model and the input), and a
    peak growth of at least those bytes."""
    case = TrainingCase('backbone', 'posmlp_t', False, (2, 64, 64))
    fresh = footprint_in_fresh_process(case, torch.device('cpu'), 0, ARCH)
    job, model = training_job(case, torch.device('cpu'), 0, ARCH)
    here = footprint(job, model, torch.device('cpu'), 2)
    assert fresh['saved_activation_mb_per_image'] == pytest.approx(
        here['saved_activation_mb_per_image'], rel=1e-12)
    if fresh['peak_method'] is None:
        pytest.skip('no /proc on this system')
    saved = fresh['saved_activation_mb_per_image'] * 2
    assert fresh['peak_first_step_mb'] >= saved
    assert fresh['peak_mb'] >= 0.5 * saved


def test_fresh_process_failure_is_reported():
    case = TrainingCase('backbone', 'posmlp_t', False, (1, 64, 64))
    bad_arch = dict(ARCH, window_size=[0, 7, 7, 4])
    with pytest.raises(RuntimeError, match='fresh process failed'):
        footprint_in_fresh_process(case, torch.device('cpu'), 0, bad_arch)


def test_saved_activations_counts_each_storage_once():
    lin = torch.nn.Linear(32, 32)
    x = torch.randn(8, 32, requires_grad=True)
    with SavedActivations(exclude=lin.parameters()) as saved:
        # saved: x and the weight (linear), h (ReLU's output)
        h = torch.relu(lin(x))
        # saved again: h (linear), a view of h (square), the weight
        out = lin(h).sum() + h[:, :16].square().sum()
    out.backward()
    assert saved.excluded_bytes == 32 * 32 * 4
    assert saved.activation_bytes == 2 * 8 * 32 * 4


def test_benchmark_out_is_checked_before_the_run(bench, tmp_path):
    """--out is settled before minutes of measuring: a directory gets
    benchmark.json inside, and a path that cannot be written is refused
    up front."""
    folder = tmp_path / 'results'
    folder.mkdir()
    assert bench.parse_args(['--out', str(folder)]).out == str(
        folder / 'benchmark.json')
    fresh = str(tmp_path / 'new') + '/'
    assert bench.parse_args(['--out', fresh]).out == fresh + 'benchmark.json'
    assert (tmp_path / 'new').is_dir()
    blocker = tmp_path / 'a_file'
    blocker.write_text('')
    with pytest.raises(SystemExit):
        bench.parse_args(['--out', str(blocker / 'b.json')])


def test_benchmark_rejects_bad_training_options(bench):
    with pytest.raises(SystemExit, match='bad training shape'):
        bench.main(['--training-only', '--train-shapes', '512x512'])
    with pytest.raises(SystemExit, match='unknown detector backbone'):
        bench.main(['--training-only', '--detectors', 'resnet50'])
    with pytest.raises(SystemExit, match='bad --train-cp'):
        bench.main(['--training-only', '--train-cp', 'yes'])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match='no CUDA device'):
            bench.main(['--device', 'cuda', '--training-only'])


def test_training_ratios_paired_round_by_round():
    """The paired ratio pairs each round's two steps (which ran back to
    back); the median ratio compares the two medians."""
    from benchmarks.report import training_targets

    def row(model, times, stem):
        return dict(kind='backbone', model=model, shape=[2, 64, 64],
                    with_cp=False, times=times, median_s=sorted(times)[1],
                    min_s=min(times), stem_median_s=stem,
                    without_stem_median_s=sorted(times)[1] - stem)
    # round ratios 2.0, 0.8, 0.9 -> paired 0.9; medians 8 / 10 -> 0.8
    (e,) = training_targets([row('posmlp_t', [2.0, 8.0, 9.0], 1.0),
                             row('swin_t', [1.0, 10.0, 10.0], 0.5)])
    assert e['time_ratio_paired'] == pytest.approx(0.9)
    assert e['time_ratio'] == pytest.approx(0.8)
    assert e['time_ratio_range'] == pytest.approx([0.8, 2.0])
    assert e['time_ratio_without_stem'] == pytest.approx(7.0 / 9.5)
    assert (e['stem_s'], e['swin_stem_s']) == (1.0, 0.5)


def test_training_verdict_says_when_the_rounds_disagree():
    """The target is judged on the medians; when some rounds have PosMLP-T
    ahead and others behind, the verdict says so, and the table gives the
    rounds' lowest and highest ratio."""
    from benchmarks.report import (training_markdown,
                                   training_targets)

    def row(model, times):
        return dict(kind='backbone', model=model, label=model,
                    shape=[2, 64, 64], with_cp=False, times=times,
                    median_s=sorted(times)[1], min_s=min(times),
                    images_per_s=1.0, params=1e6, memory='fresh')
    spread = 'span 1.00'
    for posmlp, swin, spans in (([2.0, 8.0, 9.0], [1.0, 10.0, 10.0], True),
                                ([0.9, 8.0, 9.0], [1.0, 10.0, 10.0], False)):
        rows = [row('posmlp_t', posmlp), row('swin_t', swin)]
        targets = training_targets(rows)
        lines = training_markdown(dict(
            training=rows, targets=dict(training=targets),
            config=dict(train_repeats=3, train_warmup=1)))
        (line,) = [x for x in lines if x.startswith('| backbone | 2x64x64')]
        assert '(met)' in line
        assert (spread in line) == spans, line
        low, high = targets[0]['time_ratio_range']
        assert f'({low:.2f}-{high:.2f})' in line


def test_inference_latency_ratio_paired_round_by_round():
    from benchmarks.report import target_lines

    def result(model, times):
        return dict(model=model, size=[800, 1333], batch=1, mode='fwd',
                    times=times, median_s=sorted(times)[1], min_s=min(times),
                    peak_mem_mb=None)
    report = dict(results=[result('posmlp_t', [2.0, 8.0, 9.0]),
                           result('swin_t', [1.0, 10.0, 10.0])])
    (e,) = target_lines(report)['posmlp_vs_swin']
    assert e['latency_ratio_paired'] == pytest.approx(0.9)
    assert e['latency_ratio'] == pytest.approx(0.8)
    assert e['met']  # judged on the medians


def test_allocator_settings_are_recorded_and_reported(monkeypatch):
    """A run under malloc settings that keep freed memory takes other page
    faults than one under the default: the report says which it was."""
    from benchmarks.measure import ALLOCATOR_SETTINGS, environment
    from benchmarks.report import allocator_line
    for name in ALLOCATOR_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    env = environment(torch.device('cpu'))
    assert env['allocator'] == {}
    assert allocator_line(env) is None
    tunables = 'glibc.malloc.mmap_threshold=4294967296'
    monkeypatch.setenv('GLIBC_TUNABLES', tunables)
    env = environment(torch.device('cpu'))
    assert env['allocator'] == {'GLIBC_TUNABLES': tunables}
    line = allocator_line(env)
    assert f'`GLIBC_TUNABLES={tunables}`' in line
    assert allocator_line({}) is None  # a report from before the field


def test_keep_freed_memory_runs_again_in_a_child_process(bench, tmp_path):
    """--keep-freed-memory: glibc reads its tunables when a process starts,
    so the run happens in a child started with them; its report (returned
    here) records them, says so in its Markdown, and measures no memory
    unless asked (a process that keeps freed memory hides a step's
    needs)."""
    import platform
    from benchmarks.measure import KEEP_FREED_MEMORY
    if platform.libc_ver()[0] != 'glibc':
        pytest.skip('glibc tunables only')
    out = tmp_path / 'kept.json'
    report = bench.main([
        '--device', 'cpu', '--training-only', '--keep-freed-memory',
        '--posmlp-arch', json.dumps(ARCH), '--train-models', 'posmlp_t',
        '--train-shapes', 'x'.join(map(str, TRAIN_SHAPE)),
        '--train-cp', 'off', '--detectors', 'none', '--train-repeats', '1',
        '--train-warmup', '0', '--calib-size', '256', '--out', str(out)])
    assert report == json.loads(out.read_text())
    tunables = report['environment']['allocator']['GLIBC_TUNABLES']
    assert all(t in tunables.split(':') for t in KEEP_FREED_MEMORY)
    (row,) = report['training']
    assert row['model'] == 'posmlp_t' and row['median_s'] > 0
    assert row['memory'] == 'none' and row.get('peak_mb') is None
    assert 'Memory allocator settings' in (tmp_path / 'kept.md').read_text()


def test_keeping_freed_memory_adds_to_other_tunables(monkeypatch):
    from benchmarks.measure import (
        KEEP_FREED_MEMORY, environment_keeping_freed_memory,
        keeps_freed_memory)
    import platform
    if platform.libc_ver()[0] != 'glibc':
        pytest.skip('glibc tunables only')
    monkeypatch.setenv('GLIBC_TUNABLES', 'glibc.malloc.mmap_threshold=1:'
                       'glibc.malloc.tcache_count=0')
    assert not keeps_freed_memory()
    env = environment_keeping_freed_memory()
    # ours replace a setting of the same name; others stay
    assert env['GLIBC_TUNABLES'].split(':') == [
        'glibc.malloc.tcache_count=0', *KEEP_FREED_MEMORY]
    monkeypatch.setenv('GLIBC_TUNABLES', env['GLIBC_TUNABLES'])
    assert keeps_freed_memory()
    # another C library would ignore the tunables: refused, by name
    monkeypatch.setattr(platform, 'libc_ver', lambda: ('', ''))
    with pytest.raises(RuntimeError, match="needs glibc's malloc"):
        environment_keeping_freed_memory()


def test_verdict_names_a_gap_in_page_faults():
    """On a CPU with glibc's default malloc one model may pay page faults
    the other does not (and no GPU pays): past PAGE_FAULT_GAP per call the
    verdict says the time ratio holds them, in training and in inference;
    without counts, or with close ones, it says nothing of them."""
    from benchmarks.report import (PAGE_FAULT_GAP, target_lines,
                                   training_targets, verdict)

    def step(model, faults):
        return dict(kind='backbone', model=model, shape=[2, 64, 64],
                    with_cp=False, times=[1.0, 1.0, 1.0], median_s=1.0,
                    min_s=1.0, page_faults=faults)

    def call(model, faults):
        return dict(model=model, size=[800, 1333], batch=1, mode='fwd',
                    times=[1.0, 1.0, 1.0], median_s=1.0, min_s=1.0,
                    peak_mem_mb=None, page_faults=faults)
    named = 'are part of the time ratio'
    for posmlp, swin, says in ((3, 113152, True),
                               (PAGE_FAULT_GAP, 0, True),
                               (0, PAGE_FAULT_GAP - 1, False),
                               (50000, 45000, False),
                               (None, 113152, False)):
        (train,) = training_targets([step('posmlp_t', posmlp),
                                     step('swin_t', swin)])
        (infer,) = target_lines(dict(results=[
            call('posmlp_t', posmlp), call('swin_t', swin)]))[
                'posmlp_vs_swin']
        for entry in (train, infer):
            text = verdict(entry)
            assert (named in text) == says, (posmlp, swin, text)
            if says:
                assert f'{posmlp:,} (PosMLP-T) against {swin:,} (Swin-T)' \
                    in text


def test_mmengine_compile_row_pads_sizes_and_names_the_form():
    """The docs' mmengine-compile table is rendered from the JSON: the
    sizes are the batches as the backbone sees them (the largest image,
    padded to 32), and each row names how the run compiled."""
    from benchmarks.mmengine_compile import render
    run = dict(config='c.py', form='dict', backend='inductor', iters=3,
               torch='2.x', mkldnn=False, failure=None,
               # 256x352 twice, then 160x224
               input_shapes=[[[250, 341], [192, 256]], [[256, 330]],
                             [[160, 200]]],
               losses=[{}, {}, {}], first_loss_max_relative_difference=0.0,
               graphs=2, graph_breaks=0, graph_modules=[['backbone'],
                                                        ['backbone']],
               abandoned_graph_modules=[],
               graphs_after_each_iteration=[1, 2, 2],
               recompiles_by_function={}, compiled_run_seconds=1.0)
    hooked = dict(run, form='backbone', mkldnn=True, graphs=1,
                  graph_modules=[['backbone']],
                  graphs_after_each_iteration=[1, 1, 1])
    rows = render([run, hooked]).splitlines()
    assert rows[2].startswith(
        "| `dict(backend='inductor', dynamic=True)`, mkldnn off | 3 "
        "(2 sizes) | 2 (0) | 1, 1 |")
    assert rows[3].startswith(
        "| none; `CompileBackboneHook(backend='inductor', dynamic=True)` "
        "| 3 (2 sizes) | 1 (0) | 1, 0 |")
