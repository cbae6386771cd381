"""Backbone options a dense-prediction user expects (as mmdet's Swin has)."""
from __future__ import annotations

import pytest
import torch

from posmlp_dense import PosMLP

from conftest import TINY_ARCH, randomize_


def _loss(outs):
    return sum(o.square().mean() for o in outs)


@pytest.mark.parametrize('frozen', [0, 1, 2, 4])
def test_frozen_stages_get_no_gradient_and_stay_frozen(frozen):
    model = PosMLP(TINY_ARCH, frozen_stages=frozen, drop_path_rate=0.0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert model.train() is model  # returns self (mmdet's Swin returns None)
    optimizer = torch.optim.SGD(
        [p for p in model.parameters() if p.requires_grad] or
        [torch.zeros(1, requires_grad=True)], lr=0.1)
    loss = _loss(model(torch.randn(2, 3, 64, 64)))
    if loss.requires_grad:  # everything frozen: nothing to train
        loss.backward()
        optimizer.step()
    frozen_prefixes = ['patch_embed.'] + [f'levels.{i}.' for i in
                                          range(frozen)] + [
        f'norm{i}.' for i in range(frozen)]
    after = model.state_dict()
    for name, p in model.named_parameters():
        is_frozen = name.startswith(tuple(frozen_prefixes))
        assert p.requires_grad is not is_frozen, name
        if is_frozen:
            assert p.grad is None
            assert torch.equal(after[name], before[name]), name
        else:
            assert p.grad is not None, name
    # BatchNorm statistics of the frozen stem do not move either
    assert torch.equal(after['patch_embed.norms.0.running_mean'],
                       before['patch_embed.norms.0.running_mean'])
    assert not model.patch_embed.training


def test_unfrozen_model_updates_stem_statistics():
    model = PosMLP(TINY_ARCH).train()
    before = model.patch_embed.norms[0].running_mean.clone()
    model(torch.randn(2, 3, 64, 64))
    assert not torch.equal(before, model.patch_embed.norms[0].running_mean)


def test_norm_eval_keeps_batchnorm_in_eval_mode():
    model = PosMLP(TINY_ARCH, norm_eval=True).train()
    assert model.training
    bns = [m for m in model.modules()
           if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and not any(bn.training for bn in bns)
    before = bns[0].running_var.clone()
    model(torch.randn(2, 3, 64, 64))
    assert torch.equal(before, bns[0].running_var)


@pytest.mark.parametrize('gate', ['gqpe', 'lrpe'])
def test_gradient_checkpointing_gives_the_same_gradients(gate):
    torch.manual_seed(0)
    plain = randomize_(PosMLP(TINY_ARCH, gate=gate, drop_path_rate=0.2))
    ckpt = PosMLP(TINY_ARCH, gate=gate, drop_path_rate=0.2, with_cp=True)
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 75, 90)
    for model in (plain, ckpt):
        torch.manual_seed(1)  # same drop-path draws
        model.train()
        _loss(model(x)).backward()
    grads = dict(ckpt.named_parameters())
    for name, p in plain.named_parameters():
        assert torch.allclose(p.grad, grads[name].grad, atol=1e-6,
                              rtol=1e-5), name


def test_out_indices_and_out_norm():
    x = torch.randn(1, 3, 96, 128)
    model = PosMLP(TINY_ARCH, out_indices=(1, 3)).eval()
    assert [k for k in model.state_dict() if k.startswith('norm')] == [
        'norm1.weight', 'norm1.bias', 'norm3.weight', 'norm3.bias']
    with torch.no_grad():
        outs = model(x)
    assert [tuple(o.shape) for o in outs] == [(1, 32, 12, 16),
                                              (1, 128, 3, 4)]
    assert all(o.is_contiguous() for o in outs)
    raw = PosMLP(TINY_ARCH, out_indices=(1, 3), out_norm=False).eval()
    raw.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():
        maps = raw.forward_intermediates(x, output_fmt='NHWC',
            intermediates_only=True)
        normed = model.norm1(maps[1]).permute(0, 3, 1, 2)
    assert torch.allclose(normed, outs[0], atol=1e-6)


def test_drop_path_is_per_sample():
    model = PosMLP(dict(TINY_ARCH, depths=(6, 1, 1, 1)),
                   drop_path_rate=0.9).train()
    level = model.levels[0]
    x = torch.randn(4, 3, 64, 64)
    stem = model.patch_embed(x)
    block = level.encoder[5]
    assert block.drop_path > 0.5
    # a dropped sample's block output equals its input exactly
    tokens_in = {}

    def keep_input(module, args):
        tokens_in['x'] = args[0].detach().clone()

    def check_output(module, args, out):
        # (B, H, W, C) maps: a sample is dropped where all its values pass
        same = (out.detach() == tokens_in['x'])
        tokens_in['dropped'] = same.flatten(1).all(dim=1)
    block.register_forward_pre_hook(keep_input)
    block.register_forward_hook(check_output)
    torch.manual_seed(3)
    level(stem)
    dropped = tokens_in['dropped']
    assert dropped.any() and not dropped.all()  # some samples, not all
