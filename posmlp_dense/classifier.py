"""The ImageNet classifier: backbone, final LayerNorm, average pool, head."""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from timm.layers import trunc_normal_

from .backbone import PosMLP


class PosMLPClassifier(PosMLP):
    """PosMLP with the published classification head.

    State-dict names match the released checkpoints: the backbone's keys
    plus ``norm`` (final LayerNorm) and ``head``.
    """

    def __init__(self, arch: Union[str, dict] = 't', gate: str = 'gqpe',
                 num_classes: int = 1000, drop_rate: float = 0.0, **kwargs):
        kwargs.setdefault('out_norm', False)
        super().__init__(arch, gate, **kwargs)
        dim = self.embed_dims[-1]
        self.num_classes = num_classes
        self.num_features = dim
        self.drop_rate = drop_rate
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes) if num_classes > 0 \
            else nn.Identity()
        if num_classes > 0:
            trunc_normal_(self.head.weight, std=0.02, a=-2.0, b=2.0)
            nn.init.zeros_(self.head.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The final normalized map, (B, C, H/32, W/32)."""
        y = self.norm(self.forward_levels(x)[-1])
        return y.permute(0, 3, 1, 2)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False):
        x = x.mean(dim=(2, 3))
        if self.drop_rate > 0:
            x = nn.functional.dropout(x, self.drop_rate, self.training)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    # timm's feature-extraction protocol (features_only=True)
    def forward_intermediates(
            self, x: torch.Tensor,
            indices: Optional[Union[int, Sequence[int]]] = None,
            norm: bool = False, stop_early: bool = False,
            output_fmt: str = 'NCHW', intermediates_only: bool = False,
    ) -> Union[List[torch.Tensor], Tuple[torch.Tensor, List[torch.Tensor]]]:
        if output_fmt not in ('NCHW', 'NHWC'):
            raise ValueError(f'output_fmt must be NCHW or NHWC, got '
                             f'{output_fmt!r}')
        num = len(self.levels)
        if indices is None:
            take = list(range(num))
        elif isinstance(indices, int):  # the last n levels
            take = list(range(num - indices, num))
        else:
            take = [i % num for i in indices]
        maps = self.forward_levels(x)
        feats = [maps[i] if output_fmt == 'NHWC'
                 else maps[i].permute(0, 3, 1, 2) for i in take]
        if intermediates_only:
            return feats
        final = self.norm(maps[-1]).permute(0, 3, 1, 2)
        return final, feats

    def prune_intermediate_layers(self, indices=1, prune_norm: bool = False,
                                  prune_head: bool = True):
        num = len(self.levels)
        take = list(range(num - indices, num)) if isinstance(indices, int) \
            else [i % num for i in indices]
        if prune_head:
            self.head = nn.Identity()
        if prune_norm:
            self.norm = nn.Identity()
        return take


def create_classifier(arch: Union[str, dict] = 't', gate: str = 'gqpe',
                      num_classes: int = 1000, **kwargs) -> PosMLPClassifier:
    """Build the ImageNet classifier (e.g. to load a released checkpoint)."""
    return PosMLPClassifier(arch, gate, num_classes=num_classes, **kwargs)
