# mmdet's 1x schedule (12 epochs, LR steps at 8 and 11) with AdamW, as
# mmdet's Swin and PVT detectors train.
_base_ = [
    'mmdet::_base_/schedules/schedule_1x.py',
    '../posmlp_param_groups.py',
]
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    # mmengine's constructor, with plain-dict parameter groups that a
    # compiled train_step can trace (posmlp_dense.openmmlab.runtime)
    constructor='PlainGroupsOptimWrapperConstructor',
    optimizer=dict(
        type='AdamW', lr=0.0001, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=_base_.posmlp_paramwise_cfg)
