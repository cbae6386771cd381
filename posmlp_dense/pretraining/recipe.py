"""The published ImageNet-1k training recipes of PosMLP.

Numbers from the authors' timm (0.4.5) configs, ``config/PosMLP_T.yaml`` and
``config/PosMLP_S.yaml`` in https://github.com/Zhicaiwww/PosMLP. The two
differ only in the per-GPU batch size (128 / 60), the learning rate
(2e-3 / 1e-3) and the cooldown epochs (10 / 0). No PosMLP-B recipe is
published; ``posmlp_b`` uses PosMLP-S's.

One thing of the recipe is not reproduced: the authors' blocks apply dropout
(``drop``, p = 0.02333) after every block's output projection as well as
before the head; ``posmlp_dense``'s blocks have no dropout, so it is applied
before the head only.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass
class Recipe:
    """Every setting of a pretraining run that the command line can change.

    Batch size is per process (per GPU), as in the authors' configs.
    """
    # schedule (epochs; timm's cosine scheduler, stepped once per epoch)
    epochs: int = 300
    warmup_epochs: int = 10
    cooldown_epochs: int = 10
    sched_on_updates: bool = False
    lr: float = 2e-3
    warmup_lr: float = 1e-5
    min_lr: float = 1e-6
    # optimizer: AdamW, no weight decay on biases and 1-D parameters
    opt: str = 'adamw'
    opt_eps: float = 1e-5
    weight_decay: float = 0.067
    clip_grad: Optional[float] = 1.0
    clip_mode: str = 'norm'
    batch_size: int = 128
    # model regularization
    drop_rate: float = 0.02333
    drop_path_rate: float = 0.1
    # data: timm's ImageNet train transform
    img_size: int = 224
    crop_pct: float = 0.9
    scale: Tuple[float, float] = (0.08, 1.0)
    ratio: Tuple[float, float] = (0.67, 1.5)
    hflip: float = 0.5
    vflip: float = 0.0
    color_jitter: float = 0.4
    auto_augment: Optional[str] = 'rand-m6-n3-mstd1.0-inc1'
    train_interpolation: str = 'random'
    interpolation: str = 'bicubic'
    re_prob: float = 0.0
    re_mode: str = 'pixel'
    re_count: int = 3
    # Mixup / CutMix and label smoothing
    mixup: float = 0.5
    cutmix: float = 1.0
    mixup_prob: float = 1.0
    mixup_switch_prob: float = 0.5
    mixup_mode: str = 'batch'
    smoothing: float = 0.1
    # EMA of the weights (the released checkpoints' state_dict_ema)
    model_ema: bool = True
    model_ema_decay: float = 0.99992
    model_ema_warmup: bool = False
    # mixed precision (fp16 with loss scaling, on GPUs)
    amp: bool = True
    seed: int = 42
    workers: int = 8

    def replace(self, **changes) -> 'Recipe':
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise KeyError(f'unknown recipe settings {sorted(unknown)}')
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


POSMLP_T = Recipe()
POSMLP_S = Recipe(batch_size=60, lr=1e-3, cooldown_epochs=0)
RECIPES = {'posmlp_t': POSMLP_T, 'posmlp_s': POSMLP_S,
           'posmlp_b': POSMLP_S}

# Not published: a CPU run of minutes on the built-in shape classes
# (posmlp_dense.data.shape_classes, 64 x 64). PosMLP-T's optimizer and
# schedule over 25 short epochs (stepped per update, EMA with warmup), and
# none of the augmentation and regularization that only pays off over
# hundreds of ImageNet epochs. The whole image, never a crop: a crop that
# cuts into a circle gives it straight edges and corners, the very cue
# that tells it from a square.
SHAPES_DEMO = POSMLP_T.replace(
    epochs=25, warmup_epochs=2, cooldown_epochs=0, sched_on_updates=True,
    batch_size=32, img_size=64, crop_pct=1.0, scale=(1.0, 1.0),
    ratio=(1.0, 1.0), auto_augment=None, mixup=0.0, cutmix=0.0,
    drop_path_rate=0.0, model_ema_warmup=True, workers=1)


def recipe_for(model: str, name: str = 'published') -> Recipe:
    """``'published'``: the recipe of ``model``; ``'shapes-demo'``: the
    short CPU recipe for the built-in shapes."""
    if name == 'published':
        return published_recipe(model)
    if name == 'shapes-demo':
        return SHAPES_DEMO
    raise KeyError(f"unknown recipe {name!r}; expected 'published' or "
                   f"'shapes-demo'")


def published_recipe(model: str) -> Recipe:
    """The recipe of ``posmlp_t`` / ``posmlp_s`` (``posmlp_b``: S's)."""
    if model not in RECIPES:
        raise KeyError(f'no published recipe for {model!r}; known: '
                       f'{sorted(RECIPES)}')
    return RECIPES[model]
