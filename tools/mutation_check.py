#!/usr/bin/env python
"""Plant small bugs, one at a time, and check that the tests catch each one.

    python tools/mutation_check.py              # every mutation
    python tools/mutation_check.py -k fsync     # those whose name has 'fsync'
    python tools/mutation_check.py --list       # what would be planted

The working tree (without .git, .venv and generated folders) is copied to a
temporary folder; the repository itself is never modified. The tests of all
mutations are first run on the unmodified copy: they must pass there, or no
result would mean anything. Then each mutation replaces one exact snippet of
one file in the copy, runs its own selection of tests there (``pytest -x``,
the copy first on the import path, which is checked), and restores the file.

A mutation is *caught* when its tests fail. A snippet that no longer occurs
(the code changed since the mutation was written) is reported as
``DOES NOT APPLY`` and counts as a failure of the check, as do a selection
that collects no test and a test run that errors before running tests: a
mutation list that silently stops applying would prove nothing.

Prints a table (caught / missed, seconds per mutation) and exits 0 only if
every mutation applied and was caught. Slow (a few minutes on two cores);
run by ``make mutation``, not by the test suite.
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
# not copied: version control, environments, outputs of runs and demos
SKIP_AT_ROOT = {'.git', '.venv', 'work_dirs', 'data', '.pytest_cache',
                'build', 'dist'}
SKIP_ANYWHERE = ('__pycache__', '*.pyc', '*.egg-info')


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str                 # file, relative to the repository root
    original: str             # exact snippet; must occur exactly once
    replacement: str
    tests: Tuple[str, ...]    # pytest arguments: files, node ids, -k
    forward: bool = False     # in the forward pass, not only a backward


LOADING = 'tests/test_loading_across_windows.py'
ATOMIC = 'tests/test_atomic_writes.py'
GRADIENTS = 'tests/test_gradients.py'
NUMERICS = 'tests/test_gate_numerics.py'
EXPORT_EAGER = 'tests/test_export.py::test_eager_modes_agree_with_the_graph_mode'
LEAN = 'tests/test_lean_backward.py'
COMPILED_GATES = 'tests/test_compiled_gate_parameters.py'
ANY = 'tests/test_any_size.py'

MUTATIONS: List[Mutation] = [
    # ------------------------------------------ loading, resizing, writing
    Mutation(
        'resized tensors silently not loaded (still reported)',
        'posmlp_dense/checkpoint.py',
        '    for key in report.unexpected:\n        weights.pop(key)\n',
        '    for key in report.unexpected + [r[0] for r in report.resized]:\n'
        '        weights.pop(key)\n',
        (LOADING, '-k', 'every_resized or documented_resize or converter')),
    Mutation(
        'LRPE table resized with the dy and dx axes swapped',
        'posmlp_dense/relative_position.py',
        '    return resize_grid_values(table, table_grid(src_window),\n'
        '                              table_grid(dst_window))\n',
        '    h, w = table_grid(src_window)\n'
        '    swapped = table.reshape(h, w, -1).transpose(0, 1)'
        '.reshape(h * w, -1)\n'
        '    return resize_grid_values(swapped, (w, h),\n'
        '                              table_grid(dst_window))\n',
        (LOADING, '-k', 'ramps or documented_resize')),
    Mutation(
        'save_checkpoint writes in place (no temporary file + rename)',
        'posmlp_dense/checkpoint.py',
        '    atomic_io.atomic_write_bytes(data, path)\n',
        "    with open(path, 'wb') as f:\n        f.write(data)\n",
        (ATOMIC, '-k', 'save_checkpoint or converter')),
    Mutation(
        'atomic_write_bytes does not fsync the file',
        'posmlp_dense/atomic_io.py',
        '            os.fsync(f.fileno())\n',
        '',
        (ATOMIC, '-k', 'syncs')),
    Mutation(
        'atomic_write_bytes does not fsync the folder',
        'posmlp_dense/atomic_io.py',
        '    fsync_folder(folder)\n',
        '',
        (ATOMIC, '-k', 'syncs')),
    Mutation(
        "loading prefers 'state_dict' over the EMA weights",
        'posmlp_dense/checkpoint.py',
        "    entries = ('state_dict_ema', 'state_dict', 'model') "
        "if which == 'ema'",
        "    entries = ('state_dict', 'state_dict_ema', 'model') "
        "if which == 'ema'",
        ('tests/test_published_model.py', '-k', 'parity or ema_and_raw')),
    Mutation(
        'GQPE offset dy with the wrong sign (caught by the published '
        'reference)',
        'posmlp_dense/relative_position.py',
        '    dy = (r // cols - (wh - 1)).float()          # ym - yn\n',
        '    dy = ((wh - 1) - r // cols).float()          # ym - yn\n',
        ('tests/test_published_model.py',)),
    # ------------------------------------------- forward pass: the mixing
    # (token_mixing.py, block_pass.py, gates/, backbone.py, block.py)
    Mutation(
        "key_scale taken at the layout's first positions, not at the real "
        "queries",
        'posmlp_dense/token_mixing.py',
        '    return real_key_sums(weights, key_mask).index_select(\n'
        '        -1, queries).reciprocal()\n',
        '    return real_key_sums(weights, key_mask)[\n'
        '        ..., :queries.shape[0]].reciprocal()\n',
        (ANY, '-k', 'partial_windows_equal'), forward=True),
    Mutation(
        "level_mixings: the shifted blocks' per-query bias and key scale "
        "laid out on the unshifted blocks' grid",
        'posmlp_dense/token_mixing.py',
        '        on_map = grid.map_index(device)\n',
        '        on_map = grids[0].map_index(device)\n',
        (ANY, '-k', 'shifted'), forward=True),
    Mutation(
        "a level's mixing weights computed for eager in a captured graph "
        "(the capture flag not handed down)",
        'posmlp_dense/backbone.py',
        '                    [block_grids[j] for j in fused], mode)):\n',
        '                    [block_grids[j] for j in fused],\n'
        '                    ForwardMode(mode.autograd, graph=False))):\n',
        (NUMERICS, '-k', 'tells_gqpe'), forward=True),
    Mutation(
        "a captured inference graph stacks the gates' parameters",
        'posmlp_dense/token_mixing.py',
        '        each_own = mode.graph and not mode.autograd\n',
        '        each_own = False\n',
        (COMPILED_GATES, '-k', 'inference')),
    Mutation(
        "a captured inference graph fills in GQPE's -inf, which freezing "
        'does not compute at compile time',
        'posmlp_dense/gates/gqpe.py',
        '    if captured and not scores.requires_grad:\n',
        '    if False:\n',
        (COMPILED_GATES, '-k', 'freezing')),
    Mutation(
        'a captured graph stacks the per-query biases',
        'posmlp_dense/gates/position_bias.py',
        '        return biases if captured else torch.stack(biases)\n',
        '        return torch.stack(biases)\n',
        (COMPILED_GATES,)),
    Mutation(
        "a captured graph's GQPE spread form A^T A instead of A A^T",
        'posmlp_dense/gates/gqpe.py',
        '            form = (spreads.unsqueeze(-2) * spreads.unsqueeze(-3))'
        '.sum(-1)\n',
        '            form = (spreads.unsqueeze(-1) * spreads.unsqueeze(-2))'
        '.sum(-3)\n',
        (NUMERICS, '-k', 'captured_graph_equal')),
    Mutation(
        "a captured graph's GQPE offsets with dx's sign flipped",
        'posmlp_dense/gates/gqpe.py',
        '        dx = xs - xs.unsqueeze(-1)                   # xn - xm, at '
        '[m, n]\n',
        '        dx = xs.unsqueeze(-1) - xs                   # xn - xm, at '
        '[m, n]\n',
        (NUMERICS, '-k', 'captured_graph_equal')),
    Mutation(
        'a captured graph\'s lean backward leaves g without the drop scale',
        'posmlp_dense/block_function.py',
        '                g, d_g = g * sample_scale, d_g * sample_scale\n',
        '                g, d_g = g, d_g * sample_scale\n',
        (LEAN, '-k', 'captured_graph')),
    Mutation(
        'a captured graph\'s lean backward takes d(v) through u\'s GELU',
        'posmlp_dense/block_function.py',
        '            torch.ops.aten.gelu_backward(d_v.to(dtype), h[1],\n',
        '            torch.ops.aten.gelu_backward(d_v.to(dtype), h[0],\n',
        (LEAN, '-k', 'captured_graph')),
    Mutation(
        'the lean backward takes the activations apart with unbind',
        'posmlp_dense/block_function.py',
        '            u, v = act[0], act[1]\n',
        '            u, v = act.unbind(0)\n',
        ('tests/test_compiled_saved_activations.py',)),
    Mutation(
        'isotropic GQPE score with the sign of the d2 term flipped',
        'posmlp_dense/gates/gqpe.py',
        '        linear = (spreads * spreads).unsqueeze(-1) * centers\n',
        '        linear = (spreads * spreads).unsqueeze(-1) * centers * \\\n'
        '            centers.new_tensor([1.0, -1.0])\n',
        (NUMERICS, '-k', 'isotropic and partial'), forward=True),
    Mutation(
        'GQPE spread form A^T A instead of A A^T',
        'posmlp_dense/gates/gqpe.py',
        '        form = spreads @ spreads.transpose(-1, -2) if symmetric '
        'else spreads\n',
        '        form = spreads.transpose(-1, -2) @ spreads if symmetric '
        'else spreads\n',
        (NUMERICS, '-k', 'large_activations'), forward=True),
    Mutation(
        'GQPE: keys of negligible weight given score 0 (the weight of the '
        "query's own key) instead of none",
        'posmlp_dense/gates/gqpe.py',
        "    return scores.masked_fill(scores < NEGLIGIBLE_SCORE, "
        "float('-inf'))\n",
        "    return scores.masked_fill(scores < NEGLIGIBLE_SCORE, 0.0)\n",
        (NUMERICS, '-k', 'large_activations'), forward=True),
    Mutation(
        "block GELU is tanh-approximated (published: exact erf)",
        'posmlp_dense/block_pass.py',
        '    u, v = F.gelu(hidden, approximate=w.approximate).view(\n',
        "    u, v = F.gelu(hidden, approximate='tanh').view(\n",
        (NUMERICS, '-k', 'large_activations'), forward=True),
    Mutation(
        'per-query bias dropped where the weights are not renormalized '
        '(LRPE, SGU)',
        'posmlp_dense/token_mixing.py',
        '        m = m + bias.to(mixed.dtype)\n',
        '        m = m + 0 * bias.to(mixed.dtype)\n',
        (ANY, '-k', 'partial_windows_equal'), forward=True),
    Mutation(
        'per-query bias dropped where the rows are renormalized over the '
        'real keys (GQPE)',
        'posmlp_dense/token_mixing.py',
        '        m = torch.addcmul(bias, m, mixing.scale.view(1, groups, 1, '
        'H, W))\n',
        '        m = torch.addcmul(0 * bias, m, mixing.scale.view(1, groups, 1, '
        'H, W))\n',
        (ANY, '-k', 'partial_windows_equal'), forward=True),
    Mutation(
        'mixing weights detached from autograd (forward unchanged)',
        'posmlp_dense/token_mixing.py',
        '    return torch.bmm(windows, mixing.weights.to(windows.dtype)'
        '.transpose(1, 2))\n',
        '    return torch.bmm(windows, mixing.weights.to(windows.dtype)'
        '.detach().transpose(1, 2))\n',
        (GRADIENTS, '-k', 'block_gradients'), forward=True),
    Mutation(
        'inference keeps the pre-activation through the mixing (a third '
        "more of a block's peak memory)",
        'posmlp_dense/block_pass.py',
        '    if not keep_intermediates:\n        del hidden\n',
        '    if not keep_intermediates:\n        pass\n',
        ('tests/test_forward_modes.py', '-k', 'frees'), forward=True),
    Mutation(
        "the lean Function run for a gate that transforms u first (SGU: its "
        "LayerNorm skipped wherever autograd records)",
        'posmlp_dense/block.py',
        '        if mode.autograd and self.gate_unit.lean_backward:\n',
        '        if mode.autograd:\n',
        (GRADIENTS, '-k', 'block_gradients'), forward=True),
    Mutation(
        'shifted windows in the even blocks instead of the odd ones',
        'posmlp_dense/backbone.py',
        '        return (0, 0), origin\n',
        '        return origin, (0, 0)\n',
        (ANY, '-k', 'shifted'), forward=True),
    Mutation(
        "stem's last BatchNorm skipped",
        'posmlp_dense/stem.py',
        '        x = self.norms[2](self._conv(2, x))\n',
        '        x = self._conv(2, x)\n',
        ('tests/test_published_model.py', '-k', 'parity or ema_and_raw'),
        forward=True),
    # ------------------------- calling the modules (module_calls.py)
    Mutation(
        "a module's own hooks do not switch a block to its module calls "
        "(hooks, pruning silently ignored)",
        'posmlp_dense/module_calls.py',
        '    return any(type(module) is not kind or has_hooks(module)\n',
        '    return any(type(module) is not kind\n',
        ('tests/test_module_calls.py', '-k', 'prune')),
    Mutation(
        "a module swapped for another class (an adapter) does not switch a "
        "block to its module calls",
        'posmlp_dense/module_calls.py',
        '    return any(type(module) is not kind or has_hooks(module)\n',
        '    return any(has_hooks(module)\n',
        ('tests/test_module_calls.py', '-k', 'adapter')),
    # ---------------------------------- forward pass: the window layout
    # (windows.py)
    Mutation(
        'channel k in group k // (K / groups) instead of k % groups '
        '(to_windows, eager layout)',
        'posmlp_dense/windows.py',
        '        grouped = t.reshape(K // groups, groups, B, self.height * '
        'self.width\n'
        '                            ).transpose(0, 1)\n',
        '        grouped = t.reshape(groups, K // groups, B, self.height * '
        'self.width\n'
        '                            )\n',
        (ANY, '-k', 'window_layout'), forward=True),
    Mutation(
        'padded windows: softmax rows not renormalized over the real keys',
        'posmlp_dense/token_mixing.py',
        '    twice = torch.cat([key_mask, key_mask]).view(1, -1, n)\n',
        '    twice = torch.ones_like(key_mask).repeat(2).view(1, -1, n)\n',
        (ANY, '-k', 'partial_windows_equal'), forward=True),
    Mutation(
        'padded windows: padded keys not zeroed by the gathers (captured '
        'graphs)',
        'posmlp_dense/windows.py',
        '                       index.cols.view(-1, ww)] * \\\n'
        '                index.real.view(-1, ww).to(t.dtype)\n',
        '                       index.cols.view(-1, ww)]\n',
        (EXPORT_EAGER,), forward=True),
    Mutation(
        'padded windows: padded keys padded with ones, not zeros (eager '
        'layout)',
        'posmlp_dense/windows.py',
        '            layout = like.new_zeros(shape)\n',
        '            layout = like.new_ones(shape)\n',
        (ANY, '-k', 'partial_windows_equal'), forward=True),
    Mutation(
        "map_index crops the padded map at (0, 0), not after the grid's "
        "leading padding (shifted windows, eager layout)",
        'posmlp_dense/windows.py',
        '            self._map_index = padded[self.top:self.top + self.height,\n'
        '                                     self.left:self.left + self.width\n',
        '            self._map_index = padded[:self.height,\n'
        '                                     :self.width\n',
        (ANY, '-k', 'shifted'), forward=True),
    # ------------------------ the lean training Function (block_function.py)
    Mutation(
        'lean backward: d(v) multiplies by v instead of the mixed values',
        'posmlp_dense/block_function.py',
        '            d_v = torch.mul(d_g, m, out=None if d_act is None else '
        'd_act[1])\n',
        '            d_v = torch.mul(d_g, v, out=None if d_act is None else '
        'd_act[1])\n',
        (LEAN, '-k', 'equals_autograd')),
    Mutation(
        'lean backward: LayerNorm output recomputed without its bias',
        'posmlp_dense/block_function.py',
        '                ln_input, (C,), s.norm_weight, s.norm_bias, '
        'ctx.eps)\n',
        '                ln_input, (C,), s.norm_weight, None, ctx.eps)\n',
        (LEAN, '-k', 'equals_autograd')),
    Mutation(
        'lean backward: the gradient of the key scale never returned',
        'posmlp_dense/block_function.py',
        '                _like(d_scale, s.scale), None, None, None, None)\n',
        '                None, None, None, None, None)\n',
        (LEAN, '-k', 'equals_autograd')),
    Mutation(
        "lean backward: the per-query bias's gradient summed over the first "
        "group's channels only",
        'posmlp_dense/block_function.py',
        '            d_bias = d_m.sum((0, 1, 2)).flatten() if needs.bias else '
        'None\n',
        '            d_bias = d_m[:, 0].sum((0, 1)).flatten() if needs.bias else '
        'None\n',
        (LEAN, '-k', 'equals_autograd')),
    Mutation(
        'lean backward: d(u) through P^T instead of P',
        'posmlp_dense/block_function.py',
        '            d_u_w = torch.bmm(d_m_w, weights)\n',
        '            d_u_w = torch.bmm(d_m_w, weights.transpose(1, 2))\n',
        (LEAN, '-k', 'equals_autograd')),
    Mutation(
        "lean backward: d(u) written into d(v)'s half of GELU's gradient "
        "(eager)",
        'posmlp_dense/block_function.py',
        '    into = d_act[0].transpose(0, 1)',
        '    into = d_act[1].transpose(0, 1)',
        (LEAN, '-k', 'equals_autograd')),
    Mutation(
        "benchmark's timing: the rounds do not rotate (the first job always "
        "runs first)",
        'benchmarks/timing.py',
        '        k = (r - warmup) % len(names) if timed else 0\n',
        '        k = 0\n',
        ('tests/test_benchmark.py', '-k', 'interleaved')),
    Mutation(
        "benchmark's paired ratio: the mean of the rounds' ratios, not their "
        "median",
        'benchmarks/targets.py',
        "f'{name}_paired': statistics.median(rounds) if rounds else None,",
        "f'{name}_paired': statistics.mean(rounds) if rounds else None,",
        ('tests/test_benchmark.py', '-k', 'paired')),
    Mutation(
        "GPU proxy: views counted as operations that launch work",
        'benchmarks/gpu_proxy.py',
        '    return (func.is_view or torch.Tag.inplace_view in func.tags\n',
        '    return (torch.Tag.inplace_view in func.tags\n',
        ('tests/test_gpu_proxy.py', '-k', 'launch_nothing')),
    Mutation(
        "GPU proxy: the estimate adds the launches to the device's time",
        'benchmarks/gpu_proxy.py',
        'estimate_s=max(launch, device),',
        'estimate_s=launch + device,',
        ('tests/test_gpu_proxy.py', '-k', 'estimate')),
    Mutation(
        "GPU proxy: the bf16 FLOPs estimated at the fp32 rate",
        'benchmarks/gpu_proxy.py',
        '+ bf16_flops / spec.peak_bf16_flops',
        '+ bf16_flops / spec.peak_flops',
        ('tests/test_gpu_proxy.py', '-k', 'bf16_flops_take')),
    Mutation(
        "GPU proxy: bf16 steps on (fake) CUDA tensors counted under the "
        "CPU's autocast policy",
        'benchmarks/gpu_proxy.py',
        "device_type = 'cpu' if place == 'cpu' else 'cuda'",
        "device_type = 'cpu'",
        ('tests/test_gpu_proxy.py', '-k', 'cuda_policy')),
    Mutation(
        'command-line sizes: a zero size accepted',
        'benchmarks/cli_sizes.py',
        'p.isascii() and p.isdigit() and int(p) > 0 for p in parts',
        'p.isascii() and p.isdigit() and int(p) >= 0 for p in parts',
        ('tests/test_cli_sizes.py',)),
]


# -------------------------------------------------------------- the copy
def _ignore(folder, names):
    skipped = set(shutil.ignore_patterns(*SKIP_ANYWHERE)(folder, names))
    if osp.abspath(folder) == ROOT:
        skipped |= SKIP_AT_ROOT & set(names)
    return skipped


def copy_repository(dest: str) -> str:
    copy = osp.join(dest, 'repo')
    shutil.copytree(ROOT, copy, ignore=_ignore, symlinks=True)
    return copy


def _env(copy: str) -> dict:
    path = os.environ.get('PYTHONPATH', '')
    return dict(os.environ, PYTHONDONTWRITEBYTECODE='1',
                PYTHONPATH=os.pathsep.join([copy, path]) if path else copy)


def check_imports_from(copy: str):
    """The copy's package must be the one imported (not the checkout's
    editable install)."""
    out = subprocess.run(
        [sys.executable, '-c',
         'import posmlp_dense, os; print(os.path.realpath('
         'posmlp_dense.__file__))'],
        cwd=copy, env=_env(copy), capture_output=True, text=True)
    where = out.stdout.strip()
    if out.returncode or not where.startswith(osp.realpath(copy) + os.sep):
        raise SystemExit(f'mutation_check: the copy does not import its own '
                         f'posmlp_dense (got {where or out.stderr!r})')


def run_tests(copy: str, tests: Sequence[str], timeout: float
              ) -> Tuple[int, float, str]:
    """(pytest exit code, seconds, output tail); -1 on timeout."""
    cmd = [sys.executable, '-m', 'pytest', '-x', '-q', '-p',
           'no:cacheprovider', *tests]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=copy, env=_env(copy),
                              capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, time.perf_counter() - start, 'timed out'
    out = (proc.stdout + proc.stderr).strip().splitlines()
    return proc.returncode, time.perf_counter() - start, '\n'.join(out[-15:])


# ---------------------------------------------------------- one mutation
# pytest's exit codes: 0 passed, 1 tests failed, 2 interrupted (e.g. a
# collection error), 3 internal error, 4 usage error, 5 no tests collected
VERDICTS = {0: 'MISSED', 1: 'caught', 5: 'NO TESTS SELECTED', -1: 'TIMEOUT'}


def apply_and_test(copy: str, mutation: Mutation, timeout: float
                   ) -> Tuple[str, float, str]:
    path = osp.join(copy, mutation.path)
    if not osp.isfile(path):
        return 'DOES NOT APPLY (file missing)', 0.0, ''
    with open(path, encoding='utf-8') as f:
        source = f.read()
    count = source.count(mutation.original)
    if count != 1:
        what = 'snippet not found' if count == 0 \
            else f'snippet found {count} times'
        return f'DOES NOT APPLY ({what})', 0.0, ''
    try:
        with open(path, 'w', encoding='utf-8') as f:
            f.write(source.replace(mutation.original, mutation.replacement))
        code, seconds, tail = run_tests(copy, mutation.tests, timeout)
    finally:
        with open(path, 'w', encoding='utf-8') as f:
            f.write(source)
    verdict = VERDICTS.get(code, f'ERROR (pytest exit code {code})')
    return verdict, seconds, tail


def _cell(text: str) -> str:
    return text.replace('|', '\\|').replace('\n', ' ')


def table(rows) -> str:
    lines = ['| # | planted bug | file | tests | result | s |',
             '|---|---|---|---|---|---|']
    for i, (m, verdict, seconds) in enumerate(rows, 1):
        lines.append(f'| {i} | {_cell(m.name)}'
                     f'{" (forward pass)" if m.forward else ""} | '
                     f'{m.path} | {_cell(" ".join(m.tests))} | {verdict} | '
                     f'{seconds:.0f} |')
    return '\n'.join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('-k', dest='select', default=None,
                        help='only mutations whose name contains this text')
    parser.add_argument('--list', action='store_true',
                        help='list the mutations and exit')
    parser.add_argument('--timeout', type=float, default=900,
                        help='seconds per test run (default 900)')
    parser.add_argument('-v', '--verbose', action='store_true',
                        help='print the end of the test output of each run')
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    mutations = [m for m in MUTATIONS
                 if args.select is None or args.select in m.name]
    if not mutations:
        print(f'no mutation name contains {args.select!r}', file=sys.stderr)
        return 2
    if args.list:
        for m in mutations:
            print(f'{m.name}\n    {m.path}; tests: {" ".join(m.tests)}')
        return 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix='posmlp-mutation-') as tmp:
        copy = copy_repository(tmp)
        check_imports_from(copy)
        print(f'copied {ROOT} to {copy}', flush=True)
        # the selections must pass before anything is planted
        selections = sorted({tuple(m.tests) for m in mutations})
        for tests in selections:
            code, seconds, tail = run_tests(copy, tests, args.timeout)
            print(f'baseline  {" ".join(tests)}: exit code {code} '
                  f'({seconds:.0f} s)', flush=True)
            if code != 0:
                print(tail)
                print('mutation_check: the tests fail without any mutation; '
                      'fix them first', file=sys.stderr)
                return 2
        rows = []
        for m in mutations:
            verdict, seconds, tail = apply_and_test(copy, m, args.timeout)
            print(f'{verdict:>10}  {m.name} ({seconds:.0f} s)', flush=True)
            if args.verbose and tail:
                print('    ' + tail.replace('\n', '\n    '))
            rows.append((m, verdict, seconds))
    print()
    print(table(rows))
    caught = sum(v == 'caught' for _, v, _ in rows)
    stale = [m for m, v, _ in rows if v.startswith('DOES NOT APPLY')]
    for m in stale:
        print(f'mutation_check: "{m.name}" DOES NOT APPLY to {m.path}: the '
              f'code changed; re-target its snippet', file=sys.stderr)
    print(f'\n{caught} of {len(rows)} planted bugs caught; '
          f'{time.perf_counter() - start:.0f} s in all')
    return 0 if caught == len(rows) else 1


if __name__ == '__main__':
    sys.exit(main())
