"""ImageNet-style data for pretraining: an ImageFolder tree, timm's loaders.

::

    <root>/train/<class name>/<image> ...
    <root>/val/<class name>/<image> ...     (or <root>/validation/)

Class indices are the sorted folder names (timm's folder reader), the same in
both splits. Training images go through timm's ImageNet transform
(RandomResizedCrop, flips, RandAugment, random erasing), validation images
through its resize + centre crop (``crop_pct``); Mixup / CutMix and label
smoothing are timm's ``Mixup`` applied to each batch.
"""
from __future__ import annotations

import os.path as osp
from dataclasses import dataclass
from typing import List, Optional

import torch
from timm.data import (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, Mixup,
                       create_dataset, create_loader)

from .recipe import Recipe

VAL_FOLDERS = ('val', 'validation')


@dataclass
class Loaders:
    train: torch.utils.data.DataLoader
    val: torch.utils.data.DataLoader
    classes: List[str]
    mixup: Optional[Mixup]
    num_val: int  # images in the validation split (without DDP padding)


def find_split(root: str, names) -> str:
    for name in names:
        path = osp.join(root, name)
        if osp.isdir(path):
            return path
    raise FileNotFoundError(
        f'no {"/".join(names)} folder in {root}: the data must be an '
        f'ImageFolder tree, {root}/train/<class>/<images> and '
        f'{root}/val/<class>/<images>')


def build_datasets(root: str):
    if not osp.isdir(root):
        raise FileNotFoundError(f'data folder not found: {root}')
    train_dir = find_split(root, ('train',))
    val_dir = find_split(root, VAL_FOLDERS)
    train = create_dataset('', root=train_dir, search_split=False,
                           is_training=True)
    val = create_dataset('', root=val_dir, search_split=False)
    train_classes = train.reader.class_to_idx
    val_classes = val.reader.class_to_idx
    if train_classes != val_classes:
        only_train = sorted(set(train_classes) - set(val_classes))
        only_val = sorted(set(val_classes) - set(train_classes))
        raise ValueError(
            f'the train and val folders of {root} have different classes: '
            f'only in train {only_train[:5]}, only in val {only_val[:5]}')
    if len(train) == 0 or len(val) == 0:
        raise ValueError(f'{root}: no images found in train/ or val/')
    classes = sorted(train_classes, key=train_classes.get)
    return train, val, classes


def build_mixup(recipe: Recipe, num_classes: int) -> Optional[Mixup]:
    if recipe.mixup <= 0 and recipe.cutmix <= 0:
        return None
    return Mixup(mixup_alpha=recipe.mixup, cutmix_alpha=recipe.cutmix,
                 prob=recipe.mixup_prob, switch_prob=recipe.mixup_switch_prob,
                 mode=recipe.mixup_mode, label_smoothing=recipe.smoothing,
                 num_classes=num_classes)


def build_loaders(root: str, recipe: Recipe, device: torch.device,
                  distributed: bool,
                  workers: Optional[int] = None) -> Loaders:
    """Train and val loaders of the tree at ``root``.

    On a GPU timm's prefetcher normalizes the batches on the device; on a
    CPU the transforms do it.
    """
    train_set, val_set, classes = build_datasets(root)
    mixup = build_mixup(recipe, len(classes))
    if mixup is not None and recipe.batch_size % 2:
        raise ValueError(f'Mixup/CutMix mixes pairs of images: the batch '
                         f'size must be even, got {recipe.batch_size}')
    if len(train_set) < recipe.batch_size * _world(distributed):
        raise ValueError(
            f'{root}/train has {len(train_set)} images, fewer than one '
            f'batch ({recipe.batch_size} per process x '
            f'{_world(distributed)} processes); use a smaller --batch-size')
    workers = recipe.workers if workers is None else workers
    common = dict(input_size=(3, recipe.img_size, recipe.img_size),
                  mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD,
                  num_workers=workers, distributed=distributed,
                  crop_pct=recipe.crop_pct, device=device,
                  use_prefetcher=device.type == 'cuda',
                  pin_memory=device.type == 'cuda')
    train = create_loader(
        train_set, batch_size=recipe.batch_size, is_training=True,
        scale=recipe.scale, ratio=recipe.ratio, hflip=recipe.hflip,
        vflip=recipe.vflip, color_jitter=recipe.color_jitter,
        auto_augment=recipe.auto_augment,
        interpolation=recipe.train_interpolation, re_prob=recipe.re_prob,
        re_mode=recipe.re_mode, re_count=recipe.re_count, **common)
    val = create_loader(val_set, batch_size=recipe.batch_size,
                        is_training=False,
                        interpolation=recipe.interpolation, **common)
    return Loaders(train=train, val=val, classes=classes, mixup=mixup,
                   num_val=len(val_set))


def _world(distributed: bool) -> int:
    if distributed and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1
