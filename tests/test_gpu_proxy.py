"""benchmarks.gpu_proxy: the operations, bytes written, host syncs and FLOPs
of a step, the time estimate built from them, issue 30's verdicts, the
GPU-proxy section, and tools/benchmark.py's gpu-proxy and compile parts."""
from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest
import torch
from torch import nn

from benchmarks.doc_sections import end_marker, update_sections
from benchmarks.gpu_proxy import (H200, PRECISIONS, NeedsData, OpCounter,
                                  autocast_enabled, count_call, count_step,
                                  counting_place, estimate, run_gpu_proxy)
from benchmarks.tables import gpu_proxy_section
from benchmarks.targets import gpu_proxy_targets, verdict
from posmlp_dense import PosMLP
from posmlp_dense.forward_mode import ForwardMode
from posmlp_dense.token_mixing import level_mixings

from conftest import TINY_ARCH, load_tool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, 'docs', 'performance.md')


def counted(fn, *args) -> OpCounter:
    with OpCounter() as counter:
        fn(*args)
    return counter


def test_a_step_of_known_operations():
    """Linear + ReLU + .item(): addmm (2 x 3 floats), relu (2 x 3), sum (one
    float) and the host read; the weight's transpose and the views of the
    output launch nothing."""
    lin = nn.Linear(4, 3)
    x = torch.randn(2, 4)

    def step(x):
        with torch.no_grad():
            y = torch.relu(lin(x))
            y.view(3, 2).permute(1, 0).unsqueeze(0).expand(2, 2, 3)
            return y.sum().item()
    counts = count_call(step, x)
    assert counts['by_op'] == {'addmm': 1, 'relu': 1, 'sum': 1,
                               '_local_scalar_dense': 1}
    assert counts['ops'] == 4
    assert counts['bytes_written'] == 4 * (6 + 6 + 1)
    assert counts['syncs'] == 1
    assert counts['syncs_by_op'] == {'_local_scalar_dense': 1}
    assert counts['flops'] == 2 * 2 * 4 * 3  # the matmul's


def test_views_and_allocations_launch_nothing():
    x = torch.randn(4, 6)

    def views(x):
        x.view(6, 4), x.reshape(2, 12), x.permute(1, 0), x.transpose(0, 1)
        x.t(), x[None].expand(3, 4, 6), x.as_strided((2, 2), (1, 1))
        x[1:3], x[:, 2], x.unsqueeze(0).squeeze(0), x.split(2), x.chunk(3, 1)
        x.detach(), x.unflatten(1, (2, 3)), x.narrow(0, 1, 2)
        x.clone().unsqueeze_(0)  # (the clone counts; the in-place view not)
        torch.empty(5), torch.empty_like(x), x.new_empty(3)
    c = counted(views, x)
    assert c.by_op == {'clone': 1}
    assert c.bytes_written == x.numel() * 4
    assert c.syncs == 0


def test_fills_in_place_and_out_operations_count_what_they_write():
    a = torch.ones(3)

    def work():
        torch.zeros(5)                                 # 20 bytes
        b = torch.empty(4).fill_(2.0)                  # 16 (empty: none)
        a.add_(1)                                      # 12
        torch.mul(a, a, out=torch.empty(3))            # 12
        b.copy_(torch.arange(4.0))                     # 16 + 16
        torch.zeros(2, dtype=torch.float64).add_(1)    # 16 + 16
    c = counted(work)
    assert c.by_op == {'zeros': 2, 'fill_': 1, 'add_': 2, 'mul': 1,
                       'copy_': 1, 'arange': 1}
    assert c.bytes_written == 20 + 16 + 12 + 12 + 32 + 32
    assert c.syncs == 0


def test_operations_that_make_the_host_wait_are_host_syncs():
    x = torch.tensor([0.5, -1.0, 2.0, 0.0])
    mask = x > 0
    reps = torch.tensor([1, 2, 1, 1])
    syncing = [
        lambda: x.sum().item(), lambda: bool(x[0] > 0), lambda: int(x[2]),
        lambda: x.nonzero(), lambda: x.masked_select(mask),
        lambda: x[mask], lambda: torch.unique(x),
        lambda: torch.equal(x, x), lambda: torch.allclose(x, x),
        lambda: x.repeat_interleave(reps),
    ]
    for fn in syncing:
        assert counted(fn).syncs == 1, fn
    not_syncing = [
        lambda: x * 2, lambda: x[reps], lambda: x.sum(),
        lambda: torch.where(mask, x, 0.0),
        lambda: x.repeat_interleave(reps, output_size=5),
    ]
    for fn in not_syncing:
        assert counted(fn).syncs == 0, fn


def test_the_backward_is_counted():
    lin = nn.Linear(4, 3)
    x = torch.randn(2, 4)

    def forward(x):
        return lin(x).relu().sum()

    def step(x):
        forward(x).backward()
    fwd, both = count_call(forward, x), count_call(step, x)
    # the loss's gradient, ReLU's, the weight's and the input-free bias's
    assert both['by_op'].get('threshold_backward') == 1
    assert both['by_op'].get('mm') == 1  # the weight's gradient (no input's)
    assert both['ops'] > fwd['ops'] + 2
    assert both['flops'] == 2 * fwd['flops']


def test_a_counted_step_is_a_repeated_one_and_leaves_the_model_as_it_was():
    model = PosMLP(TINY_ARCH, out_indices=(0, 1, 2, 3))
    model.eval()
    first = count_step(model, 'train', (1, 56, 56))
    again = count_step(model, 'train', (1, 56, 56))
    assert first == again
    assert first['ops'] > 0 and first['syncs'] == 0
    assert not model.training
    assert all(p.grad is None for p in model.parameters())
    infer = count_step(model, 'inference', (1, 56, 56))
    assert 0 < infer['ops'] < first['ops']
    assert infer['flops'] < first['flops']


def test_where_steps_are_counted():
    cpu, cuda = torch.device('cpu'), torch.device('cuda')
    # the CUDA path: real CUDA tensors on a GPU; without one, fake CUDA
    # tensors for inference and the CPU for training
    assert counting_place('inference', cuda) == 'cuda'
    assert counting_place('train', cuda) == 'cuda'
    assert counting_place('inference', cpu) == 'fake-cuda'
    assert counting_place('train', cpu) == 'cpu'


def test_fake_cuda_counts_the_same_operations_without_a_gpu():
    """A model without device-dependent code counts the same on fake CUDA
    tensors as on real CPU ones (PosMLP, which has such code, is why the
    CUDA path is counted at all); a backward there is refused by name."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GELU(),
                          nn.Conv2d(8, 4, 1), nn.LayerNorm(16))
    cpu = count_step(model, 'inference', (2, 16, 16), 'cpu')
    fake = count_step(model, 'inference', (2, 16, 16), 'fake-cuda')
    for key in ('ops', 'bytes_written', 'syncs', 'flops', 'by_op'):
        assert fake[key] == cpu[key], key
    assert next(model.parameters()).device.type == 'cpu'  # a copy moved
    with pytest.raises(ValueError, match='needs a GPU'):
        count_step(model, 'train', (2, 16, 16), 'fake-cuda')


class Branching(nn.Module):
    """A forward that reads a value of its input on the host."""

    def forward(self, x):
        if x.mean() > 100:  # a host sync
            x = x * 2
        return (x + 1,)


def test_a_step_that_syncs_is_counted_on_real_tensors():
    with pytest.raises(NeedsData, match='reads device data'):
        count_step(Branching(), 'inference', (1, 8, 8), 'fake-cuda')
    proxy = run_gpu_proxy({'toy': Branching()}, [('inference', (1, 8, 8))],
                          torch.device('cpu'))
    (row,) = proxy['rows']
    assert row['counted_on'] == 'cpu' and proxy['path'] == 'cuda'
    assert row['syncs'] == 1 and row['ops'] == 4  # mean, gt, read, add


def test_the_estimate_takes_the_longer_of_launching_and_the_devices_work():
    # launch-bound: 1000 ops x 5 us = 5 ms; memory 1 ms + compute 1 ms
    e = estimate(1000, 4.8e9, 67e9, H200)
    assert e['launch_s'] == pytest.approx(5e-3)
    assert e['memory_s'] == pytest.approx(1e-3)
    assert e['compute_s'] == pytest.approx(1e-3)
    assert e['estimate_s'] == pytest.approx(5e-3) and e['bound'] == 'launch'
    # device-bound: memory and compute add up
    e = estimate(10, 4.8e12, 67e12, H200)
    assert e['estimate_s'] == pytest.approx(2.0) and e['bound'] == 'device'


def test_the_bf16_flops_take_the_bf16_rate():
    fp32 = estimate(10, 4.8e9, 67e12 + 989e12, H200)
    bf16 = estimate(10, 4.8e9, 67e12 + 989e12, H200, bf16_flops=989e12)
    assert fp32['compute_s'] == pytest.approx(1 + 989 / 67)
    assert bf16['compute_s'] == pytest.approx(2.0)  # 1 s at each rate
    assert bf16['memory_s'] == fp32['memory_s'] == pytest.approx(1e-3)
    assert bf16['launch_s'] == fp32['launch_s']
    with pytest.raises(ValueError, match='is not part of'):
        estimate(10, 1, 1e9, H200, bf16_flops=2e9)


def layer_normed_linear() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.GELU(),
                         nn.Linear(16, 4))


def test_bf16_counts_the_casts_and_the_lower_bytes():
    """Under autocast the matmuls write bfloat16 and their operands are
    cast first (counted); the FLOPs are the same, in training too."""
    model = layer_normed_linear()
    shape = (2, 4, 4)  # (the model sees 2 x 3 x 4 x 4: its last dim is 4)
    model[0] = nn.Linear(4, 16)
    fp32 = count_step(model, 'inference', shape, 'cpu')
    bf16 = count_step(model, 'inference', shape, 'cpu', precision='bf16')
    assert '_to_copy' not in fp32['by_op'] and bf16['by_op']['_to_copy'] > 0
    assert set(fp32['bytes_by_dtype']) == {'float32'}
    assert bf16['bytes_by_dtype']['bfloat16'] > 0
    assert bf16['flops'] == fp32['flops']
    assert fp32['flops_by_dtype'] == {'float32': fp32['flops']}
    assert bf16['flops_by_dtype'] == {'bfloat16': bf16['flops']}
    assert bf16['ops'] == fp32['ops'] + bf16['by_op']['_to_copy']
    train = count_step(model, 'train', shape, 'cpu', precision='bf16')
    assert train['flops'] == count_step(model, 'train', shape)['flops']
    assert train['bytes_by_dtype']['bfloat16'] > 0
    assert not torch.is_autocast_enabled('cpu')
    with pytest.raises(ValueError, match='unknown precision'):
        count_step(model, 'inference', shape, 'cpu', precision='fp16')


def test_the_flops_by_dtype_add_up_to_the_flop_counters():
    """OpCounter's FLOPs per dtype are FlopCounterMode's, split: under
    autocast PosMLP computes its mixing weights in fp32 (their softmax
    needs the range), its convolutions and projections in bfloat16."""
    model = PosMLP(TINY_ARCH, out_indices=(0, 1, 2, 3))
    for precision in PRECISIONS:
        counts = count_step(model, 'train', (1, 56, 56), precision=precision)
        assert sum(counts['flops_by_dtype'].values()) == counts['flops']
    assert set(counts['flops_by_dtype']) == {'bfloat16', 'float32'}


def test_bf16_on_fake_cuda_follows_the_cuda_policy_without_a_gpu():
    """CUDA's autocast keeps layer_norm in fp32 (a cast up, an fp32
    output, a cast back down for the next matmul); the CPU's runs it in
    bfloat16. Counted on fake CUDA tensors, a step has CUDA's casts."""
    model = layer_normed_linear()
    model[0] = nn.Linear(4, 16)
    cpu = count_step(model, 'inference', (2, 4, 4), 'cpu', precision='bf16')
    cuda = count_step(model, 'inference', (2, 4, 4), 'fake-cuda',
                      precision='bf16')
    assert cuda['by_op']['_to_copy'] > cpu['by_op']['_to_copy']
    assert cuda['bytes_by_dtype']['float32'] > \
        cpu['bytes_by_dtype'].get('float32', 0)
    assert not torch.is_autocast_enabled('cuda')


def test_autocast_enabled_restores_the_state_it_found():
    with torch.autocast('cpu', dtype=torch.float16):
        with autocast_enabled('cpu'):
            assert torch.get_autocast_dtype('cpu') == torch.bfloat16
            assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).dtype == \
                torch.bfloat16
        assert torch.is_autocast_enabled('cpu')
        assert torch.get_autocast_dtype('cpu') == torch.float16
    assert not torch.is_autocast_enabled('cpu')


def test_the_documented_constants_are_the_ones_used():
    assert (H200.launch_s, H200.bandwidth, H200.peak_flops,
            H200.peak_bf16_flops) == (5e-6, 4.8e12, 67e12, 989e12)
    section = doc_section()
    for value in ('| 5 us |', '| 4.8 TB/s |', '| 67 TFLOP/s |',
                  '| 989 TFLOP/s |'):
        assert value in section
    assert 'NVIDIA H200 SXM' in section


def doc_section() -> str:
    with open(DOC, encoding='utf-8') as f:
        text = f.read()
    match = re.search(r'^<!-- generated: gpu-proxy\b[^\n]*-->\n(.*?)^'
                      + re.escape(end_marker('gpu-proxy')), text,
                      re.MULTILINE | re.DOTALL)
    assert match, 'docs/performance.md has no generated gpu-proxy section'
    return match.group(1)


def test_generated_sections_replace_only_their_own_lines():
    page = ('# Title\n\nhand-written\n\n<!-- generated: gpu-proxy old -->\n'
            'old table\n<!-- end generated: gpu-proxy -->\n\nmore prose\n')
    new = update_sections(page, {'gpu-proxy': '## New\n\n| a |'}, 'x.json')
    assert new.startswith('# Title\n\nhand-written\n\n<!-- generated: '
                          'gpu-proxy by tools/benchmark.py')
    assert 'from x.json' in new
    assert '## New\n\n| a |\n<!-- end generated: gpu-proxy -->\n\nmore prose' \
        in new and 'old table' not in new
    # idempotent: the rewritten page has the markers again
    assert update_sections(new, {'gpu-proxy': '## New\n\n| a |'},
                           'x.json') == new
    with pytest.raises(ValueError, match="sections 'gpu-proxy'"):
        update_sections('# no markers\n', {'gpu-proxy': ''}, 'x.json')


def row(model, mode, ops, nbytes, syncs=0, flops=100.0):
    return dict(model=model, mode=mode, shape=[2, 512, 512], ops=ops,
                bytes_written=nbytes, syncs=syncs, flops=flops,
                **estimate(ops, nbytes, flops))


def with_bf16(r, ops, nbytes, fp32_bytes):
    r['bf16'] = dict(ops=ops, bytes_written=nbytes, syncs=0,
                     flops=r['flops'], counted_on='fake-cuda',
                     bytes_by_dtype={'bfloat16': nbytes - fp32_bytes,
                                     'float32': fp32_bytes},
                     flops_by_dtype={'bfloat16': 0.75 * r['flops'],
                                     'float32': 0.25 * r['flops']},
                     **estimate(ops, nbytes, r['flops'], H200,
                                0.75 * r['flops']))
    return r


def test_the_bf16_column_next_to_fp32():
    """Rows with bf16 counts get their own table and bf16 ratios beside
    the fp32 ones, the verdict still judged in fp32; a report without
    them (an older JSON) renders as before."""
    rows = [with_bf16(row('posmlp_t', 'inference', 100, 2000), 120,
                      1.5e9, 0.5e9),
            with_bf16(row('swin_t', 'inference', 100, 1000), 150,
                      1.0e9, 0.25e9)]
    (entry,) = gpu_proxy_targets(rows)
    assert entry['ops_ratio_bf16'] == pytest.approx(0.8)
    assert entry['bytes_ratio_bf16'] == pytest.approx(1.5)
    assert entry['estimate_ratio_bf16'] == pytest.approx(
        rows[0]['bf16']['estimate_s'] / rows[1]['bf16']['estimate_s'])
    assert entry['missed'] == ['bytes written 2.00x']  # fp32's, not bf16's
    spec = dict(dataclasses.asdict(H200))
    report = dict(gpu_proxy=dict(gpu=spec, path='cuda', rows=rows))
    text = gpu_proxy_section(report)
    assert '| peak arithmetic rate, bf16 | 989 TFLOP/s |' in text
    assert ('| inference 2x3x512x512 | PosMLP-T | 120 | 1.500 | 0.500 | '
            '75.0 % | 0.60 | 0.31 |') in text
    assert 'fake CUDA tensors (CUDA) |' in text
    assert '| 1.00 | 2.00 | 1.00 |' in text and '| 0.80 | 1.50 |' in text
    for r in rows:
        del r['bf16']
    del spec['peak_bf16_flops']
    text = gpu_proxy_section(report)
    assert '| 67 TFLOP/s |' in text
    for bf16_text in ('rate, bf16', 'bf16 (autocast)', 'estimate, bf16',
                      '- Precision:'):
        assert bf16_text not in text


def test_issue_30_targets_per_step():
    def judge(mode, ops, nbytes, syncs=0):
        (entry,) = gpu_proxy_targets([row('posmlp_t', mode, ops, nbytes,
                                          syncs),
                                      row('swin_t', mode, 100, 1000),
                                      row('resnet50', mode, 50, 10)])
        return entry
    e = judge('inference', 100, 1000)
    assert e['met'] and e['ops_ratio'] == 1.0 and e['bytes_ratio'] == 1.0
    assert e['missed'] == []
    e = judge('inference', 101, 900)
    assert not e['met'] and e['missed'] == ['ops 1.01x']
    assert verdict(e).endswith('(NOT met); over: ops 1.01x')
    assert judge('train', 150, 1000)['met']  # training: up to 1.5x
    e = judge('train', 151, 1001, syncs=2)
    assert e['missed'] == ['ops 1.51x', 'bytes written 1.00x', '2 host syncs']
    assert e['syncs'] == [2, 0]
    # a step that Swin-T lacks has no verdict
    assert gpu_proxy_targets([row('posmlp_t', 'train', 1, 1)]) == []


def test_benchmark_gpu_proxy_part(tmp_path):
    bench = load_tool('benchmark')
    page = tmp_path / 'perf.md'
    page.write_text('# Perf\n\n<!-- generated: gpu-proxy -->\n'
                    '<!-- end generated: gpu-proxy -->\n\nhand-written\n')
    out = tmp_path / 'proxy.json'
    report = bench.main([
        'gpu-proxy', '--device', 'cpu', '--posmlp-arch',
        json.dumps(TINY_ARCH), '--models', 'posmlp_t,swin_t',
        '--steps', 'inference:1x32x48,train:1x32x48', '--out', str(out),
        '--update-doc', str(page)])
    rows = json.loads(out.read_text())['gpu_proxy']['rows']
    assert rows == json.loads(json.dumps(report['gpu_proxy']['rows']))
    assert [(r['model'], r['mode']) for r in rows] == [
        ('posmlp_t', 'inference'), ('swin_t', 'inference'),
        ('posmlp_t', 'train'), ('swin_t', 'train')]
    assert all(r['ops'] > 0 and r['estimate_s'] > 0 for r in rows)
    assert [r['counted_on'] for r in rows] == ['fake-cuda'] * 2 + ['cpu'] * 2
    assert [r['bf16']['counted_on'] for r in rows] == \
        [r['counted_on'] for r in rows]
    assert all(r['bf16']['flops'] == r['flops'] and
               r['bf16']['estimate_s'] > 0 for r in rows)
    entries = gpu_proxy_targets(rows)
    assert [e['mode'] for e in entries] == ['inference', 'train']
    text = page.read_text()
    assert text.startswith('# Perf\n\n<!-- generated: gpu-proxy by ')
    assert text.endswith('\n\nhand-written\n')
    assert verdict(entries[0]) in text
    assert 'bf16 (autocast), the same steps:' in text
    report = bench.main([
        'gpu-proxy', '--fp32-only', '--device', 'cpu', '--posmlp-arch',
        json.dumps(TINY_ARCH), '--models', 'posmlp_t', '--steps',
        'inference:1x32x48', '--out', str(out)])
    assert 'bf16' not in report['gpu_proxy']['rows'][0]


def test_benchmark_compile_part(tmp_path, monkeypatch):
    """The compile part's plumbing: each case's figures go to the JSON and
    the page's "compile" section (the compiled step itself runs in the
    GPU check's dry run, tests/test_gpu_check.py)."""
    from benchmarks.gpu_check import compiled
    from benchmarks.gpu_check.rows import Verdict
    calls = []

    def compiled_step(model, shape, device, backend, warmup, repeats, seed,
                      sizes, dynamic):
        calls.append((shape, backend, repeats, list(sizes), dynamic))
        return Verdict(True, 'fine', dict(
            backend=backend, dynamic=dynamic, shape=list(shape),
            first_call_s=2.0, eager_median_s=0.1, compiled_median_s=0.05,
            output_difference=1e-7, gradient_difference=2e-7,
            graphs=1 + (dynamic is None), other_sizes=[list(s) for s in sizes],
            other_size_first_call_s=[1.5, 0.2],
            other_size_new_graphs=[int(dynamic is None), 0],
            other_size_difference=[3e-7, 4e-7]))
    monkeypatch.setattr(compiled, 'compiled_step', compiled_step)
    bench = load_tool('benchmark')
    page = tmp_path / 'perf.md'
    page.write_text('# Perf\n\n<!-- generated: compile -->\n'
                    '<!-- end generated: compile -->\n')
    out = tmp_path / 'compiled.json'
    bench.main([
        'compile', '--device', 'cpu', '--backend', 'eager',
        '--posmlp-arch', json.dumps(TINY_ARCH), '--shape', '40x70',
        '--cases', '2:true,1:none', '--sizes', '56x64,48x90',
        '--repeats', '1', '--out', str(out), '--update-doc', str(page)])
    assert calls == [((2, 40, 70), 'eager', 1, [(56, 64), (48, 90)], True),
                     ((1, 40, 70), 'eager', 1, [(56, 64), (48, 90)], None)]
    cases = json.loads(out.read_text())['compile']
    assert [(c['passed'], c['label']) for c in cases] == [
        (True, 'PosMLP (custom arch)')] * 2
    text = page.read_text()
    assert 'PosMLP (custom arch), backend `eager`' in text
    assert '| figure | batch 2, `dynamic=True` | batch 1, `dynamic=None` |' \
        in text
    assert '| graphs for 3 sizes | 1 | 2 |' in text
    assert '| further sizes that compiled a graph (first call) | none | ' \
           '56x64 (1.5 s) |' in text
    assert '| first call at a further size that compiled none, at most | ' \
           '1.50 s | 0.20 s |' in text


@pytest.mark.parametrize('gate', ['gqpe', 'lrpe'])
def test_a_levels_weight_gradients_cost_bytes_linear_in_depth(gate):
    """A level computes its blocks' mixing weights in one stacked call; the
    backward must gather the blocks' gradients once (unbind's stack), not
    add each into a zero tensor of the whole stack (indexing's backward),
    whose bytes grow with the square of the depth."""
    def backward_bytes(depth):
        arch = dict(embed_dims=(16,), depths=(depth,), mlp_ratio=(4,),
                    gamma=(4,), window_size=(7,))
        level = PosMLP(arch, gate=gate, out_indices=(0,)).levels[0]
        grids = level.window_grids(10, 9)

        def step():
            mixings = level_mixings([b.gate_unit for b in level.encoder],
                                    grids, ForwardMode(True, False))
            loss = sum(m.weights.sum() + m.bias.sum() for m in mixings)
            loss.backward()
        return count_call(lambda _: step(), None)['bytes_written']
    ratio = backward_bytes(16) / backward_bytes(2)
    assert ratio < 8 * 1.25, ratio   # linear: about 8; quadratic: about 64
