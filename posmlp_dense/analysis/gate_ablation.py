"""The paper's gate ablation, small: one PosMLP trained with each gate.

The same small PosMLP classifier is trained with each gate (GQPE, LRPE,
SGU) for several seeds, with one recipe (schedule, augmentation, epochs,
batch size) for all, by the package's pretraining loop
(:func:`posmlp_dense.pretraining.trainer.pretrain`, timm's loaders,
optimizer and scheduler). Each run reports the validation top-1 of its final
weights; the result, per gate, is the top-1 of every seed, their mean and
standard deviation, the total and token-mixing parameters and the seconds
per epoch, and with them each gate's 95% interval and a paired test for
each pair of gates (:func:`.ablation_report.add_statistics`;
:mod:`.ablation_report` writes it all out).

No "no positional term" row: in PosMLP the gate's positional mixing *is*
the token mixing (the only place in a block where tokens meet), and none of
the three gates has a setting without it; dropping it would leave a model
that is not PosMLP, not a PosMLP without positions.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch
from torch import nn

from ..archs import GATES
from ..gates import GateUnit
from ..pretraining.model_factory import build_classifier
from ..pretraining.recipe import SHAPES_DEMO, Recipe
from ..pretraining.trainer import RunSettings, pretrain
from .ablation_report import add_statistics

#: The ablation's classifier: the demo detector's backbone widths and
#: depths (configs/_base_/posmlp_demo_backbone.py) with windows that tile
#: its 64 x 64 inputs (token maps 16, 8, 4, 2): four windows at the first
#: level, one window covering the whole map at the others.
ABLATION_ARCH = dict(embed_dims=[32, 64, 128, 256], depths=[1, 1, 2, 1],
                     mlp_ratio=[4, 4, 4, 2], gamma=[8, 16, 32, 64],
                     window_size=[8, 8, 4, 2])

#: One recipe for every gate: the short CPU recipe of the shapes pretraining
#: with no flips (a mirrored image shows another class of the relation set:
#: left and right swap) and crops that keep both shapes in view; no EMA, so
#: that each run is judged by the weights it trained.
ABLATION_RECIPE: Recipe = SHAPES_DEMO.replace(
    epochs=6, warmup_epochs=1, hflip=0.0, scale=(0.85, 1.0),
    ratio=(0.9, 1.1), model_ema=False, workers=0)

#: Four seeds, not three: Student's t interval of a mean over n seeds is
#: t(n-1) / sqrt(n) standard deviations wide on each side, 2.48 at three
#: seeds and 1.59 at four, the cheapest narrowing there is. The default run
#: (3 gates x 4 seeds x 6 epochs of the 3200-image relation set) takes
#: about 25 min with one CPU thread.
DEFAULT_SEEDS = 4


@dataclass
class AblationSettings:
    data: str
    gates: Sequence[str] = GATES
    seeds: int = DEFAULT_SEEDS
    epochs: int = ABLATION_RECIPE.epochs
    recipe: Recipe = field(default_factory=lambda: ABLATION_RECIPE)
    arch: dict = field(default_factory=lambda: dict(ABLATION_ARCH))
    # where each run's log and checkpoints go; default: a temporary folder
    work_dir: Optional[str] = None
    device: str = 'cpu'

    def check(self) -> None:
        """Raise ValueError naming a bad setting."""
        if not os.path.isdir(self.data):
            raise ValueError(f'data folder not found: {self.data}')
        if not self.gates:
            raise ValueError(f'no gates given; choose from {list(GATES)}')
        unknown = [g for g in self.gates if g not in GATES]
        if unknown:
            raise ValueError(f'unknown gate(s) {unknown}; choose from '
                             f'{list(GATES)}')
        if len(set(self.gates)) != len(self.gates):
            raise ValueError(f'a gate is named twice: {list(self.gates)}')
        if not isinstance(self.seeds, int) or self.seeds < 1:
            raise ValueError(f'seeds must be at least 1, got {self.seeds}')
        if not isinstance(self.epochs, int) or self.epochs < 1:
            raise ValueError(f'epochs must be at least 1, got {self.epochs}')
        if self.device.split(':')[0] not in ('cpu', 'cuda'):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got "
                             f'{self.device!r}')


def token_mixing_parameters(model: nn.Module) -> int:
    """Parameters that set how tokens are mixed: those of every gate unit
    (GQPE's Gaussians, LRPE's tables, SGU's N x N matrix, and the per-query
    biases), but not SGU's LayerNorm, which acts on each token alone."""
    total = 0
    for gate in model.modules():
        if not isinstance(gate, GateUnit):
            continue
        norms = {id(p) for m in gate.modules() if isinstance(m, nn.LayerNorm)
                 for p in m.parameters()}
        total += sum(p.numel() for p in gate.parameters()
                     if id(p) not in norms)
    return total


def _mean_std(values: List[float]) -> tuple:
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return mean, std


def _count_images(folder: str) -> int:
    """Files in the class folders of an ImageFolder split."""
    return sum(len(files) for _, _, files in os.walk(folder))


def train_one(settings: AblationSettings, gate: str, seed: int,
              output: str) -> dict:
    """One run: top-1 of the final weights, parameter counts, time."""
    recipe = settings.recipe.replace(epochs=settings.epochs, seed=seed)
    arch_kwargs = dict(arch=settings.arch, gate=gate)
    start = time.perf_counter()
    result = pretrain(RunSettings(
        data=settings.data, output=output, arch_kwargs=arch_kwargs,
        device=settings.device, log_interval=10 ** 9,
        eval_interval=settings.epochs, workers=recipe.workers), recipe)
    seconds = time.perf_counter() - start
    model = build_classifier('custom', len(result['classes']),
                             recipe.drop_rate, recipe.drop_path_rate,
                             arch_kwargs)
    return dict(top1=result['last']['top1'], seconds=seconds,
                classes=result['classes'], num_val=result['num_val'],
                params=sum(p.numel() for p in model.parameters()),
                token_mixing_params=token_mixing_parameters(model))


def run_ablation(settings: AblationSettings, log=print) -> dict:
    """Train every gate for every seed; the result as a JSON-able dict."""
    settings.check()
    started = time.perf_counter()
    gates: Dict[str, dict] = {}
    classes, num_val = None, None
    with tempfile.TemporaryDirectory(prefix='ablate_gates_') as tmp:
        work_dir = settings.work_dir or tmp
        for gate in settings.gates:
            runs = []
            for seed in range(settings.seeds):
                log(f'[{gate}] seed {seed}: training {settings.epochs} '
                    f'epochs')
                run = train_one(settings, gate, seed,
                                os.path.join(work_dir, f'{gate}_seed{seed}'))
                log(f'[{gate}] seed {seed}: top-1 {run["top1"]:.2f} in '
                    f'{run["seconds"]:.0f} s')
                runs.append(run)
            classes, num_val = runs[0]['classes'], runs[0]['num_val']
            top1 = [r['top1'] for r in runs]
            mean, std = _mean_std(top1)
            seconds = sum(r['seconds'] for r in runs)
            gates[gate] = dict(
                top1=top1, top1_mean=mean, top1_std=std,
                params=runs[0]['params'],
                token_mixing_params=runs[0]['token_mixing_params'],
                seconds_per_epoch=seconds / (settings.epochs * len(runs)))
    recipe = settings.recipe.replace(epochs=settings.epochs)
    return add_statistics(dict(
        data=settings.data, classes=list(classes),  # as given: no machine path
        num_train=_count_images(os.path.join(settings.data, 'train')),
        num_val=num_val, chance_top1=100.0 / len(classes),
        seeds=list(range(settings.seeds)), epochs=settings.epochs,
        arch=settings.arch, recipe=recipe.as_dict(),
        no_positional_term=('not run: every PosMLP gate mixes tokens by '
                            'position, and none has a setting without it'),
        seconds_per_epoch_note=('wall time of a run (training, one '
                                'validation at the end) / epochs, mean '
                                'over seeds'),
        total_seconds=time.perf_counter() - started,
        # the seconds depend on it as much as on the gates
        threads=torch.get_num_threads() if settings.device == 'cpu' else None,
        gates=gates))

