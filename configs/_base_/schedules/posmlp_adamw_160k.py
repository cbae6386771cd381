# 160k iterations with AdamW, a linear warm-up and a linear decay: the
# UperNet recipe of mmseg's Swin configs.
_base_ = [
    'mmseg::_base_/schedules/schedule_160k.py',
    '../posmlp_param_groups.py',
]
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    # mmengine's constructor, with plain-dict parameter groups that a
    # compiled train_step can trace (posmlp_dense.openmmlab.runtime)
    constructor='PlainGroupsOptimWrapperConstructor',
    optimizer=dict(
        type='AdamW', lr=0.00006, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=_base_.posmlp_paramwise_cfg)
param_scheduler = [
    dict(
        type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(
        type='PolyLR',
        eta_min=0.0,
        power=1.0,
        begin=1500,
        end=160000,
        by_epoch=False,
    )
]
# checkpoints that a kill cannot lose (see ../posmlp_det_runtime.py)
default_hooks = dict(
    checkpoint=dict(type='AtomicCheckpointHook',
                    backend_args=dict(backend='local_atomic')))
