"""Distributed data parallel on CPU (gloo) for mmengine's runner.

mmengine passes ``device_ids=[LOCAL_RANK]`` to every DDP wrapper, which
torch rejects for a model on the CPU. This wrapper drops ``device_ids`` when
the model's parameters live on the CPU; on GPUs it is mmengine's own.
"""
from __future__ import annotations

from mmengine.model import MMDistributedDataParallel
from mmengine.registry import MODEL_WRAPPERS


@MODEL_WRAPPERS.register_module()
class CPUCompatibleDDP(MMDistributedDataParallel):

    def __init__(self, module, device_ids=None, **kwargs):
        on_cpu = all(p.device.type == 'cpu' for p in module.parameters())
        super().__init__(module=module,
                         device_ids=None if on_cpu else device_ids, **kwargs)
