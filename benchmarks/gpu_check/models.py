"""The models the check runs: PosMLP through its public API, and timm's
Swin-T and ResNet-50 as the baselines (timm needs no OpenMMLab)."""
from __future__ import annotations

from typing import Dict, List

import torch
import torch.nn.functional as F
from torch import nn

from posmlp_dense import PosMLP

# Stochastic depth of PosMLP-T and Swin-T in their detection configs (as
# the benchmark builds them).
DROP_PATH = 0.2
LABELS = {'swin_t': 'Swin-T (timm)', 'resnet50': 'ResNet-50 (timm)'}


def perturb_(model: nn.Module, seed: int) -> nn.Module:
    """Seeded noise on every parameter and batch-norm statistic: tables
    that start at zero (LRPE's biases) would let a comparison pass
    vacuously."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if p.dim() == 1 and name.endswith('weight'):
                p.copy_(1 + 0.1 * noise)
            else:
                p.add_(0.02 * noise.to(p.dtype))
        for name, b in model.named_buffers():
            if name.endswith('running_mean'):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
            elif name.endswith('running_var'):
                b.copy_(1 + 0.1 * torch.rand(b.shape, generator=gen))
    return model


def posmlp(arch, gate: str = 'gqpe', drop_path_rate: float = 0.0,
           seed: int = 0) -> PosMLP:
    torch.manual_seed(seed)
    return PosMLP(arch, gate=gate, out_indices=(0, 1, 2, 3),
                  drop_path_rate=drop_path_rate)


class TimmSwinT(nn.Module):
    """timm's Swin-T at any input size, NCHW maps out as mmdet's Swin:
    the input padded at the bottom and right to whole patches first, as
    mmdet's ``AdaptivePadding`` does (timm's patch embedding refuses
    1333)."""
    patch = 4

    def __init__(self, drop_path_rate: float = DROP_PATH):
        super().__init__()
        import timm
        self.body = timm.create_model(
            'swin_tiny_patch4_window7_224', pretrained=False,
            features_only=True, strict_img_size=False,
            drop_path_rate=drop_path_rate)
        self.channels_last = str(getattr(self.body, 'output_fmt',
                                         'NCHW')).endswith('NHWC')

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        h, w = x.shape[-2:]
        x = F.pad(x, (0, -w % self.patch, 0, -h % self.patch))
        outs = self.body(x)
        if self.channels_last:
            outs = [o.permute(0, 3, 1, 2).contiguous() for o in outs]
        return list(outs)


def timm_resnet50() -> nn.Module:
    import timm
    return timm.create_model('resnet50', pretrained=False,
                             features_only=True, out_indices=(1, 2, 3, 4))


def speed_models(arch, seed: int = 0) -> Dict[str, nn.Module]:
    """PosMLP (``arch``), Swin-T and ResNet-50 with random weights, in the
    benchmark's names (``benchmarks.models``)."""
    models = {'posmlp_t': posmlp(arch, drop_path_rate=DROP_PATH, seed=seed)}
    torch.manual_seed(seed)
    models['swin_t'] = TimmSwinT()
    torch.manual_seed(seed)
    models['resnet50'] = timm_resnet50()
    for m in models.values():
        m.eval()
    return models

