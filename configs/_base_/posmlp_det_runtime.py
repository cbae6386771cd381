# mmdet's default runtime, with PosMLP registered and its training runtime
# switched on (posmlp_dense.openmmlab.runtime): checkpoints written to a
# temporary file and renamed into place, an atomic last_checkpoint marker,
# outdated checkpoints removed only once a newer one is marked, mmengine
# checkpoints read with weights_only=True, DDP on CPUs.
_base_ = 'mmdet::_base_/default_runtime.py'

custom_imports = dict(
    imports=['posmlp_dense', 'posmlp_dense.openmmlab.runtime'],
    allow_failed_imports=False)
default_hooks = dict(
    checkpoint=dict(type='AtomicCheckpointHook',
                    backend_args=dict(backend='local_atomic')))
