"""Print what the project's environment holds and check that it works.

Run with the environment's interpreter (tools/setup_env.sh does this at its
end):

    .venv/bin/python tools/check_env.py

It prints the versions of the key packages and whether mmcv's compiled ops
are CPU-only or include CUDA kernels, runs one real mmcv op, and exits
non-zero with the reason when something is missing or broken.
"""
import importlib
import importlib.metadata as md
import sys


def dist_version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def opencv_dists():
    names = set()
    for dist in md.distributions():
        name = (dist.metadata['Name'] or '').lower()
        if name.startswith('opencv'):
            names.add(name)
    return sorted(names)


def mmcv_ops_kind():
    """'cpu' or 'cuda X' for the compiled mmcv ops; raises when absent."""
    ext = importlib.import_module('mmcv._ext')
    cuda = ext.get_compiling_cuda_version()
    return 'cpu' if cuda == 'not available' else f'cuda {cuda}'


def main():
    problems = []
    rows = [('python', sys.version.split()[0] + '  (' + sys.executable + ')')]

    try:
        import torch
        cuda_build = torch.version.cuda or 'none'
        gpu = torch.cuda.is_available()
        rows.append(('torch', f'{torch.__version__}  (CUDA build: '
                     f'{cuda_build}, GPU visible: {"yes" if gpu else "no"})'))
    except Exception as exc:  # noqa: BLE001 - report any import failure
        problems.append(f'import torch failed: {exc!r}')

    for module, dist in [('torchvision', 'torchvision'),
                         ('mmengine', 'mmengine'), ('mmcv', 'mmcv'),
                         ('mmdet', 'mmdet'), ('mmseg', 'mmsegmentation'),
                         ('timm', 'timm'), ('cv2', None),
                         ('numpy', 'numpy'), ('setuptools', 'setuptools'),
                         ('posmlp_dense', 'posmlp_dense')]:
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001
            problems.append(f'import {module} failed: {exc!r}')
            continue
        version = getattr(mod, '__version__', None) or dist_version(dist)
        if module == 'posmlp_dense' and version is None:
            version = importlib.import_module(
                'posmlp_dense.version').__version__
        rows.append((dist or module, str(version)))

    try:
        kind = mmcv_ops_kind()
        rows.append(('mmcv ops', kind))
    except Exception as exc:  # noqa: BLE001
        problems.append('mmcv has no compiled ops (mmcv._ext missing: '
                        f'{exc!r}); rebuild it with tools/setup_env.sh')

    try:
        import torch
        from mmcv.ops import RoIAlign, nms  # noqa: F401
        boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.],
                              [20., 20., 30., 30.]])
        scores = torch.tensor([0.9, 0.8, 0.7])
        _, keep = nms(boxes, scores, iou_threshold=0.5)
        if keep.tolist() != [0, 2]:
            problems.append(f'mmcv.ops.nms kept {keep.tolist()}, '
                            'expected [0, 2]')
    except Exception as exc:  # noqa: BLE001
        problems.append(f'mmcv.ops.nms on CPU failed: {exc!r}')

    for module in ('mmdet.models', 'mmseg.models'):
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001
            problems.append(f'import {module} failed: {exc!r}')

    opencv = opencv_dists()
    rows.append(('opencv dists', ', '.join(opencv) or 'none'))
    if len(opencv) != 1:
        problems.append('expected exactly one OpenCV distribution '
                        f'(opencv-python-headless), found {opencv}')

    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f'  {name:<{width}}  {value}')

    if problems:
        print('\nenvironment check FAILED:', file=sys.stderr)
        for p in problems:
            print(f'  - {p}', file=sys.stderr)
        return 1
    print('  environment check: OK')
    return 0


if __name__ == '__main__':
    sys.exit(main())
