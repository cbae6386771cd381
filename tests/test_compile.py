"""The backbone under torch.compile gives the eager results."""
from __future__ import annotations

import torch

from posmlp_dense import PosMLP

from conftest import TINY_ARCH, randomize_


def test_torch_compile_matches_eager_at_partial_windows():
    model = randomize_(PosMLP(TINY_ARCH, gate='lrpe')).eval()
    x = torch.randn(1, 3, 97, 161)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model)(x)
    for a, b in zip(eager, compiled):
        assert a.shape == b.shape
        assert (a - b).abs().max() <= 1e-5
