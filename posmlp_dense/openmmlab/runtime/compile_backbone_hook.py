"""torch.compile for a detector's or segmentor's backbone alone.

mmengine's ``compile`` compiles the whole ``train_step``, and dynamo puts
the backbone in one graph with the neck. Inductor lowers the backward of
the neck's aten convolutions with strides fixed to integers
(``convolution_backward_lowering``, ``guard_int_seq``; on a CPU its
channels-last layout does the same), so that graph compiles again at each
new input size, up to ``torch._dynamo.config.recompile_limit``, and then
runs eagerly. The backbone itself compiles once for every size
(``tests/test_compile.py``). This hook compiles it by itself and leaves
the rest eager::

    custom_hooks = [dict(type='CompileBackboneHook', dynamic=True)]

Its arguments are torch.compile's. The backbone is compiled in place
(``nn.Module.compile``): its parameters and the checkpoint keep their
names. Registered when ``posmlp_dense.openmmlab.runtime`` is imported.
"""
from __future__ import annotations

from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


@HOOKS.register_module()
class CompileBackboneHook(Hook):
    """Compiles ``model.backbone`` with ``torch.compile(**compile_cfg)``
    before the run (training, validation or testing)."""

    def __init__(self, **compile_cfg):
        self.compile_cfg = compile_cfg

    def before_run(self, runner) -> None:
        if runner.cfg.get('compile'):
            raise ValueError(
                "CompileBackboneHook and the config's `compile` both compile "
                'the backbone: keep one of them')
        model = runner.model.module if is_model_wrapper(runner.model) \
            else runner.model
        backbone = getattr(model, 'backbone', None)
        if not hasattr(backbone, 'compile'):
            raise ValueError(f'{type(model).__name__} has no backbone module '
                             'for CompileBackboneHook to compile')
        backbone.compile(**self.compile_cfg)
