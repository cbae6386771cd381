"""Entry point of the fresh process in which ``training`` measures one case.

Run by ``training.footprint_in_fresh_process`` as::

    python -m benchmarks.fresh_process '<JSON spec>'

The spec names the case, the device, the seed, an optional PosMLP arch and
the file to write the result to. The process builds that one model and its
input, then runs ``training.footprint``: its first step is the first thing
this process computes.
"""
from __future__ import annotations

import json
import sys

import torch

from .training import TrainingCase, footprint, training_job


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit('usage: python -m benchmarks.fresh_process '
                         "'<JSON spec>'")
    spec = json.loads(argv[0])
    case = TrainingCase.from_dict(spec['case'])
    device = torch.device(spec['device'])
    job, model = training_job(case, device, spec['seed'],
                              spec.get('posmlp_arch'))
    result = footprint(job, model, device, case.shape[0])
    with open(spec['out'], 'w') as f:
        json.dump(result, f)


if __name__ == '__main__':
    main()
