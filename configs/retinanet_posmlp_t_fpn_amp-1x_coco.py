# Mixed precision (fp16 with dynamic loss scaling on GPUs).
_base_ = './retinanet_posmlp_t_fpn_1x_coco.py'

optim_wrapper = dict(type='AmpOptimWrapper', loss_scale='dynamic')
