"""Every module the backbone registers is reachable the way tools reach
modules: hooks fire and take effect, ``torch.nn.utils.prune`` follows
``weight_orig``, and an adapter-wrapped Linear trains (module_calls.py).
Without any of these the fused pass runs, with its outputs unchanged."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

from posmlp_dense import PosMLP

from conftest import TINY_ARCH, randomize_

GATES = ['gqpe', 'lrpe', 'sgu']
# partial windows at every level (the tiny arch's windows are 14, 14, 14, 7)
SIZE = (1, 3, 72, 100)


def _model(gate: str, **kwargs) -> PosMLP:
    return randomize_(PosMLP(TINY_ARCH, gate=gate, drop_path_rate=0.0,
                             **kwargs))


def _callable_modules(model: nn.Module):
    """Every registered module that has a forward of its own (ModuleLists
    only hold modules)."""
    return [(name, m) for name, m in model.named_modules()
            if name and not isinstance(m, nn.ModuleList)]


def _outputs(model, x):
    return [o.detach() for o in model(x)]


def _differs(outs, refs) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(outs, refs))


@pytest.mark.parametrize('gate', GATES)
@pytest.mark.parametrize('training', [False, True])
def test_every_module_runs_its_hooks(gate, training, one_thread):
    model = _model(gate).train(training)
    calls = {}
    handles = []
    for name, module in _callable_modules(model):
        calls[name] = [0, 0]
        handles.append(module.register_forward_pre_hook(
            lambda m, args, name=name: calls[name].__setitem__(
                0, calls[name][0] + 1)))
        handles.append(module.register_forward_hook(
            lambda m, args, out, name=name: calls[name].__setitem__(
                1, calls[name][1] + 1)))
    with torch.set_grad_enabled(training):
        model(torch.randn(*SIZE))
    silent = sorted(name for name, (pre, post) in calls.items()
                    if not (pre and post))
    assert not silent, f'hooks never fired on {silent}'
    for handle in handles:
        handle.remove()


def _perturb(output):
    """A hook's replacement output: the first tensor scaled."""
    if isinstance(output, tuple):
        return (output[0] * 1.5,) + output[1:]
    return output * 1.5


@pytest.mark.parametrize('gate', GATES)
def test_an_output_changing_hook_takes_effect_on_every_module(gate,
                                                              one_thread):
    model = _model(gate).eval()
    x = torch.randn(*SIZE)
    with torch.no_grad():
        ref = _outputs(model, x)
        ignored = []
        for name, module in _callable_modules(model):
            handle = module.register_forward_hook(
                lambda m, args, out: _perturb(out))
            if not _differs(_outputs(model, x), ref):
                ignored.append(name)
            handle.remove()
        # and with every hook gone, the fused pass's outputs come back
        assert not _differs(_outputs(model, x), ref)
    assert not ignored, f'a hook changing the output had no effect on ' \
        f'{ignored}'


def _weighted_modules(model):
    return [(name, m) for name, m in model.named_modules()
            if isinstance(m, (nn.Linear, nn.Conv2d))]


@pytest.mark.parametrize('gate', GATES)
def test_prune_follows_weight_orig(gate, one_thread):
    """After pruning, an update of ``weight_orig`` (an optimizer step)
    changes the output exactly as the masked weight says."""
    model = _model(gate).eval()
    plain = copy.deepcopy(model)
    names = [name for name, _ in _weighted_modules(model)]
    for _, module in _weighted_modules(model):
        prune.l1_unstructured(module, 'weight', amount=0.3)
    with torch.no_grad():
        for _, module in _weighted_modules(model):
            module.weight_orig.mul_(-2.0)
    x = torch.randn(*SIZE)
    # the same model with the masked weights written in, no pruning
    with torch.no_grad():
        for name in names:
            pruned, target = model.get_submodule(name), \
                plain.get_submodule(name)
            target.weight.copy_(pruned.weight_orig * pruned.weight_mask)
            target.bias.copy_(pruned.bias)
        outs, refs = _outputs(model, x), _outputs(plain, x)
    for out, ref in zip(outs, refs):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    # and the gradient reaches weight_orig, masked
    model.train()
    sum(o.square().mean() for o in model(x)).backward()
    for name in names:
        module = model.get_submodule(name)
        assert module.weight_orig.grad is not None, name
        assert module.weight_orig.grad.abs().sum() > 0, name
        assert not module.weight_orig.grad[module.weight_mask == 0].any(), \
            name


class LowRankAdapter(nn.Module):
    """A Linear plus a trainable low-rank update, with the forward
    contract of peft's LoRA layer: ``base(x) + up(down(x))``."""

    def __init__(self, base: nn.Linear, rank: int = 2):
        super().__init__()
        self.base = base
        self.down = nn.Linear(base.in_features, rank, bias=False)
        self.up = nn.Linear(rank, base.out_features, bias=False)
        nn.init.normal_(self.up.weight, std=0.1)

    def forward(self, x):
        return self.base(x) + self.up(self.down(x))


def _wrap_linears(model: nn.Module) -> list:
    wrapped = []
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.Linear) and not name.endswith(
                ('.down', '.up')):
            parent, _, attr = name.rpartition('.')
            adapter = LowRankAdapter(module)
            setattr(model.get_submodule(parent), attr, adapter)
            wrapped.append(adapter)
    return wrapped


@pytest.mark.parametrize('gate', GATES)
def test_an_adapter_wrapped_linear_trains(gate, one_thread):
    model = _model(gate).train()
    x = torch.randn(*SIZE)
    ref = _outputs(copy.deepcopy(model).eval(), x)
    model.requires_grad_(False)
    adapters = _wrap_linears(model)
    assert len(adapters) >= 10
    for adapter in adapters:
        adapter.down.requires_grad_(True)
        adapter.up.requires_grad_(True)
    trainable = [p for a in adapters for p in (a.down.weight, a.up.weight)]
    model.eval()
    before = _outputs(model, x)
    assert _differs(before, ref), 'the adapters changed nothing'
    model.train()
    optimizer = torch.optim.SGD(trainable, lr=0.1)
    sum(o.square().mean() for o in model(x)).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0
               for p in trainable)
    optimizer.step()
    model.eval()
    assert _differs(_outputs(model, x), before), 'a step changed nothing'


@pytest.mark.parametrize('gate', GATES)
def test_the_module_path_computes_the_fused_pass(gate, one_thread):
    """A do-nothing hook on every block sends it through its modules;
    outputs and gradients stay within float32 rounding of the fused
    pass (eval, and training with the lean Function)."""
    model = _model(gate)
    hooked = copy.deepcopy(model)
    for name, module in hooked.named_modules():
        if name.endswith('proj_c_e'):
            module.register_forward_hook(lambda m, args, out: None)
    x = torch.randn(*SIZE)
    for training in (False, True):
        results = []
        for net in (model, hooked):
            net.train(training).zero_grad()
            outs = net(x)
            sum(o.square().mean() for o in outs).backward()
            results.append((outs, [p.grad for p in net.parameters()]))
        (outs, grads), (ref_outs, ref_grads) = results[1], results[0]
        for out, ref in zip(outs, ref_outs):
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
        for grad, ref in zip(grads, ref_grads):
            torch.testing.assert_close(grad, ref, rtol=1e-4, atol=1e-7)
