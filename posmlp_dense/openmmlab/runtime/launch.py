"""What tools/train.py and tools/test.py share: reading a config for mmdet
or mmseg, applying the command-line flags, and building mmengine's Runner.

The same scripts serve detection and segmentation: the framework is read
from the config (its ``default_scope``, set by the mmdet/mmseg bases).
"""
from __future__ import annotations

import os
import os.path as osp
from typing import Optional

import torch
from mmengine.config import Config

FRAMEWORKS = ('mmdet', 'mmseg')


def detect_framework(cfg: Config) -> str:
    """'mmdet' or 'mmseg', from the config's default scope."""
    scope = cfg.get('default_scope')
    if scope in FRAMEWORKS:
        return scope
    raise ValueError(
        f'cannot tell whether this config is for mmdet or mmseg: its '
        f'default_scope is {scope!r}; inherit from an mmdet/mmseg base config '
        f"or set default_scope = 'mmdet' / 'mmseg'")


def load_config(path: str, cfg_options: Optional[dict] = None,
                work_dir: Optional[str] = None,
                launcher: str = 'none') -> Config:
    if not osp.isfile(path):
        raise FileNotFoundError(f'config not found: {path}')
    cfg = Config.fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    cfg.launcher = launcher
    detect_framework(cfg)
    # work_dir: command line > config > ./work_dirs/<config name>
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('work_dirs',
                                osp.splitext(osp.basename(path))[0])
    if launcher != 'none' and not torch.cuda.is_available():
        use_cpu_distributed(cfg)
    return cfg


def use_cpu_distributed(cfg: Config):
    """Distributed runs without GPUs: gloo, and a DDP that takes CPU models.

    mmengine's own process-group set-up always selects a CUDA device, so
    for CPU runs the gloo group is created here, from torchrun's
    environment; mmengine then finds it initialized and uses it.
    """
    if cfg.launcher != 'pytorch':
        raise ValueError(f'distributed runs without GPUs support '
                         f'--launcher pytorch (torchrun) only, got '
                         f'{cfg.launcher!r}')
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group(backend='gloo')
    env = cfg.setdefault('env_cfg', {})
    env['dist_cfg'] = dict(backend='gloo')
    wrapper = cfg.get('model_wrapper_cfg') or {}
    if wrapper.get('type', 'MMDistributedDataParallel') == \
            'MMDistributedDataParallel':
        wrapper['type'] = 'CPUCompatibleDDP'
    cfg.model_wrapper_cfg = wrapper


def enable_amp(cfg: Config):
    """Mixed precision: fp16 with dynamic loss scaling on GPUs, bf16 on CPU."""
    cfg.optim_wrapper.type = 'AmpOptimWrapper'
    if torch.cuda.is_available():
        cfg.optim_wrapper.loss_scale = 'dynamic'
    else:
        cfg.optim_wrapper.dtype = 'bfloat16'


def set_resume(cfg: Config, resume: Optional[str]):
    """``--resume``: 'auto' resumes from the work dir's last checkpoint."""
    if resume is None:
        return
    cfg.resume = True
    if resume == 'auto':
        cfg.load_from = None
    else:
        if not osp.isfile(resume):
            raise FileNotFoundError(f'checkpoint to resume from not found: '
                                    f'{resume}')
        cfg.load_from = resume


def enable_visualization(cfg: Config, show_dir: str):
    """Save pictures of the predictions of ``test`` under ``show_dir``."""
    hooks = cfg.setdefault('default_hooks', {})
    vis = hooks.get('visualization')
    if vis is None:
        raise ValueError('the config has no visualization hook to draw '
                         'predictions with')
    vis['draw'] = True
    # mmdet's hook calls it test_out_dir, mmseg's draws into the log dir
    if 'DetVisualizationHook' in str(vis.get('type')):
        vis['test_out_dir'] = show_dir
    else:
        cfg.visualizer['save_dir'] = show_dir
        vis['interval'] = 1


def add_common_arguments(parser):
    """The flags tools/train.py and tools/test.py share."""
    from mmengine.config import DictAction
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries: key=value ...')
    parser.add_argument('--launcher', default='none',
                        choices=['none', 'pytorch', 'slurm', 'mpi'])
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    parser.add_argument('--skip-preflight', action='store_true',
                        help='do not check first that the data and '
                        'checkpoints the config names exist')


def set_local_rank(local_rank: int):
    os.environ.setdefault('LOCAL_RANK', str(local_rank))


def build_runner(cfg: Config):
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    if 'runner_type' in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)


def initialize_like_training(runner):
    """Give the runner's model the weights its training starts from.

    mmengine's ``Runner.train`` runs the model's ``init_weights`` (the
    config's ``init_cfg``: a pretrained backbone, a detection head's prior
    bias) but ``Runner.test`` does not, so a model evaluated without a
    checkpoint would otherwise keep PyTorch's default initialization: a
    RetinaNet head then scores every anchor near 0.5 instead of its prior
    0.01, and the backbone is not the pretrained one.
    """
    from mmengine.model import is_model_wrapper
    from mmengine.dist import broadcast
    model = runner.model
    if is_model_wrapper(model):
        model = model.module
    model.init_weights()
    for tensor in model.state_dict().values():  # as Runner.train: rank 0's
        broadcast(tensor)
