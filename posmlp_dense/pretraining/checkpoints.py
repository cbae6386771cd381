"""Pretraining checkpoints, in the format the authors publish.

A checkpoint is a dict with ``state_dict`` (the trained weights) and
``state_dict_ema`` (their EMA, when the run keeps one), like the released
PosMLP-T file and timm's own checkpoints, so ``posmlp_dense.load_pretrained``
and an mmdet/mmseg ``init_cfg=dict(type='Pretrained', checkpoint=...)`` read
it as it is (the EMA weights by default). It also holds what resuming needs:
the optimizer and loss-scaler states, the finished ``epoch``, the best
metric, the recipe and ``model_args`` (checked on resume). Everything is
plain tensors, numbers, strings, lists and dicts, so it loads with
``torch.load(weights_only=True)``.

Files are written atomically (a temporary file renamed into place): a run
killed while saving leaves the previous checkpoint intact.
"""
from __future__ import annotations

import io
import os.path as osp
from typing import Optional

import torch
from torch import nn

from ..atomic_io import atomic_write_bytes
from ..checkpoint import read_checkpoint

LAST = 'last.pth'
BEST = 'best.pth'
FORMAT_VERSION = 1


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, 'module') and isinstance(
        model, nn.parallel.DistributedDataParallel) else model


def _cpu_state(module: nn.Module) -> dict:
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}


def make_checkpoint(model: nn.Module, ema, optimizer, scaler, epoch: int,
                    metric: Optional[float], best: Optional[float],
                    model_args: dict, recipe: dict, classes) -> dict:
    state = dict(
        state_dict=_cpu_state(unwrap(model)),
        epoch=int(epoch),
        arch='posmlp_custom' if model_args.get('arch_kwargs')
        else model_args['model'],
        model_args=model_args,
        classes=list(classes),
        recipe=recipe,
        metric=metric,
        best_metric=best,
        optimizer=optimizer.state_dict(),
        format_version=FORMAT_VERSION,
    )
    if ema is not None:
        state['state_dict_ema'] = _cpu_state(ema.module)
    if scaler is not None:
        state['amp_scaler'] = scaler.state_dict()
    return state


def save(state: dict, path: str) -> None:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(buffer.getvalue(), path)


def resume_path(output: str, resume: str) -> str:
    """``--resume`` alone means the output folder's last checkpoint."""
    path = osp.join(output, LAST) if resume == 'auto' else resume
    if not osp.isfile(path):
        raise FileNotFoundError(f'checkpoint to resume from not found: '
                                f'{path}')
    return path


def load_for_resume(path: str, model: nn.Module, ema, optimizer, scaler,
                    model_args: dict) -> dict:
    """Restore a run; returns the checkpoint (for its epoch and metrics).

    The checkpoint must come from the same model (``model_args``); the
    weights load strictly.
    """
    ckpt = read_checkpoint(path)
    if ckpt.get('model_args') != model_args:
        raise ValueError(
            f'{path} was written for {ckpt.get("model_args")}, but this run '
            f'builds {model_args}; resume with the same model, arch and '
            f'data (classes)')
    missing = [k for k in ('state_dict', 'optimizer', 'epoch')
               if k not in ckpt]
    if missing:
        raise ValueError(f'{path} cannot be resumed from: it has no '
                         f'{missing} (only pretraining checkpoints written '
                         f'by tools/pretrain.py can)')
    unwrap(model).load_state_dict(ckpt['state_dict'])
    optimizer.load_state_dict(ckpt['optimizer'])
    if ema is not None:
        if 'state_dict_ema' not in ckpt:
            raise ValueError(f'{path} has no state_dict_ema; resume with '
                             f'--no-model-ema or from a run that kept one')
        ema.module.load_state_dict(ckpt['state_dict_ema'])
    if scaler is not None and 'amp_scaler' in ckpt:
        scaler.load_state_dict(ckpt['amp_scaler'])
    return ckpt
