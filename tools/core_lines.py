"""Count the distinct lines of ``posmlp_dense`` that one model's compute
runs through: ``sys.settrace`` over the forward and the backward of PosMLP
with each of the three gates, in eval (no autograd), eval with autograd and
train mode, at an input size whose maps are not tiled by whole windows.

    python tools/core_lines.py                 # PosMLP-T at 1x3x200x264
    python tools/core_lines.py --by-file

This is the measure of issue 31 ("one model core that reads as the model"):
fewer lines run means fewer places a change has to reach.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
from typing import Dict, Set, Tuple

import torch

import posmlp_dense
from posmlp_dense.backbone import PosMLP

ROOT = os.path.dirname(os.path.abspath(posmlp_dense.__file__))
GATES = ('gqpe', 'lrpe', 'sgu')
MODES = ('eval', 'eval-with-grad', 'train')


def traced_lines(arch='t', shape=(1, 3, 200, 264)) -> Set[Tuple[str, int]]:
    """(file relative to the package, line) of every package line run."""
    lines: Set[Tuple[str, int]] = set()

    def trace(frame, event, arg):
        if not frame.f_code.co_filename.startswith(ROOT):
            return None

        def local(frame, event, arg):
            if event == 'line':
                lines.add((frame.f_code.co_filename, frame.f_lineno))
            return local
        return local

    x = torch.randn(*shape)
    for gate in GATES:
        model = PosMLP(arch, gate=gate)
        for mode in MODES:
            model.train(mode == 'train')
            sys.settrace(trace)
            threading.settrace(trace)   # autograd may run a backward there
            try:
                with torch.set_grad_enabled(mode != 'eval'):
                    outs = model(x)
                    if mode != 'eval':
                        sum(o.sum() for o in outs).backward()
            finally:
                sys.settrace(None)
                threading.settrace(None)
    return {(os.path.relpath(f, ROOT), n) for f, n in lines}


def main(argv=None) -> Dict[str, int]:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--arch', default='t', help='t, s or b (default t)')
    p.add_argument('--shape', default='1x3x200x264',
                   help='BxCxHxW of the input (default %(default)s)')
    p.add_argument('--by-file', action='store_true',
                   help='also print the count of each file')
    args = p.parse_args(argv)
    shape = tuple(int(v) for v in args.shape.lower().split('x'))
    lines = traced_lines(args.arch, shape)
    per_file: Dict[str, int] = {}
    for name, _ in lines:
        per_file[name] = per_file.get(name, 0) + 1
    if args.by_file:
        for name in sorted(per_file):
            print(f'{per_file[name]:5d}  {name}')
    print(f'{len(lines)} distinct lines of posmlp_dense run (PosMLP-'
          f'{args.arch.upper()}, {len(GATES)} gates x {len(MODES)} modes, '
          f'input {args.shape})')
    return per_file


if __name__ == '__main__':
    main()
