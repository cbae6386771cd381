"""Shared fixtures: the reference checkpoints and small random models."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

FIXTURES = os.path.join(os.path.dirname(__file__), 'fixtures')
TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), 'tools')

# A reduced PosMLP small enough for per-window reference loops on CPU.
TINY_ARCH = dict(embed_dims=(16, 32, 64, 128), depths=(1, 1, 2, 1),
                 mlp_ratio=(4, 4, 4, 2), gamma=(4, 8, 16, 32),
                 window_size=(14, 14, 14, 7))


def fixture_path(name: str) -> str:
    return os.path.join(FIXTURES, name)


def load_tool(name: str):
    """tools/<name>.py as a module, to call its functions in this process
    (the tools are scripts, not an importable package)."""
    spec = importlib.util.spec_from_file_location(
        f'posmlp_tool_{name}', os.path.join(TOOLS, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expected(gate: str) -> dict:
    return torch.load(fixture_path(f'tiny_{gate}_expected.pth'),
                      weights_only=True)


def fixture_arch(gate: str) -> dict:
    arch = expected(gate)['arch']
    return {k: arch[k] for k in ('embed_dims', 'depths', 'mlp_ratio',
                                 'gamma', 'window_size')}


def randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give every parameter and BN statistic non-trivial values.

    At initialization LRPE tables and position biases are zero, which would
    make tests of the mixing pass vacuously.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith('attention_spreads'):
                p.add_(0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith('attention_centers'):
                p.copy_(1.5 * torch.randn(p.shape, generator=gen))
            elif name.endswith(('relative_position_bias_table',
                                'token_proj_n_weight')):
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))
            elif name.endswith('token_proj_n_bias'):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.dim() == 1 and name.endswith('weight'):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.add_(0.02 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith('running_mean'):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))
            elif name.endswith('running_var'):
                b.copy_(1 + 0.1 * torch.rand(b.shape, generator=gen))
    return model


def pytest_addoption(parser):
    parser.addoption('--slow', action='store_true',
                     help='also run the tests marked slow (each tens of '
                          'minutes on a 2-core CPU)')


def pytest_configure(config):
    # pytest-xdist's workers (make test) share the cores: each takes its
    # share of intra-op threads, rather than all of them each
    workers = getattr(config, 'workerinput', {}).get('workercount')
    if workers:
        torch.set_num_threads(max(1, torch.get_num_threads() // workers))


def pytest_collection_modifyitems(config, items):
    if config.getoption('--slow'):
        return
    skip = pytest.mark.skip(reason='slow: run with pytest --slow')
    for item in items:
        if 'slow' in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def one_thread():
    """Tiny tensors: intra-op threads only add synchronization, which on a
    busy machine costs more than the work itself."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
