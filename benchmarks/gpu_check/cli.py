"""The GPU check: posmlp_dense on a CUDA device with torch, timm and the
ONNX packages alone (tier 1), and the OpenMMLab stack where it imports
(tier 2). docs/gpu.md describes the rows.

    python -m benchmarks.gpu_check --json gpu_check.json
    python -m benchmarks.gpu_check --device cpu --tiny   # a dry run

Every check prints a row, ok, FAIL or skipped with the reason; the exit
status is 1 if any check failed.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import time
from typing import Callable, Dict, List, Tuple

import torch

from posmlp_dense.archs import GATES
from posmlp_dense.atomic_io import atomic_write_bytes
from posmlp_dense.optional_deps import is_installed
from ..environment import environment
from ..targets import target_lines
from ..timing import MEMORY_METHODS
from . import detector as tier2
from .compiled import compiled_step
from .models import LABELS, perturb_, posmlp, speed_models
from .numerics import autocast_against_fp32, device_against_cpu
from .onnx_check import export_check
from .profiles import COMPARISON_SIZES, FULL, TINY, Profile
from .rows import (Row, Skip, Verdict, run_check, skipped_row, summary,
                   table)
from .speed import compare
from .training import training_steps

# compile before export: on the GPU, compile is the part whose length is
# least predictable, and export runs on the CPU with any device
SECTIONS = ('numerics', 'autocast', 'training', 'speed', 'compile',
            'export', 'detector')
VERSIONS_OF = ('torch', 'timm', 'onnx', 'onnxscript', 'onnxruntime')
OPENMMLAB = ('mmengine', 'mmcv', 'mmdet', 'mmseg')
Check = Tuple[str, Callable[[], Verdict]]


def parse_args(argv=None) -> argparse.Namespace:
    doc = __doc__.split('\n')
    p = argparse.ArgumentParser(
        prog='python -m benchmarks.gpu_check', description=doc[0],
        epilog='\n'.join(doc[2:]),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--device', choices=('cuda', 'cpu'), default='cuda',
                   help='where the checks run (default cuda; cpu: a dry run)')
    p.add_argument('--tiny', action='store_true',
                   help='a tiny PosMLP, small inputs and few repeats (the '
                   'dry run of the test suite)')
    p.add_argument('--json', metavar='PATH',
                   help='also write every row and figure as JSON, after each '
                   'section; it is a benchmark report: `python '
                   'tools/benchmark.py render PATH` renders its tables')
    p.add_argument('--only', metavar='SECTIONS',
                   help=f'comma list from {",".join(SECTIONS)} (default: all)')
    p.add_argument('--compile-backend', default='inductor',
                   help='torch.compile backend (default inductor; eager or '
                   'aot_eager trace without generating code, for dry runs)')
    p.add_argument('--time-limit', type=float, default=0.0,
                   metavar='SECONDS', help='checks that would start later '
                   'than this are skipped (default 0: no limit)')
    p.add_argument('--seed', type=int, default=0)
    args = p.parse_args(argv)
    if args.only:
        args.only = [s.strip() for s in args.only.split(',') if s.strip()]
        unknown = [s for s in args.only if s not in SECTIONS]
        if unknown:
            p.error(f'--only: unknown section(s) {", ".join(unknown)}; '
                    f'choose from {", ".join(SECTIONS)}')
    else:
        args.only = list(SECTIONS)
    return args


def choose_device(name: str) -> torch.device:
    if name == 'cuda' and not torch.cuda.is_available():
        raise SystemExit(
            f'torch {torch.__version__} (built for CUDA {torch.version.cuda})'
            f' sees no CUDA device; this check needs one (--device cpu runs '
            f'it on the CPU as a dry run)')
    return torch.device(name)


class GpuCheck:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.profile: Profile = TINY if args.tiny else FULL
        self.device = choose_device(args.device)
        self.seed = args.seed
        self.start = time.perf_counter()
        self.built: Dict[tuple, object] = {}  # dropped after a section
        self.rows: List[Row] = []
        self.report = self._new_report()

    def lazy(self, key: tuple, build: Callable[[], object]):
        if key not in self.built:
            self.built[key] = build()
        return self.built[key]

    def log(self, msg: str):
        print(f'[{time.perf_counter() - self.start:6.1f}s] {msg}',
              flush=True)

    def _new_report(self) -> dict:
        env = environment(self.device)
        env.update(versions={n: env.get(n, 'not installed')
                             for n in VERSIONS_OF},
                   openmmlab={n: is_installed(n) for n in OPENMMLAB})
        config = dict(vars(self.args), profile=self.profile.name,
                      arch=self.profile.arch, repeats=self.profile.repeats,
                      warmup=self.profile.warmup)
        return dict(
            part='gpu-check', config=config, environment=env, checks=[],
            results=[], training=[], detector_predict=[],
            memory_method=MEMORY_METHODS[
                'cuda' if self.device.type == 'cuda' else None],
            passed=None, run_seconds=0.0)

    def write_json(self):
        if not self.args.json:
            return
        r = self.report
        r['checks'] = [row.as_dict() for row in self.rows]
        r['targets'] = target_lines(r)
        r['run_seconds'] = time.perf_counter() - self.start
        r['passed'] = not any(row.status == 'FAIL' for row in self.rows)
        atomic_write_bytes(json.dumps(r, indent=1).encode(), self.args.json)

    def posmlp_base(self, gate: str):
        """The numerics' model of ``gate`` (CPU, fp32, no stochastic
        depth, perturbed weights)."""
        return self.lazy(('posmlp', gate), lambda: perturb_(
            posmlp(self.profile.arch, gate, seed=self.seed), self.seed))

    def numerics(self) -> List[Check]:
        batch = self.profile.comparison_batch
        return [(f'{gate} fp32 {batch}x3x{h}x{w} ({kind})',
                 lambda gate=gate, size=(h, w): device_against_cpu(
                     self.posmlp_base(gate), size, batch, self.device,
                     self.seed))
                for gate in GATES
                for kind, (h, w) in COMPARISON_SIZES.items()]

    def autocast(self) -> List[Check]:
        b, h, w = self.profile.autocast_shape
        return [(f'{gate} {name} autocast {b}x3x{h}x{w}',
                 lambda gate=gate, dtype=dtype: autocast_against_fp32(
                     self.posmlp_base(gate), self.profile.autocast_shape,
                     self.device, dtype, self.seed))
                for name, dtype in (('bf16', torch.bfloat16),
                                    ('fp16', torch.float16))
                for gate in GATES]

    def training(self) -> List[Check]:
        p = self.profile
        b, h, w = p.train_shape

        def base():
            return self.lazy(('train',), lambda: posmlp(
                p.arch, 'gqpe', drop_path_rate=0.2, seed=self.seed))
        return [(f'{p.posmlp_label} {name} step {b}x3x{h}x{w} ({how})',
                 lambda dtype=dtype: training_steps(
                     base(), p.train_shape, self.device, dtype, p.train_steps,
                     self.seed))
                for name, dtype, how in (
                    ('fp32', None, 'AdamW'),
                    ('bf16', torch.bfloat16, 'autocast, AdamW'),
                    ('fp16', torch.float16, 'autocast, GradScaler, AdamW'))]

    def speed(self) -> List[Check]:
        p = self.profile
        b, h, w = p.train_shape
        labels = dict(LABELS, posmlp_t=p.posmlp_label)

        def models():
            return self.lazy(('speed',), lambda: {
                k: m.to(self.device) for k, m in
                speed_models(p.arch, self.seed).items()})

        def run(mode):
            verdict, rows = compare(models(), labels, p.train_shape, mode,
                                    p.warmup, p.repeats, self.device,
                                    self.seed)
            self.report['results'].extend(rows)
            return verdict
        return [(f'{mode} {b}x3x{h}x{w}: PosMLP, Swin-T, ResNet-50',
                 lambda mode=mode: run(mode)) for mode in ('fwd', 'fwdbwd')]

    def export(self) -> List[Check]:
        p = self.profile
        b, h, w = p.export_shape
        return [(f'{p.export_label} gqpe {b}x3x{h}x{w} -> onnxruntime',
                 lambda: export_check(perturb_(posmlp(
                     p.export_arch, 'gqpe', seed=self.seed), self.seed),
                     p.export_shape, self.seed))]

    def compile(self) -> List[Check]:
        p = self.profile
        b, h, w = p.train_shape
        label = f'{p.posmlp_label} fwdbwd {b}x3x{h}x{w}'
        default_passed = {}     # stays False where the default compile raises

        def step(recompute_views: bool, dynamic=True) -> Verdict:
            return compiled_step(
                posmlp(p.arch, 'gqpe', seed=self.seed), p.train_shape,
                self.device, self.args.compile_backend, p.warmup, p.repeats,
                self.seed, p.compile_sizes, recompute_views=recompute_views,
                dynamic=dynamic)

        def default() -> Verdict:
            default_passed['value'] = False
            verdict = step(recompute_views=False)
            default_passed['value'] = verdict.passed
            return verdict

        def workaround() -> Verdict:
            if default_passed.get('value', True):
                raise Skip('run only where the default compile fails')
            return step(recompute_views=True)
        # torch's default: the first further size compiles a second graph,
        # with dynamic sizes, that the others reuse
        return [(label, default),
                (f'{label}, recompute_views=True', workaround),
                (f'{label}, dynamic=None',
                 lambda: step(recompute_views=False, dynamic=None))]

    def detector(self) -> List[Check]:
        p = self.profile
        b, h, w = p.detector_shape
        detectors = tier2.Detectors(p.arch, p.detector_shape, self.device,
                                    self.seed)

        def train():
            verdict, rows = tier2.train_iteration(
                detectors, p.detector_warmup, p.detector_repeats)
            self.report['training'].extend(rows)
            return verdict

        def predict():
            verdict, rows = tier2.predict(detectors, p.detector_warmup,
                                          p.detector_repeats)
            self.report['detector_predict'].extend(rows)
            return verdict
        return [(f'RetinaNet train iteration {b}x3x{h}x{w}', train),
                (f'RetinaNet predict {b}x3x{h}x{w}', predict)]

    def environment_row(self) -> Row:
        env = self.report['environment']
        where = (env.get('cuda_device', '?') + f", CUDA {env.get('cuda')}, "
                 f"cuDNN {env.get('cudnn')}" if self.device.type == 'cuda'
                 else f"CPU dry run ({env.get('cpu_model', '?')}, "
                 f"{env['threads']} threads)")
        mm = [n for n, there in env['openmmlab'].items() if there] or ['none']
        detail = (f"{where}; python {env['python']}; "
                  + ', '.join(f'{n} {v}' for n, v in env['versions'].items())
                  + f"; OpenMMLab: {', '.join(mm)}; profile "
                  f"{self.profile.name}")
        return Row('env', 'device and versions', 'ok', detail, 0.0,
                   dict(versions=env['versions']))

    def run(self) -> int:
        self.log(f'GPU check, profile {self.profile.name}, device '
                 f'{self.device}')
        self.rows.append(self.environment_row())
        self.log(self.rows[-1].detail)
        limit = self.args.time_limit
        for section in SECTIONS:
            checks = getattr(self, section)()
            if section not in self.args.only:
                self.rows += [skipped_row(section, name, 'not selected '
                                          '(--only)') for name, _ in checks]
                continue
            self.log(f'=== {section}: {len(checks)} check(s)')
            began = time.perf_counter()
            for name, fn in checks:
                spent = time.perf_counter() - self.start
                if limit and spent >= limit:
                    self.rows.append(skipped_row(
                        section, name, f'time limit: {spent:.0f} s spent of '
                        f'--time-limit {limit:g} s'))
                    continue
                self.rows.append(run_check(section, name, fn, self.log))
            self.built.clear()
            gc.collect()
            if self.device.type == 'cuda':
                torch.cuda.empty_cache()
            self.log(f'=== {section} done in '
                     f'{time.perf_counter() - began:.1f} s')
            self.write_json()
        if hasattr(os, 'getloadavg'):  # (the report shows it)
            self.report['environment']['loadavg_end'] = os.getloadavg()
        self.write_json()
        print()
        print(table(self.rows))
        print(summary(self.rows)
              + f'; {time.perf_counter() - self.start:.0f} s in all'
              + (f'; JSON: {self.args.json}' if self.args.json else ''))
        return 1 if any(r.status == 'FAIL' for r in self.rows) else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    return GpuCheck(args).run()
