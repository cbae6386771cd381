"""The measuring kit's plumbing on tiny models and few rounds: the one
timing function, peak memory, the steps, ``tools/benchmark.py``'s parts
and the generated sections of docs/performance.md (no assertion on
speed)."""
from __future__ import annotations

import json
import os
import platform
import re
import sys

import pytest
import torch

from benchmarks import tables
from benchmarks.doc_sections import end_marker
from benchmarks.steps import SavedActivations, make_step
from benchmarks.targets import time_ratios
from benchmarks.timing import PeakMemory, interleaved
from posmlp_dense import PosMLP

from conftest import TINY_ARCH, load_tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PERFORMANCE = os.path.join(ROOT, 'docs', 'performance')
MMENGINE_RUNS = ['aot_eager_true', 'aot_eager_dict', 'inductor_true',
                 'inductor_dict', 'inductor_dict_without_mkldnn',
                 'inductor_backbone_hook']


@pytest.fixture(scope='module')
def bench():
    return load_tool('benchmark')


def test_interleaved_rounds_rotate_and_reset_each_call():
    """Every round runs every job once, starting one job further each
    round; resets follow their job's calls untimed; warm-up rounds are
    kept apart."""
    calls = []
    jobs = {n: (lambda n=n: calls.append(n)) for n in 'abc'}
    resets = {'b': lambda: calls.append('reset b')}
    runs = interleaved(jobs, repeats=3, warmup=1, reset=resets)
    assert calls == ['a', 'b', 'reset b', 'c',                # warm-up
                     'a', 'b', 'reset b', 'c',
                     'b', 'reset b', 'c', 'a',
                     'c', 'a', 'b', 'reset b']
    for run in runs.values():
        assert len(run['times']) == 3 and len(run['warmup_times']) == 1
        assert run['min_s'] <= run['median_s'] <= run['max_s']
        assert run['median_s'] == sorted(run['times'])[1]


def test_paired_ratio_is_the_median_of_the_rounds():
    """Rounds ran back to back: their ratios, not the medians', cancel a
    drift of the machine's speed."""
    ours = dict(times=[2.0, 8.0, 9.0], median_s=8.0, min_s=2.0)
    theirs = dict(times=[1.0, 10.0, 10.0], median_s=10.0, min_s=1.0)
    r = time_ratios(ours, theirs, 'ratio')
    assert r['ratio'] == pytest.approx(0.8)
    assert r['ratio_min'] == pytest.approx(2.0)
    assert r['ratio_paired'] == pytest.approx(0.9)
    assert r['ratio_range'] == pytest.approx([0.8, 2.0])


def test_peak_memory_sees_an_allocation():
    with PeakMemory(torch.device('cpu')) as mem:
        x = torch.ones(64 * 2 ** 20 // 4)  # 64 MiB, touched
        del x
    if mem.method is None:
        pytest.skip('no /proc/self/clear_refs here')
    assert mem.peak >= 48 * 2 ** 20, (mem.method, mem.peak)


def test_backbone_step_backpropagates_a_real_gradient():
    """The training step's loss must not be constant while the output
    LayerNorms are at their initial values (a sum of squares is: its
    gradient reaches the stem as rounding residue)."""
    torch.manual_seed(0)
    model = PosMLP(dict(embed_dims=(16, 32), depths=(1, 1),
                        mlp_ratio=(4, 4), gamma=(4, 8),
                        window_size=((5, 5), (4, 4))),
                   out_indices=(0, 1)).train()
    make_step(model, 'fwdbwd')(torch.randn(2, 3, 40, 40))
    assert model.patch_embed.projs[0].weight.grad.abs().max() > 1.0


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


def test_time_part_writes_rows_and_its_section(bench, tmp_path):
    """PosMLP (tiny) and Swin-T timed interleaved at an inference and a
    training step: the JSON's rows, and the page's cpu-vs-swin section
    rendered from them."""
    page = tmp_path / 'perf.md'
    page.write_text('# P\n\n<!-- generated: cpu-vs-swin -->\n'
                    '<!-- end generated: cpu-vs-swin -->\n\nhand-written\n')
    out = tmp_path / 'time.json'
    report = bench.main([
        'time', '--device', 'cpu', '--posmlp-arch', json.dumps(TINY_ARCH),
        '--models', 'posmlp_t,swin_t',
        '--steps', 'inference:1x56x56,train:1x56x56', '--repeats', '2',
        '--warmup', '0', '--out', str(out), '--update-doc', str(page)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    rows = report['results']
    assert [(r['model'], r['mode']) for r in rows] == [
        ('posmlp_t', 'fwd'), ('swin_t', 'fwd'), ('posmlp_t', 'fwdbwd'),
        ('swin_t', 'fwdbwd')]
    for row in rows:
        assert row['size'] == [56, 56] and row['batch'] == 1
        assert len(row['times']) == 2 and row['median_s'] > 0
        assert row['params'] > 0
        if platform.system() == 'Linux':
            assert row['peak_mem_mb'] is not None
    assert all(r['saved_activation_mb_per_image'] > 0 for r in rows[2:])
    text = page.read_text()
    assert text.endswith('<!-- end generated: cpu-vs-swin -->\n\n'
                         'hand-written\n')
    assert '| inference 1x3x56x56 |' in text
    assert '| training 1x3x56x56 |' in text


def test_time_part_times_compiled_models_beside_eager(bench, tmp_path):
    """--compile adds each model under torch.compile (here its eager
    backend, for speed), timed interleaved with eager, after the warmup
    that compiles it."""
    report = bench.main([
        'time', '--device', 'cpu', '--posmlp-arch', json.dumps(TINY_ARCH),
        '--models', 'posmlp_t', '--steps', 'inference:1x56x56',
        '--repeats', '2', '--compile', 'eager',
        '--out', str(tmp_path / 'time.json')])
    rows = report['results']
    assert [(r['model'], r['label']) for r in rows] == [
        ('posmlp_t', 'PosMLP-T'),
        ('posmlp_t_compiled', 'PosMLP-T, compiled (eager)')]
    assert all(len(r['times']) == 2 and len(r['warmup_times']) == 1
               for r in rows)
    assert rows[0]['params'] == rows[1]['params']


@pytest.mark.skipif(platform.libc_ver()[0] != 'glibc',
                    reason='glibc tunables only')
def test_keep_freed_memory_runs_again_in_a_child(bench, tmp_path):
    """glibc reads its tunables when a process starts: the run happens in
    a child started with them, and its report records them."""
    from benchmarks.environment import KEEP_FREED_MEMORY
    out = tmp_path / 'kept.json'
    report = bench.main([
        'time', '--device', 'cpu', '--posmlp-arch', json.dumps(TINY_ARCH),
        '--models', 'posmlp_t', '--steps', 'train:1x56x56', '--repeats', '1',
        '--warmup', '0', '--keep-freed-memory', '--out', str(out)])
    tunables = report['environment']['allocator']['GLIBC_TUNABLES']
    assert all(t in tunables.split(':') for t in KEEP_FREED_MEMORY)
    (row,) = report['results']
    assert row['median_s'] > 0
    # the section says so: runs compare under the same settings only
    section = tables.cpu_vs_swin_section(dict(report, results=[
        dict(row, model=m) for m in ('posmlp_t', 'swin_t')]))
    assert f'`GLIBC_TUNABLES={tunables}`' in section


def test_keeping_freed_memory_adds_to_other_tunables(monkeypatch):
    from benchmarks.environment import (
        KEEP_FREED_MEMORY, environment_keeping_freed_memory,
        keeps_freed_memory)
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
    monkeypatch.setattr(platform, 'libc_ver', lambda: ('', ''))
    with pytest.raises(RuntimeError, match="needs glibc's malloc"):
        environment_keeping_freed_memory()


@pytest.mark.parametrize('argv, message', [
    (['time', '--steps', 'fwd:1x64x64'], 'expected MODE:BxHxW'),
    (['time', '--steps', 'train:64x64'], 'expected 3 positive sizes'),
    (['time', '--compile', '--warmup', '0'], 'first call of a compiled'),
    (['gpu-proxy', '--models', 'vit'], 'unknown model vit'),
    (['compile', '--cases', '2:false'], 'write BATCH:true or BATCH:none'),
    (['versions', '--base', 'HEAD', '--shape', '1x3x0x77'],
     'expected 4 positive sizes'),
])
def test_bad_options_are_refused_by_name(bench, argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert message in capsys.readouterr().err


def test_the_page_and_out_are_checked_before_the_run(bench, tmp_path,
                                                     capsys):
    page = tmp_path / 'plain.md'
    page.write_text('<!-- generated: gpu-proxy -->\n'
                    '<!-- end generated: gpu-proxy -->\n')
    assert bench.parse_args(['gpu-proxy', '--update-doc', str(page)])
    with pytest.raises(SystemExit):  # a timing run writes the CPU table
        bench.parse_args(['time', '--update-doc', str(page)])
    assert "sections 'cpu-vs-swin'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args(['time', '--out', str(tmp_path)])
    assert 'a folder' in capsys.readouterr().err


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, '.git')),
                    reason='needs a git checkout (the base is a commit)')
def test_versions_times_head_against_this_checkout(bench, tmp_path):
    """HEAD's package, imported under another name, against this
    checkout's on the same weights: they agree, and every round is timed
    for both."""
    from benchmarks.versions import BASE_PACKAGE
    arch = dict(embed_dims=(16, 32), depths=(1, 1), mlp_ratio=(4, 4),
                gamma=(4, 8), window_size=((5, 5), (4, 4)))
    try:
        report = bench.main([
            'versions', '--base', 'HEAD', '--posmlp-arch', json.dumps(arch),
            '--shape', '1x3x45x77', '--rounds', '3', '--warmup', '0',
            '--out', str(tmp_path / 'v.json')])
    finally:
        for name in [n for n in sys.modules if n.startswith(BASE_PACKAGE)]:
            del sys.modules[name]
    result = report['versions']
    assert result['max_relative_difference'] < 1e-4
    ratios = [c / b for c, b in zip(result['times']['current'],
                                    result['times']['base'])]
    assert len(ratios) == 3
    assert result['ratio_paired'] == pytest.approx(sorted(ratios)[1])
    with pytest.raises(SystemExit, match='no-such-revision'):
        bench.main(['versions', '--base', 'no-such-revision',
                    '--out', str(tmp_path / 'w.json')])


def test_versions_that_compute_different_things_are_not_timed():
    from benchmarks.versions import check_agreement
    x = torch.ones(2, 3)
    with pytest.raises(SystemExit, match='compute different things'):
        check_agreement(lambda: ((x,), None), lambda: ((x * 1.01,), None))
    assert check_agreement(lambda: ((x,), x), lambda: ((x,), x)) == 0.0


def test_mmengine_compile_row_pads_sizes_and_names_the_form():
    """The sizes are the batches as the backbone sees them (the largest
    image, padded to 32), and each row names how the run compiled."""
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
    stopped = dict(run, form='true', mkldnn=True, losses=[{}], failure=dict(
        iteration=2, error='E', message='m', graph_modules=['neck']))
    rows = tables.mmengine_compile_section([run, hooked, stopped]
                                           ).splitlines()
    assert rows[4].startswith(
        "| `dict(backend='inductor', dynamic=True)`, mkldnn off | 3 "
        "(2 sizes) | 2 (0) | 1, 1 |")
    assert rows[5].startswith(
        "| none; `CompileBackboneHook(backend='inductor', dynamic=True)` "
        "| 3 (2 sizes) | 1 (0) | 1, 0 |")
    assert rows[6].startswith('| `True` | 1 of 3 (2 sizes) |')
    assert rows[-1] == ('- `True` stopped in iteration 2: `E: m`; the last '
                        'graph holds neck.')


def _reports(*names):
    out = []
    for name in names:
        with open(os.path.join(PERFORMANCE, f'{name}.json')) as f:
            out.append(json.load(f))
    return out


@pytest.mark.parametrize('section, names', [
    ('gpu-proxy', ['gpu_proxy']), ('cpu-vs-swin', ['cpu_vs_swin']),
    ('compile', ['compile']), ('inductor-counts', ['inductor_counts']),
    ('mmengine-compile', [f'mmengine_compile_{n}' for n in MMENGINE_RUNS]),
])
def test_the_docs_sections_are_the_ones_generated_from_their_json(
        section, names):
    """docs/performance.md's generated sections are written from the JSON
    they name (tools/benchmark.py render ... --update-doc), not by
    hand."""
    with open(os.path.join(ROOT, 'docs', 'performance.md'),
              encoding='utf-8') as f:
        page = f.read()
    match = re.search(r'^<!-- generated: ' + section + r' by ([^\n]*)-->\n'
                      r'(.*?)^' + re.escape(end_marker(section)), page,
                      re.MULTILINE | re.DOTALL)
    assert match, f'docs/performance.md has no generated {section} section'
    for name in names:
        assert f'docs/performance/{name}.json' in match.group(1)
    rendered = tables.sections(_reports(*names))
    assert list(rendered) == [section]
    assert match.group(2).strip('\n') == rendered[section].strip('\n')


def test_the_gpu_check_json_renders(bench, tmp_path, capsys):
    """A report of rows alone (as the GPU check writes) renders its timed
    rows, and the CPU table where PosMLP-T and Swin-T pair up."""
    report = dict(environment=dict(device='cpu'), results=[
        dict(model=m, size=[48, 70], batch=1, mode='fwdbwd', times=[t, t],
             median_s=t, min_s=t, peak_mem_mb=None, params=1e6)
        for m, t in (('posmlp_t', 0.2), ('swin_t', 0.1), ('resnet50', 0.1))])
    path = tmp_path / 'check.json'
    path.write_text(json.dumps(report))
    found = bench.main(['render', str(path)])
    assert '| ResNet-50 | train 1x3x48x70 | 100.0 | 100.0 | - | 1.0 |' in \
        found['timed rows']
    assert '| training 1x3x48x70 | 200 ms | 100 ms | 2.00' in \
        found['cpu-vs-swin']
    assert '## timed rows' in capsys.readouterr().out
