"""A report's Markdown: the generated sections of docs/performance.md
(their prose is in the page) and a table of every timed row; '' where a
report has nothing for one."""
from __future__ import annotations

import collections
from typing import Callable, Dict, List

from .models import LABELS
from .steps import step_name
from .targets import posmlp_against_swin, target_lines, verdict


def fmt(value, spec: str) -> str:
    return '-' if value is None else format(value, spec)


def _gb(n) -> str:
    return fmt(None if n is None else n / 1e9, '.3f')


def _ms(seconds) -> str:
    return fmt(None if seconds is None else seconds * 1e3, '.2f')


def _label(name: str) -> str:
    return LABELS.get(name, name)


def _table(head: List[str], align: str, rows: List[List[str]]) -> List[str]:
    """``align``: one letter per column, l(eft) or r(ight)."""
    return (['| ' + ' | '.join(head) + ' |',
             '| ' + ' | '.join('---' if a == 'l' else '---:'
                               for a in align) + ' |']
            + ['| ' + ' | '.join(row) + ' |' for row in rows])


def commit_text(env: dict) -> str:
    """The run's commit, and how many files it had changed beyond it."""
    commit = (env.get('git_commit') or '?')[:7]
    dirty = env.get('git_dirty_files') or []
    if not dirty:
        return commit
    model = [f for f in dirty if f.startswith('posmlp_dense/')]
    return (f"{commit} (uncommitted changes to {len(dirty)} files, "
            + (f"{len(model)} of them" if model else 'none')
            + ' in posmlp_dense/)')


def busy_warning(env: dict) -> List[str]:
    """A warning where the load average says the CPU was shared."""
    loads = [v[0] for v in (env.get('loadavg_start'), env.get('loadavg_end'))
             if v]
    cores = env.get('cpu_count') or 1
    if env.get('device') != 'cpu' or not loads or max(loads) <= 1.5 * cores:
        return []
    return ['', f"**The machine was busy during this run** (load average up "
            f"to {max(loads):.1f} on {cores} cores): the times are inflated "
            f"and noisy. Re-run on an idle machine before drawing "
            f"conclusions."]


COUNTED_ON = {'cuda': 'CUDA tensors', 'fake-cuda': 'fake CUDA tensors',
              'cpu': 'CPU tensors'}
AUTOCAST_POLICY = {'cuda': 'CUDA', 'fake-cuda': 'CUDA', 'cpu': 'CPU'}


def gpu_proxy_section(report: dict) -> str:
    proxy = report.get('gpu_proxy') or {}
    rows = proxy.get('rows')
    if not rows:
        return ''
    gpu, env = proxy['gpu'], report.get('environment', {})
    sources = dict(gpu.get('sources') or ())
    constants = [[name, f'{gpu[key] * scale:g} {unit}',
                  sources.get(key, '-')] for key, name, scale, unit in (
        ('launch_s', 'launch cost per operation', 1e6, 'us'),
        ('bandwidth', 'memory bandwidth', 1e-12, 'TB/s'),
        ('peak_flops', 'peak arithmetic rate, fp32', 1e-12, 'TFLOP/s'),
        ('peak_bf16_flops', 'peak arithmetic rate, bf16', 1e-12, 'TFLOP/s'))
        if gpu.get(key)]
    lines = [f"Counted with torch {env.get('torch', '?')} at commit "
             f"{commit_text(env)}; the estimate is for the {gpu['name']}.",
             ''] + _table(['constant', 'value', 'source'], 'lrl', constants)

    def estimates(c):
        return [_ms(c['launch_s']), _ms(c['memory_s']), _ms(c['compute_s']),
                _ms(c['estimate_s']), c['bound']]
    lines += ['', 'fp32:', ''] + _table(
        ['step', 'model', 'operations', 'bytes written (GB)', 'host syncs',
         'GFLOP', 'launch (ms)', 'memory (ms)', 'compute (ms)',
         'estimate (ms)', 'bound', 'counted on'], 'llrrrrrrrrll',
        [[step_name(r['mode'], r['shape']), _label(r['model']),
          f"{r['ops']:,}", _gb(r['bytes_written']), str(r['syncs']),
          f"{r['flops'] / 1e9:.1f}", *estimates(r),
          COUNTED_ON.get(r.get('counted_on'), '-')] for r in rows])
    bf16 = [r for r in rows if r.get('bf16')]
    if bf16:
        def share(b):  # of the FLOPs, those run in bfloat16
            low = (b.get('flops_by_dtype') or {}).get('bfloat16')
            return '-' if low is None or not b['flops'] else \
                f"{100 * low / b['flops']:.1f} %"
        lines += ['', 'bf16 (autocast), the same steps:', ''] + _table(
            ['step', 'model', 'operations', 'bytes written (GB)',
             'of them fp32 (GB)', 'FLOPs in bf16', 'launch (ms)',
             'memory (ms)', 'compute (ms)', 'estimate (ms)', 'bound',
             'counted on (autocast policy)'], 'llrrrrrrrrll',
            [[step_name(r['mode'], r['shape']), _label(r['model']),
              f"{b['ops']:,}", _gb(b['bytes_written']),
              _gb((b.get('bytes_by_dtype') or {}).get('float32')), share(b),
              *estimates(b), f"{COUNTED_ON.get(b.get('counted_on'), '-')} "
              f"({AUTOCAST_POLICY.get(b.get('counted_on'), '-')})"]
             for r in bf16 for b in [r['bf16']]])
    entries = target_lines(report)['gpu_proxy']
    if entries:
        with_bf16 = any('estimate_ratio_bf16' in e for e in entries)
        extra = ['operations, bf16', 'bytes written, bf16',
                 'estimate, bf16'] if with_bf16 else []
        lines += ['', 'PosMLP-T / Swin-T, and the targets of issue 30 '
                  '(judged in fp32):', ''] + _table(
            ['step', 'operations', 'bytes written', 'FLOPs', 'estimate',
             *extra, 'host syncs', 'target'],
            'l' + 'r' * (5 + len(extra)) + 'l',
            [[step_name(e['mode'], e['shape']),
              *(fmt(e.get(k), '.2f') for k in (
                  'ops_ratio', 'bytes_ratio', 'flop_ratio', 'estimate_ratio',
                  *(['ops_ratio_bf16', 'bytes_ratio_bf16',
                     'estimate_ratio_bf16'] if with_bf16 else []))),
              f"{e['syncs'][0]} / {e['syncs'][1]}", verdict(e)]
             for e in entries])
    top = [r for r in rows if r['model'] == 'posmlp_t' and r.get('by_op')]
    if top:
        lines += ['', "PosMLP-T's most frequent operations per step "
                  "(count):", '']
        lines += [f"- {step_name(r['mode'], r['shape'])}: " + ', '.join(
            f'`{k}` {v}' for k, v in list(r['by_op'].items())[:10])
            for r in top]
    return '\n'.join(lines)


def _seconds(value) -> str:
    return f'{value * 1e3:,.0f} ms' if value < 1 else f'{value:.3f} s'


def _ratios(entry: dict, name: str) -> str:
    """'median (fastest; paired, rounds low-high)'."""
    text = (f"{entry[name]:.2f} ({fmt(entry.get(name + '_min'), '.2f')}; "
            f"paired {fmt(entry.get(name + '_paired'), '.2f')}")
    spread = entry.get(name + '_range')
    if spread:
        text += f', rounds {spread[0]:.2f}-{spread[1]:.2f}'
    return text + ')'


def cpu_vs_swin_section(report: dict) -> str:
    """A row per step timed for both PosMLP-T and Swin-T."""
    targets = target_lines(report)
    inference = targets['posmlp_vs_swin']
    training = [e for e in targets['training'] if e['kind'] == 'backbone']
    if not (inference or training):
        return ''
    env = report.get('environment', {})
    load = [(env.get(k) or [None])[0] for k in ('loadavg_start',
                                                 'loadavg_end')]
    head = (f"At commit {commit_text(env)}, {env.get('time', '?')}, torch "
            f"{env.get('torch', '?')} on "
            f"{env.get('cuda_device') or env.get('cpu_model', '?')} "
            f"({env.get('threads', '?')} threads, fp32); load average "
            f"{fmt(load[0], '.1f')} at the start, {fmt(load[1], '.1f')} at "
            f"the end.")
    if env.get('allocator'):  # comparable only under the same settings
        head += ' Allocator settings: ' + ', '.join(
            f'`{k}={v}`' for k, v in sorted(env['allocator'].items())) + '.'
    rows = []
    by_key = {(r['model'], tuple(r['size']), r['batch'], r['mode']): r
              for r in report.get('results') or []}
    for e in inference:
        key = (tuple(e['size']), e['batch'], e['mode'])
        mode = 'inference' if e['mode'] == 'fwd' else 'training'
        rows.append([f"{mode} {e['batch']}x3x{e['size'][0]}x{e['size'][1]}",
                     _seconds(by_key['posmlp_t', *key]['median_s']),
                     _seconds(by_key['swin_t', *key]['median_s']),
                     _ratios(e, 'latency_ratio'),
                     fmt(e['peak_mem_ratio'], '.2f')])
    steps = {(r['model'], r['kind'], tuple(r['shape']), r['with_cp']): r
             for r in report.get('training') or []}
    for e in training:
        key = (e['kind'], tuple(e['shape']), e['with_cp'])
        b, h, w = e['shape']
        memory = e['peak_first_step_ratio'] or e['peak_ratio']
        rows.append([f"training {b}x3x{h}x{w}"
                     + (', with_cp' if e['with_cp'] else ''),
                     _seconds(steps['posmlp_t', *key]['median_s']),
                     _seconds(steps['swin_t', *key]['median_s']),
                     _ratios(e, 'time_ratio'), fmt(memory, '.2f')])
    return '\n'.join([head] + busy_warning(env) + [''] + _table(
        ['step', 'PosMLP-T', 'Swin-T', 'time ratio', 'peak memory ratio'],
        'lrrlr', rows))


def compile_section(report: dict) -> str:
    """PosMLP-T's training step compiled per case (batch, ``dynamic``):
    timed against eager, then run at further sizes."""
    cases = report.get('compile')
    if not cases:
        return ''
    env, first = report.get('environment', {}), cases[0]

    def row(name: str, cell: Callable[[dict], str]) -> List[str]:
        return [name] + [cell(c) for c in cases]

    def recompiled(c):
        return ', '.join(
            f"{'x'.join(map(str, size))} ({t:.1f} s)" for size, n, t in zip(
                c['other_sizes'], c['other_size_new_graphs'],
                c['other_size_first_call_s']) if n) or 'none'

    def reused(c):
        times = [t for n, t in zip(c['other_size_new_graphs'],
                                   c['other_size_first_call_s']) if not n]
        return f'{max(times):.2f} s' if times else '-'
    _, h, w = first['shape']
    lines = [f"{first['label']}, backend `{first['backend']}`, torch "
             f"{env.get('torch', '?')} on "
             f"{env.get('cuda_device') or env.get('cpu_model', '?')} "
             f"({env.get('threads', '?')} threads), at commit "
             f"{commit_text(env)}. Timed step {h}x{w}; further sizes "
             + ', '.join(f'{a}x{b}' for a, b in first['other_sizes'])
             + '.', ''] + _table(
        ['figure'] + [f"batch {c['shape'][0]}, `dynamic={c['dynamic']}`"
                      for c in cases], 'l' + 'r' * len(cases), [
            row('first call (compile and run)',
                lambda c: f"{c['first_call_s']:.1f} s"),
            row('eager step (median)',
                lambda c: f"{c['eager_median_s'] * 1e3:.0f} ms"),
            row('compiled step (median)',
                lambda c: f"{c['compiled_median_s'] * 1e3:.0f} ms ("
                f"{c['compiled_median_s'] / c['eager_median_s']:.2f}x)"),
            row(f"graphs for {1 + len(first['other_sizes'])} sizes",
                lambda c: str(c['graphs'])),
            row('further sizes that compiled a graph (first call)',
                recompiled),
            row('first call at a further size that compiled none, at most',
                reused),
            row('compiled against eager: outputs, gradients (relative L2)',
                lambda c: f"{c['output_difference']:.1e}, "
                f"{c['gradient_difference']:.1e}"),
            row('at the further sizes, at most', lambda c: fmt(
                max(c['other_size_difference'] or [0]), '.1e')),
            row('verdict',
                lambda c: 'passed' if c['passed'] else '**FAILED**')])
    lines += [f"\n- FAILED, batch {c['shape'][0]}, dynamic={c['dynamic']}: "
              f"{c['detail']}" for c in cases if not c['passed']]
    return '\n'.join(lines)


def inductor_counts_section(report: dict) -> str:
    counts = report.get('inductor_counts')
    if not counts:
        return ''
    rows = counts['rows']
    env = report.get('environment', {})
    lines = [f"inductor's {counts['device']} backend, torch "
             f"{counts['torch']}, at commit {commit_text(env)}.", '']

    # (files written before the extent figure existed lack it)
    def extent(r):
        return r.get('bytes_by_extent')

    def step(r):
        name = step_name(r['mode'], r['shape'])
        return f'{name}, frozen' if r.get('freezing') else name

    lines += _table(
        ['step', 'model', 'eager operations', 'eager bytes written (GB)',
         'compiled kernels (extern)', 'compiled bytes read + written (GB)',
         'the same, extern operands by extent (GB)'],
        'llrrrrr',
        [[step(r), _label(r['model']),
          f"{r['eager']['ops']:,}", _gb(r['eager']['bytes_written']),
          f"{r['kernels']:,} ({r['extern_kernels']:,})",
          _gb(r['bytes_accessed']),
          '-' if extent(r) is None else _gb(extent(r))] for r in rows])
    pairs = posmlp_against_swin(rows, lambda r: (
        r['mode'], tuple(r['shape']), bool(r.get('freezing'))))
    if pairs:
        lines += ['', 'PosMLP-T / Swin-T:', ''] + _table(
            ['step', 'eager operations', 'eager bytes written',
             'compiled kernels', 'compiled bytes',
             'compiled bytes by extent'], 'lrrrrr',
            [[step(r)] + [
                f'{a / b:.2f}' for a, b in (
                    (r['eager']['ops'], s['eager']['ops']),
                    (r['eager']['bytes_written'],
                     s['eager']['bytes_written']),
                    (r['kernels'], s['kernels']),
                    (r['bytes_accessed'], s['bytes_accessed']))] + [
                '-' if extent(r) is None or extent(s) is None
                else f'{extent(r) / extent(s):.2f}']
             for r, s in pairs])
    return '\n'.join(lines)


PAD = 32  # the demo config's data_preprocessor.pad_size_divisor


def _compile_form(run: dict) -> str:
    if run['form'] == 'dict':
        form = f"`dict(backend='{run['backend']}', dynamic=True)`"
    elif run['form'] == 'backbone':
        form = (f"none; `CompileBackboneHook(backend='{run['backend']}', "
                "dynamic=True)`")
    elif run['backend'] == 'inductor':
        form = '`True`'
    else:  # True's defaults but the backend
        form = f"`dict(backend='{run['backend']}')`"
    return form + ('' if run.get('mkldnn', True) else ', mkldnn off')


def mmengine_compile_section(runs: List[dict]) -> str:
    """A row per ``benchmarks.mmengine_compile`` run, then a line on each
    run that stopped."""
    if not runs:
        return ''
    rows, stops = [], []
    for r in runs:
        # the batch as the backbone sees it: padded to the largest image,
        # then to a multiple of PAD
        sizes = {tuple(-(-max(s[i] for s in batch) // PAD) * PAD
                       for i in (0, 1)) for batch in r['input_shapes']}
        first_iteration = r['graphs_after_each_iteration'][0]
        modules = r['graph_modules']
        files = collections.Counter()
        for function, n in r['recompiles_by_function'].items():
            path = function.split(' in ', 1)[-1].rsplit(':', 1)[0]
            files[path.split('site-packages/', 1)[-1]] += n
        abandoned = r['abandoned_graph_modules']
        difference = r['first_loss_max_relative_difference']
        failure = r.get('failure')
        rows.append([
            _compile_form(r), (f"{len(r['losses'])} of {r['iters']}"
                               if failure else str(r['iters']))
            + f' ({len(sizes)} sizes)',
            f"{r['graphs']} ({r['graph_breaks']})",
            f"{sum('backbone' in m for m in modules[:first_iteration])}, "
            f"{sum('backbone' in m for m in modules[first_iteration:])}",
            f"{len(abandoned)} ({sum('backbone' in m for m in abandoned)})",
            ', '.join(f'{f} {n}' for f, n in files.most_common()) or '-',
            fmt(difference, '.1e'),
            f"{r['compiled_run_seconds']:.0f} s"
            + (', stopped' if failure else '')])
        if failure:
            stops.append(f"- {_compile_form(r)} stopped in iteration "
                         f"{failure['iteration']}: `{failure['error']}: "
                         f"{failure['message']}`; the last graph holds "
                         f"{', '.join(failure['graph_modules'] or ['-'])}.")
    return '\n'.join(
        [f"torch {runs[0]['torch']}, {runs[0]['config']}.", ''] + _table(
            ['`compile`', 'iterations (padded sizes)', 'graphs (graph '
             'breaks)', 'graphs holding the backbone: iteration 1, later',
             'traces abandoned by a restart (holding the backbone)',
             'recompilations, by file',
             "first iteration's losses against eager's", 'compiled run'],
            'llllllll', rows) + ([''] + stops if stops else []))


def is_mmengine_compile_run(report: dict) -> bool:
    return 'recompiles_by_function' in report


# the generated sections of docs/performance.md, and what writes each
SECTIONS: Dict[str, Callable[[dict], str]] = {
    'gpu-proxy': gpu_proxy_section, 'cpu-vs-swin': cpu_vs_swin_section,
    'compile': compile_section, 'inductor-counts': inductor_counts_section}


def sections(reports: List[dict]) -> Dict[str, str]:
    """Every section the reports have figures for (the mmengine-compile
    runs together make one)."""
    out = {}
    for report in reports:
        if not is_mmengine_compile_run(report):
            out.update((name, text) for name, write in SECTIONS.items()
                       for text in [write(report)] if text)
    runs = [r for r in reports if is_mmengine_compile_run(r)]
    if runs:
        out['mmengine-compile'] = mmengine_compile_section(runs)
    return out


def timed_rows(report: dict) -> str:
    """Every timed row of a report (a timing run, the GPU check)."""
    rows = [[r.get('label') or _label(r['model']), step_name(
                'inference' if r['mode'] == 'fwd' else 'train',
                [r['batch'], *r['size']]),
             f"{r['median_s'] * 1e3:.1f}", f"{r['min_s'] * 1e3:.1f}",
             fmt(r.get('peak_mem_mb'), '.0f'), f"{r['params'] / 1e6:.1f}"]
            for r in report.get('results') or []]
    rows += [[r['label'], step_name('train', r['shape']),
              f"{r['median_s'] * 1e3:.1f}", f"{r['min_s'] * 1e3:.1f}",
              fmt(r.get('peak_mb'), '.0f'), f"{r['params'] / 1e6:.1f}"]
             for r in report.get('training') or []]
    if not rows:
        return ''
    return '\n'.join(_table(['model', 'step', 'median (ms)', 'fastest (ms)',
                             'peak memory (MB)', 'parameters (M)'],
                            'llrrrr', rows))
