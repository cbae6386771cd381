# UperNet with a PosMLP-T backbone on ADE20K: mmseg's Swin-T UperNet (the
# same bases and the same 160k-iteration AdamW recipe) with the backbone
# swapped.
_base_ = [
    'mmseg::_base_/models/upernet_swin.py',
    'mmseg::_base_/datasets/ade20k.py',
    './_base_/schedules/posmlp_adamw_160k.py',
    './_base_/posmlp_seg_runtime.py',
]
crop_size = (512, 512)
data_preprocessor = dict(size=crop_size)
pretrained = 'checkpoints/posmlp_t_imagenet.pth'  # noqa

model = dict(
    data_preprocessor=data_preprocessor,
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='PosMLP',
        arch='t',
        gate='gqpe',
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.3,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    decode_head=dict(in_channels=[96, 192, 384, 768], num_classes=150),
    auxiliary_head=dict(in_channels=384, num_classes=150))

# 8 GPUs with 2 images each, as Swin's
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
