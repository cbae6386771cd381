"""mmengine's optimizer constructor, with parameter groups that
torch.compile can trace.

With a ``paramwise_cfg``, mmengine's ``DefaultOptimWrapperConstructor``
hands the optimizer its parameter groups inside a config, which turns each
group into a ``ConfigDict``. The optimizer keeps them as they are, and
dynamo, tracing the optimizer step of a compiled ``train_step`` (a config's
``compile=True``), stops at them: ``InternalTorchDynamoError:
'UserDefinedDictVariable' object has no attribute 'items'`` (torch 2.14.1,
``_dynamo/variables/optimizer.py``). This constructor builds the same
optimizer and makes each group a plain ``dict`` with the same entries.
"""
from __future__ import annotations

from mmengine.optim import DefaultOptimWrapperConstructor
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class PlainGroupsOptimWrapperConstructor(DefaultOptimWrapperConstructor):

    def __call__(self, model):
        optim_wrapper = super().__call__(model)
        groups = optim_wrapper.optimizer.param_groups
        groups[:] = [dict(group) for group in groups]
        return optim_wrapper
