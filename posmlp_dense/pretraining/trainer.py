"""ImageNet-style pretraining of a PosMLP classifier with timm's components.

One process per device; under ``torchrun`` the processes train with
DistributedDataParallel (nccl on GPUs, gloo on CPUs). Each epoch ends with
an evaluation of the weights and of their EMA on the validation split and a
checkpoint (``last.pth``; ``best.pth`` when the validation top-1 of the
weights a checkpoint's readers use, the EMA when kept, improved), written by
the first process.
"""
from __future__ import annotations

import contextlib
import logging
import os
import os.path as osp
import sys
import time
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import (AverageMeter, ModelEmaV3, NativeScaler, accuracy,
                        dispatch_clip_grad, distribute_bn, random_seed,
                        update_summary)
from timm.utils.distributed import init_distributed_device_so

from . import checkpoints
from .data import build_loaders
from .model_factory import build_classifier, model_args as make_model_args
from .progress import Progress, format_duration
from .recipe import Recipe

logger = logging.getLogger('posmlp_dense.pretraining')


@dataclass
class RunSettings:
    """Everything about a run that is not the recipe."""
    data: str
    output: str
    model: str = 'posmlp_t'
    arch_kwargs: Optional[dict] = None
    resume: Optional[str] = None   # None, 'auto' or a path
    device: Optional[str] = None   # default: cuda when available
    amp: Optional[bool] = None     # default: the recipe's on GPUs, off on CPU
    log_interval: int = 50
    eval_interval: int = 1
    workers: Optional[int] = None


def _setup_logging(output: str, primary: bool):
    logger.setLevel(logging.INFO if primary else logging.WARNING)
    for handler in logger.handlers:  # an earlier run in this process
        handler.close()
    logger.handlers.clear()
    logger.propagate = False
    fmt = logging.Formatter('%(asctime)s %(message)s', '%H:%M:%S')
    handlers = [logging.StreamHandler(sys.stdout)]
    if primary:
        handlers.append(logging.FileHandler(osp.join(output, 'log.txt')))
    for handler in handlers:
        handler.setFormatter(fmt)
        logger.addHandler(handler)


def _precision(device: torch.device, amp: Optional[bool], recipe: Recipe):
    """(autocast context factory, loss scaler or None, description)."""
    if amp is None:
        amp = recipe.amp and device.type == 'cuda'
    use_amp = bool(amp)
    if not use_amp:
        return contextlib.nullcontext, None, 'fp32'
    if device.type == 'cuda':
        return (lambda: torch.autocast('cuda', dtype=torch.float16),
                NativeScaler('cuda'), 'fp16 autocast with loss scaling')
    return (lambda: torch.autocast(device.type, dtype=torch.bfloat16), None,
            'bf16 autocast')


@torch.no_grad()
def evaluate(model: nn.Module, loader, device: torch.device, autocast,
             num_classes: int) -> dict:
    """Top-1 (top-5 with more than 5 classes) and loss over the whole
    validation split, exact under DDP (the padding that evens out the
    processes' shares is not counted)."""
    model.eval()
    sampler = loader.sampler
    valid = getattr(sampler, 'num_valid_samples', len(loader.dataset))
    top_k = min(5, num_classes)
    sums = torch.zeros(4, dtype=torch.float64, device=device)
    seen = 0
    loss_fn = nn.CrossEntropyLoss(reduction='sum')
    for images, targets in loader:
        images, targets = images.to(device), targets.to(device)
        keep = max(0, min(len(images), valid - seen))
        seen += len(images)
        if keep == 0:
            continue
        images, targets = images[:keep], targets[:keep]
        with autocast():
            logits = model(images)
        logits = logits.float()
        acc1, acc5 = accuracy(logits, targets, topk=(1, top_k))
        sums += torch.tensor([loss_fn(logits, targets).item(),
                              acc1.item() * keep / 100,
                              acc5.item() * keep / 100, keep],
                             dtype=torch.float64, device=device)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(sums)
    loss, correct1, correct5, count = sums.tolist()
    count = max(count, 1)
    metrics = dict(loss=loss / count, top1=100 * correct1 / count)
    if num_classes > 5:
        metrics['top5'] = 100 * correct5 / count
    return metrics


def _describe(metrics: dict, prefix: str = '') -> str:
    text = f'{prefix}top-1 {metrics["top1"]:.2f}'
    if 'top5' in metrics:
        text += f' top-5 {metrics["top5"]:.2f}'
    return text


def train_one_epoch(epoch, num_epochs, model, loader, optimizer, scheduler,
                    loss_fn, mixup, recipe, device, autocast, scaler, ema,
                    progress: Progress, log_interval: int,
                    num_updates: int) -> tuple:
    model.train()
    losses = AverageMeter()
    steps = len(loader)
    progress.restart_clock()
    parameters = [p for p in model.parameters() if p.requires_grad]
    for step, (images, targets) in enumerate(loader, 1):
        progress.data_ready()
        images, targets = images.to(device), targets.to(device)
        if mixup is not None:
            images, targets = mixup(images, targets)
        with autocast():
            loss = loss_fn(model(images), targets)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f'loss is {loss.item()} at epoch {epoch + 1}, step {step}; '
                f'lower the learning rate or check the data')
        optimizer.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler(loss, optimizer, clip_grad=recipe.clip_grad,
                   clip_mode=recipe.clip_mode, parameters=parameters)
        else:
            loss.backward()
            if recipe.clip_grad is not None:
                dispatch_clip_grad(parameters, recipe.clip_grad,
                                   mode=recipe.clip_mode)
            optimizer.step()
        num_updates += 1
        if ema is not None:
            ema.update(checkpoints.unwrap(model), step=num_updates)
        scheduler.step_update(num_updates=num_updates)
        losses.update(loss.item(), len(images))
        progress.step_done()
        if step % log_interval == 0 or step == steps:
            lr = optimizer.param_groups[0]['lr']
            logger.info(progress.line(epoch, num_epochs, step, steps, losses,
                                      lr))
    return dict(loss=losses.avg), num_updates


def pretrain(run: RunSettings, recipe: Recipe) -> dict:
    """Train; returns the final and best validation metrics."""
    started = time.time()
    device_name = run.device or ('cuda' if torch.cuda.is_available()
                                 else 'cpu')
    dist_info = init_distributed_device_so(device=device_name)
    device = torch.device(dist_info['device'])
    distributed = dist_info['distributed']
    world, rank = dist_info['world_size'], dist_info['global_rank']
    primary = rank == 0
    os.makedirs(run.output, exist_ok=True)
    _setup_logging(run.output, primary)
    random_seed(recipe.seed, rank)

    loaders = build_loaders(run.data, recipe, device, distributed,
                            run.workers)
    num_classes = len(loaders.classes)
    model = build_classifier(run.model, num_classes, recipe.drop_rate,
                             recipe.drop_path_rate, run.arch_kwargs)
    model.to(device)
    model_args = make_model_args(run.model, num_classes, run.arch_kwargs)
    ema = ModelEmaV3(model, decay=recipe.model_ema_decay,
                     use_warmup=recipe.model_ema_warmup) \
        if recipe.model_ema else None
    optimizer = create_optimizer_v2(model, opt=recipe.opt, lr=recipe.lr,
                                    weight_decay=recipe.weight_decay,
                                    eps=recipe.opt_eps)
    autocast, scaler, precision = _precision(device, run.amp, recipe)

    start_epoch, best, best_epoch = 0, None, None
    if run.resume is not None:
        path = checkpoints.resume_path(run.output, run.resume)
        ckpt = checkpoints.load_for_resume(path, model, ema, optimizer,
                                           scaler, model_args)
        start_epoch = ckpt['epoch'] + 1
        best, best_epoch = ckpt.get('best_metric'), ckpt.get('best_epoch')
        # new random streams: not the shuffles and augmentations of epoch 1
        random_seed(recipe.seed + start_epoch, rank)
        logger.info(f'resumed from {path} (finished epoch '
                    f'{ckpt["epoch"] + 1})')
    if distributed:
        model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == 'cuda'
            else None)

    updates_per_epoch = len(loaders.train)
    scheduler, num_epochs = create_scheduler_v2(
        optimizer, sched='cosine', num_epochs=recipe.epochs,
        warmup_epochs=recipe.warmup_epochs,
        cooldown_epochs=recipe.cooldown_epochs, min_lr=recipe.min_lr,
        warmup_lr=recipe.warmup_lr,
        step_on_epochs=not recipe.sched_on_updates,
        updates_per_epoch=updates_per_epoch)
    num_updates = start_epoch * updates_per_epoch
    if start_epoch > 0:  # timm's way of resuming its schedulers
        if recipe.sched_on_updates:
            scheduler.step_update(num_updates)
        else:
            scheduler.step(start_epoch)
    if loaders.mixup is not None:
        train_loss = SoftTargetCrossEntropy()  # Mixup smooths the targets
    elif recipe.smoothing:
        train_loss = LabelSmoothingCrossEntropy(smoothing=recipe.smoothing)
    else:
        train_loss = nn.CrossEntropyLoss()

    params = sum(p.numel() for p in model.parameters())
    name = f'custom PosMLP {run.arch_kwargs}' if run.arch_kwargs \
        else run.model
    logger.info(
        f'model {name}, {params / 1e6:.2f} M parameters, {num_classes} '
        f'classes; '
        f'{world} process(es) on {device.type}, batch {recipe.batch_size} '
        f'per process ({recipe.batch_size * world} in all), '
        f'{updates_per_epoch} steps per epoch, {num_epochs} epochs '
        f'({recipe.epochs} + {recipe.cooldown_epochs} cooldown), '
        f'{precision}, EMA '
        f'{"decay " + str(recipe.model_ema_decay) if ema else "off"}'
        f', Mixup/CutMix {"on" if loaders.mixup else "off"}; chance '
        f'top-1 {100 / num_classes:.2f} (balanced classes)')
    logger.info(f'recipe: {recipe.as_dict()}')
    if start_epoch >= num_epochs:
        logger.info(f'nothing to do: the run finished all {num_epochs} '
                    f'epochs')
    progress = Progress(num_epochs * updates_per_epoch, num_updates,
                        recipe.batch_size * world)
    last = {}
    for epoch in range(start_epoch, num_epochs):
        if distributed:
            loaders.train.sampler.set_epoch(epoch)
        train_metrics, num_updates = train_one_epoch(
            epoch, num_epochs, model, loaders.train, optimizer, scheduler,
            train_loss, loaders.mixup, recipe, device, autocast, scaler, ema,
            progress, run.log_interval, num_updates)
        epoch_lr = optimizer.param_groups[0]['lr']
        if not recipe.sched_on_updates:
            scheduler.step(epoch + 1)
        final = epoch + 1 == num_epochs
        if (epoch + 1) % run.eval_interval and not final:
            continue
        if distributed:  # as published: average the BatchNorm statistics
            distribute_bn(model, world, reduce=True)
        # the bare model: no DDP collectives, the processes' shares differ
        metrics = evaluate(checkpoints.unwrap(model), loaders.val, device,
                           autocast, num_classes)
        line = (f'epoch {epoch + 1}/{num_epochs} validation: '
                f'{_describe(metrics)} loss {metrics["loss"]:.4f}')
        eval_row = dict(metrics)
        if ema is not None:
            ema_metrics = evaluate(ema.module, loaders.val, device, autocast,
                                   num_classes)
            line += f' | {_describe(ema_metrics, "EMA ")}'
            eval_row.update({f'ema_{k}': v for k, v in ema_metrics.items()})
        score = eval_row['ema_top1' if ema is not None else 'top1']
        improved = best is None or score > best
        if improved:
            best, best_epoch = score, epoch + 1
        logger.info(line)
        last = dict(eval_row, epoch=epoch + 1)
        if primary:
            state = checkpoints.make_checkpoint(
                model, ema, optimizer, scaler, epoch, score, best,
                model_args, recipe.as_dict(), loaders.classes)
            state['best_epoch'] = best_epoch
            checkpoints.save(state, osp.join(run.output, checkpoints.LAST))
            if improved:
                checkpoints.save(state, osp.join(run.output,
                                                 checkpoints.BEST))
            update_summary(epoch + 1, train_metrics, eval_row,
                           osp.join(run.output, 'summary.csv'),
                           lr=epoch_lr)
        if distributed:
            torch.distributed.barrier()
    weights = 'EMA' if ema is not None else 'trained'
    if best is not None:
        logger.info(f'done in {format_duration(time.time() - started)}: '
                    f'best validation top-1 ({weights} weights) {best:.2f} '
                    f'at epoch {best_epoch}; checkpoints in {run.output}')
    if distributed:
        torch.distributed.destroy_process_group()
    return dict(last=last, best=best, best_epoch=best_epoch,
                classes=loaders.classes, num_val=loaders.num_val)
