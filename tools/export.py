#!/usr/bin/env python
r"""Export a PosMLP backbone, segmentor or detector to ONNX, verified.

    python tools/export.py --arch t --out posmlp_t.onnx
    python tools/export.py --arch s --gate gqpe --checkpoint posmlp_s.pth \
        --shape 800 1344 --out posmlp_s.onnx
    python tools/export.py \
        --config configs/fpn_posmlp_t_4xb4-40k_ade20k-512x512.py \
        --checkpoint iter_40000.pth --out fpn_posmlp_t.onnx
    python tools/export.py --config configs/retinanet_posmlp_t_fpn_1x_coco.py \
        --checkpoint epoch_12.pth --shape 800 1344 --image photo.jpg \
        --out retinanet_posmlp_t.onnx

The graph is written by torch's dynamo exporter with dynamic batch, height
and width, then run in ONNX Runtime at the export size and at the
``--verify-sizes`` (by default one size no window tiles and one smaller
than a window at the deepest level) and compared with eager PyTorch: a
backbone's or segmentor's outputs within tolerance, a detector's boxes
(RetinaNet, Faster and Mask R-CNN, image to boxes with NMS in the graph;
docs/export.md) box for box against mmdet's predict, also on the
``--image`` photographs prepared by the config's test pipeline. The table
is printed; the file is put at ``--out`` only if every size matches,
otherwise it is deleted (``--keep-unverified`` keeps it as
NAME.UNVERIFIED.onnx) and the exit status is 1. Needs the export extra:
pip install -e ".[export]".
"""
import argparse
import json
import os.path as osp
import sys

from posmlp_dense.export import (DEFAULT_VERIFY_SIZES, ExportDependencyError,
                                 export_verified, require_export_dependencies)
from posmlp_dense.archs import GATES
from benchmarks.cli_sizes import parse_dims
from posmlp_dense.known_warnings import hide_known_third_party_warnings


def parse_size(text):
    """An argparse ``type``: 'HxW' -> (H, W) (no square shorthand)."""
    return parse_dims(text, 'HxW')


def parse_arch(text):
    """'t', 's', 'b', or a JSON dict with PosMLP's arch fields."""
    if text.lstrip().startswith('{'):
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise argparse.ArgumentTypeError(
                f'--arch is not valid JSON: {err}') from None
    return text


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog='\n'.join(__doc__.split('\n')[2:]))
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument('--arch', type=parse_arch,
                       help="backbone: 't', 's', 'b' or a JSON arch dict, "
                       "e.g. '{\"embed_dims\": [32, 64, 128, 256], ...}'")
    model.add_argument('--config', help='mmseg config: export the whole '
                       "segmentor's tensor forward (decode-head logits); "
                       'mmdet config (RetinaNet, Faster/Mask R-CNN): the '
                       'whole detector, image to boxes')
    parser.add_argument('--gate', choices=GATES, default='gqpe',
                        help='backbone gate (with --arch)')
    parser.add_argument('--checkpoint', help='weights: a PosMLP checkpoint '
                        '(released or converted) with --arch, a training '
                        'checkpoint of the config with --config')
    parser.add_argument('--out', required=True, help='the .onnx file')
    parser.add_argument('--shape', type=int, nargs=2, default=(512, 512),
                        metavar=('H', 'W'), help='export size (512 512)')
    parser.add_argument('--batch', type=int, default=None,
                        help='batch size of the export example (default 2, '
                        'or 1 with --static-batch; a dynamic batch cannot '
                        'be exported from an example of 1)')
    parser.add_argument('--static-batch', action='store_true',
                        help='fix the batch size (default: dynamic)')
    parser.add_argument('--verify-sizes', type=parse_size, nargs='+',
                        default=list(DEFAULT_VERIFY_SIZES), metavar='HxW',
                        help='other sizes to check the file at (default: '
                        + ' '.join(f'{h}x{w}' for h, w in DEFAULT_VERIFY_SIZES)
                        + ')')
    parser.add_argument('--image', nargs='+', default=[], metavar='PHOTO',
                        help='detectors: also verify on these photographs, '
                        "prepared by the config's test pipeline and data "
                        'preprocessor')
    parser.add_argument('--opset', type=int, default=None,
                        help="ONNX opset (default: the exporter's)")
    parser.add_argument('--atol', type=float, default=1e-4,
                        help='absolute tolerance (1e-4)')
    parser.add_argument('--rtol', type=float, default=1e-4,
                        help='relative tolerance (1e-4)')
    parser.add_argument('--keep-unverified', action='store_true',
                        help='keep a file that fails verification, as '
                        'NAME.UNVERIFIED.onnx')
    parser.add_argument('--overwrite', action='store_true',
                        help='replace an existing --out file')
    args = parser.parse_args(argv)
    if args.batch is None:
        args.batch = 1 if args.static_batch else 2
    if args.batch <= 0 or min(args.shape) <= 0:
        parser.error('--batch and --shape must be positive')
    if args.batch == 1 and not args.static_batch:
        parser.error('--batch 1 needs --static-batch: torch.export fixes '
                     'every axis whose example size is 1')
    if args.config is not None and args.gate != 'gqpe':
        parser.error('--gate is for --arch; a config names its own gate')
    if args.image and args.config is None:
        parser.error('--image is for detectors (--config of an mmdet model)')
    return args


def build_backbone(args):
    from posmlp_dense import PosMLP, load_pretrained
    backbone = PosMLP(args.arch, gate=args.gate)
    if args.checkpoint:
        print(load_pretrained(backbone, args.checkpoint))
    name = args.arch if isinstance(args.arch, str) else 'custom'
    names = [f'level{i}' for i in backbone.out_indices]
    return backbone.eval(), f'PosMLP {name} ({args.gate})', names


def build_segmentor_logits(args):
    from posmlp_dense.export import SegmentorLogits, build_segmentor
    segmentor = build_segmentor(args.config, args.checkpoint)
    # what the graph's input must be: images as mmseg's data preprocessor
    # hands them to the model (the preprocessing is not part of the graph)
    pre = segmentor.data_preprocessor
    conversion = 'with' if getattr(pre, 'channel_conversion', False) \
        else 'without'
    mean, std = getattr(pre, 'mean', None), getattr(pre, 'std', None)
    if mean is not None and std is not None:
        mean = [round(float(v), 3) for v in mean.flatten()]
        std = [round(float(v), 3) for v in std.flatten()]
        print(f'input: images normalized as the config does (mean {mean}, '
              f'std {std}, {conversion} BGR->RGB); output: decode-head '
              f'logits at its stride')
    else:
        print(f'input: unnormalized images ({conversion} BGR->RGB); '
              f'output: decode-head logits at its stride')
    name = f'{type(segmentor).__name__} of {osp.basename(args.config)}'
    model = SegmentorLogits(segmentor).eval()
    for kind, count in model.replaced.items():
        if count:
            print(f'{count} {kind} modules computed with symbolic sizes (as '
                  f'written, the graph would hold at the export size only)')
    return model, name, ['logits']


def build_detector_graph(args):
    """The detector's deploy forward, and how to verify its file."""
    from posmlp_dense.export.detection import (build_detector,
                                               detector_end2end, output_names,
                                               prepare_photo, rows_per_image,
                                               verify_detector_onnx)
    detector = build_detector(args.config, args.checkpoint)
    model = detector_end2end(detector)
    rows = rows_per_image(model)
    names = output_names(model)
    pre = detector.data_preprocessor
    # mmengine's ImgDataPreprocessor keeps these privately
    conversion = 'with' if getattr(pre, '_channel_conversion', False) \
        else 'without'
    if getattr(pre, '_enable_normalize', False):
        mean = [round(float(v), 3) for v in pre.mean.flatten()]
        std = [round(float(v), 3) for v in pre.std.flatten()]
        normalized = f'normalized as the config does (mean {mean}, std {std}'
    else:
        normalized = 'as the config hands them over (no normalization'
    print(f'input: images {normalized}, {conversion} BGR->RGB), padded to a '
          f'multiple of {pre.pad_size_divisor} with {pre.pad_value}; '
          f'outputs: ' + ', '.join(names) + f' with {rows} rows per image '
          f'(max_per_img), in the input tensor\'s coordinates')
    photos = [(osp.basename(path), prepare_photo(args.config, detector, path))
              for path in args.image]

    def verify(path, shapes, export_shape):
        return verify_detector_onnx(path, detector, shapes,
                                    export_shape=export_shape, photos=photos,
                                    rows=rows)

    name = f'{type(detector).__name__} of {osp.basename(args.config)}'
    return model, name, names, verify


def build_model(args):
    """(model, name, output names, verify or None) for the arguments."""
    if args.config is None:
        return (*build_backbone(args), None)
    from posmlp_dense.export.segmentor import config_scope
    scope = config_scope(args.config)
    if scope == 'mmdet':
        return build_detector_graph(args)
    if scope == 'mmseg':
        if args.image:
            raise ValueError('--image is for detectors; this is an mmseg '
                             'config')
        return (*build_segmentor_logits(args), None)
    raise ValueError(f'{args.config} is neither an mmseg nor an mmdet config '
                     f'(default_scope {scope!r})')


def main(argv=None):
    args = parse_args(argv)
    try:
        require_export_dependencies()
        model, name, output_names, verify = build_model(args)
        if not args.checkpoint:
            print('no --checkpoint: exporting freshly initialized weights')
    except (ExportDependencyError, FileNotFoundError, ValueError,
            KeyError, TypeError) as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    shape = (args.batch, 3, *args.shape)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    axes = 'height, width' + ('' if args.static_batch else ', batch')
    print(f'exporting {name}, {params:.1f} M parameters, at '
          f'{"x".join(map(str, shape))} with dynamic {axes} '
          f'(torch.onnx.export, dynamo=True)')
    try:
        result = export_verified(
            model, shape, args.out, verify_sizes=args.verify_sizes,
            dynamic_batch=not args.static_batch, opset=args.opset,
            atol=args.atol, rtol=args.rtol, output_names=output_names,
            keep_unverified=args.keep_unverified, overwrite=args.overwrite,
            verify=verify, size_oblivious=verify is not None)
    except FileExistsError as err:
        print(f'error: {err}', file=sys.stderr)
        return 2
    except Exception as err:  # the exporters raise many unrelated types
        print(f'export failed: {type(err).__name__}: {err}', file=sys.stderr)
        return 1
    report = result.report
    print(f'export {result.export_seconds:.1f} s (opset '
          f'{result.graph.opset}), verification {result.verify_seconds:.1f} '
          f's; the file\'s input: {report.input_shape}, valid for '
          f'{result.graph.describe_ranges()}')
    print(report.table())
    for note in report.notes:
        print(f'note: {note}')
    print(report.verdict())
    if result.passed:
        size = osp.getsize(result.path) / 2 ** 20
        print(f'wrote {result.path} ({size:.1f} MB)')
        return 0
    if result.unverified_path:
        print(f'kept the unverified file as {result.unverified_path}',
              file=sys.stderr)
    else:
        print(f'refused: nothing was written to {args.out} '
              f'(--keep-unverified keeps a failing file under another name)',
              file=sys.stderr)
    return 1


if __name__ == '__main__':
    hide_known_third_party_warnings()
    sys.exit(main())
