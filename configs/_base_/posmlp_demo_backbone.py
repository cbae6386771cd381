# The small PosMLP that the CPU demos (configs/demo/) train from scratch:
# a quarter of PosMLP-T's width, fewer blocks, the same windows and groups.
demo_backbone = dict(
    arch=dict(
        _delete_=True,
        embed_dims=(32, 64, 128, 256),
        depths=(1, 1, 2, 1),
        mlp_ratio=(4, 4, 4, 2),
        gamma=(8, 16, 32, 64),
        window_size=(14, 14, 14, 7)),
    drop_path_rate=0.0,
    init_cfg=None)  # trained from scratch: no ImageNet weights here
