# 40k iterations with AdamW and a poly LR decay: the Semantic FPN recipe of
# PVT and PoolFormer.
_base_ = [
    'mmseg::_base_/schedules/schedule_40k.py',
    '../posmlp_param_groups.py',
]
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    # mmengine's constructor, with plain-dict parameter groups that a
    # compiled train_step can trace (posmlp_dense.openmmlab.runtime)
    constructor='PlainGroupsOptimWrapperConstructor',
    optimizer=dict(type='AdamW', lr=0.0002, weight_decay=0.0001),
    paramwise_cfg=_base_.posmlp_paramwise_cfg)
param_scheduler = [
    dict(type='PolyLR', power=0.9, eta_min=0.0, begin=0, end=40000,
         by_epoch=False)
]
# checkpoints that a kill cannot lose (see ../posmlp_det_runtime.py)
default_hooks = dict(
    checkpoint=dict(type='AtomicCheckpointHook',
                    backend_args=dict(backend='local_atomic')))
