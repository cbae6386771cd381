# RetinaNet with a PosMLP-S backbone on COCO (1x schedule, AdamW).
#   python tools/train.py configs/retinanet_posmlp_s_fpn.py
# Put the released ImageNet checkpoint of PosMLP-S at `pretrained` (or
# override it: --cfg-options model.backbone.init_cfg.checkpoint=PATH).
_base_ = './retinanet_posmlp_s_fpn_1x_coco.py'
