"""Train a small PosMLP briefly on a task that needs positions.

    python tools/train_posmap_demo.py --gate gqpe \
        --out work_dirs/posmap_demo/gqpe.pth

This makes the checkpoint that ``docs/positional_encoding.md`` draws its
pictures from. It needs nothing but torch and a CPU: the default 200 steps
took 11 to 15 minutes on a busy 2-core machine (about 1.3 s a step when the
cores are free).

The task is dense regression on synthetic images: at every token of every
level the backbone's output, through a 1x1 head, must reproduce the image's
brightness (pooled to the level's stride) as seen from a few *other*
places: ``--shift`` tokens up, right, down and left of the token, and a
blurred copy around it. A token can only do that if its token mixing knows
where its neighbours are, so the positional gating has to learn where to
look (the four shifts) and how far (the blur).

The checkpoint is written like an mmseg training checkpoint (weights under
``backbone.`` and ``decode_head.``, plus ``meta``), so the visualization
tool's prefix detection is exercised too. Positional parameters get a
larger learning rate (``--pos-lr-mult``) so that they move within a few
hundred steps.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

try:
    import posmlp_dense  # noqa: F401
except ImportError:  # run from a checkout without installing
    sys.path.insert(0, os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))

from posmlp_dense import PosMLP  # noqa: E402
from posmlp_dense.analysis.posmap import normalize_images, synthetic_images  # noqa

# widths of a small model; the published T/S/B gamma and windows
DEMO_ARCH = dict(embed_dims=(32, 64, 128, 256), depths=(2, 2, 2, 2),
                 mlp_ratio=(4, 4, 4, 2), gamma=(8, 16, 32, 64),
                 window_size=(14, 14, 14, 7))
POS_PARAMS = ('attention_centers', 'attention_spreads',
              'window_relative_position_bias_table', 'token_proj_n_bias')


def targets(images: torch.Tensor, stride: int, shift: int,
            blur: float) -> torch.Tensor:
    """(B, 5, h, w): brightness `shift` tokens up/right/down/left; blurred.

    Channel 0 at token (y, x) is the pooled brightness at (y - shift, x)
    (the token ``shift`` rows *above*), 1 at (y, x + shift) (right),
    2 at (y + shift, x) (below), 3 at (y, x - shift) (left); 4 is a Gaussian
    blur of width ``blur`` tokens. Outside the map counts as 0.
    """
    gray = images.mean(dim=1, keepdim=True)
    h, w = math.ceil(images.shape[-2] / stride), math.ceil(
        images.shape[-1] / stride)
    pooled = F.adaptive_avg_pool2d(gray, (h, w))
    pooled = pooled - pooled.mean(dim=(2, 3), keepdim=True)
    s = shift
    padded = F.pad(pooled, (s, s, s, s))
    up = padded[:, :, 0:h, s:s + w]
    right = padded[:, :, s:s + h, 2 * s:2 * s + w]
    down = padded[:, :, 2 * s:2 * s + h, s:s + w]
    left = padded[:, :, s:s + h, 0:w]
    radius = int(math.ceil(3 * blur))
    taps = torch.arange(-radius, radius + 1, dtype=images.dtype)
    kernel = torch.exp(-0.5 * (taps / blur) ** 2)
    kernel = kernel / kernel.sum()
    blurred = F.conv2d(F.pad(pooled, (radius, radius, 0, 0)),
                       kernel.view(1, 1, 1, -1))
    blurred = F.conv2d(F.pad(blurred, (0, 0, radius, radius)),
                       kernel.view(1, 1, -1, 1))
    return torch.cat([up, right, down, left, blurred], dim=1)


class DemoModel(nn.Module):
    def __init__(self, gate: str):
        super().__init__()
        self.backbone = PosMLP(DEMO_ARCH, gate=gate, drop_path_rate=0.0)
        self.decode_head = nn.ModuleList(
            nn.Conv2d(d, 5, 1) for d in DEMO_ARCH['embed_dims'])

    def forward(self, x):
        return [head(f) for head, f in zip(self.decode_head,
                                           self.backbone(x))]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--gate', choices=('gqpe', 'lrpe', 'sgu'), default='gqpe')
    p.add_argument('--out', required=True, help='checkpoint to write (.pth)')
    p.add_argument('--steps', type=int, default=200)
    p.add_argument('--batch', type=int, default=8)
    p.add_argument('--size', type=int, default=224)
    p.add_argument('--lr', type=float, default=2e-3)
    p.add_argument('--pos-lr-mult', type=float, default=20.0)
    p.add_argument('--shift', type=int, nargs=4, default=(3, 2, 2, 1),
                   metavar=('L0', 'L1', 'L2', 'L3'),
                   help='displacement, in tokens, of the targets per level')
    p.add_argument('--blur', type=float, default=2.0,
                   help='blur width of the fifth target, in tokens')
    p.add_argument('--pool', type=int, default=192,
                   help='number of synthetic images to draw batches from')
    p.add_argument('--seed', type=int, default=0)
    args = p.parse_args(argv)
    if os.path.exists(args.out):
        p.error(f'{args.out} exists; remove it or choose another --out')

    torch.manual_seed(args.seed)
    pool = synthetic_images(args.pool, (args.size + 32, args.size + 32),
                            seed=args.seed)
    model = DemoModel(args.gate)
    pos = [p_ for n, p_ in model.named_parameters() if n.endswith(POS_PARAMS)]
    ids = {id(p_) for p_ in pos}
    rest = [p_ for p_ in model.parameters() if id(p_) not in ids]
    opt = torch.optim.AdamW([
        dict(params=rest, weight_decay=0.05),
        dict(params=pos, lr=args.lr * args.pos_lr_mult, weight_decay=0.0)],
        lr=args.lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=[args.lr, args.lr * args.pos_lr_mult],
        total_steps=args.steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(args.seed + 1)
    strides = [4 * 2 ** i for i in range(len(DEMO_ARCH['embed_dims']))]
    start = time.time()
    model.train()
    for step in range(1, args.steps + 1):
        idx = torch.randint(0, args.pool, (args.batch,), generator=gen)
        oy, ox = torch.randint(0, 33, (2,), generator=gen).tolist()
        images = pool[idx, :, oy:oy + args.size, ox:ox + args.size]
        if torch.rand(1, generator=gen) < 0.5:
            images = images.transpose(2, 3)     # more orientations
        outs = model(normalize_images(images))
        loss = 0.0
        for out, stride, shift in zip(outs, strides, args.shift):
            tgt = targets(images, stride, shift, args.blur)
            tgt = tgt[..., :out.shape[-2], :out.shape[-1]]
            loss = loss + F.mse_loss(out, tgt) / tgt.var().clamp(min=1e-6)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if step == 1 or step % 25 == 0 or step == args.steps:
            print(f'step {step}/{args.steps}  loss {loss.item():.4f}  '
                  f'({time.time() - start:.0f} s)', flush=True)

    state = {f'backbone.{k}': v for k, v in
             model.backbone.state_dict().items()}
    state.update({f'decode_head.{k}': v for k, v in
                  model.decode_head.state_dict().items()})
    meta = dict(task='posmap demo: shifted and blurred brightness',
                gate=args.gate, steps=args.steps, shift=list(args.shift),
                blur=args.blur, seed=args.seed, size=args.size)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + '.partial'
    torch.save(dict(meta=meta, state_dict=state), tmp)
    os.replace(tmp, args.out)
    print(f'wrote {args.out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
