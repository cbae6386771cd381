"""Opt-in training-runtime components for mmengine runs.

``import posmlp_dense`` only registers the model. Importing this module (a
config's ``custom_imports``; tools/train.py and tools/test.py import it)
registers, the OpenMMLab way, what makes runs robust:

* the file backend ``local_atomic`` (checkpoints written to a temporary file
  and renamed into place) and the hook ``AtomicCheckpointHook`` (an atomic
  ``last_checkpoint`` marker; outdated checkpoints removed only once a newer
  one is marked), which configs name in ``default_hooks.checkpoint``;
* mmengine's loader for local checkpoints (``load_from``, resume): read with
  ``weights_only=True`` and a clear error for truncated, corrupt or unsafe
  files;
* ``CPUCompatibleDDP``, the model wrapper for distributed runs on CPUs
  (gloo);
* the forwarding of the package's log records into the run's log;
* ``PlainGroupsOptimWrapperConstructor``, mmengine's optimizer constructor
  with parameter groups that torch.compile can trace (configs name it in
  ``optim_wrapper.constructor``);
* ``CompileBackboneHook``, torch.compile for the backbone alone (configs
  name it in ``custom_hooks``): one graph for every input size, where a
  compiled ``train_step`` compiles the backbone again with the neck at
  each new size.

Everything goes through mmengine's own registration points (registries,
``register_backend``, ``CheckpointLoader.register_scheme``); no module global
of mmengine or any other library is replaced.
"""
from .atomic_backend import BACKEND_NAME, AtomicLocalBackend
from .checkpoint_hook import AtomicCheckpointHook
from .compile_backbone_hook import CompileBackboneHook
from .cpu_ddp import CPUCompatibleDDP
from .param_groups import PlainGroupsOptimWrapperConstructor
from .run_log import RunLogHandler
from .safe_checkpoints import load_from_local_weights_only

__all__ = ['AtomicLocalBackend', 'AtomicCheckpointHook', 'BACKEND_NAME',
           'CompileBackboneHook', 'CPUCompatibleDDP',
           'PlainGroupsOptimWrapperConstructor', 'RunLogHandler',
           'load_from_local_weights_only']
