#!/usr/bin/env bash
# GPU readiness check: the CUDA tests (tests/test_gpu.py, pytest -m gpu) and
# a short CUDA benchmark (PosMLP-T against Swin-T at 800x1333: backbone
# inference; backbone training steps and RetinaNet training iterations,
# with and without with_cp), then one summary.
#
#   bash tools/gpu_check.sh [OUT_DIR]   # default: work_dirs/gpu_check
#
# Uses the environment's interpreter, $VENV/bin/python (VENV as for
# `make env`; default .venv in the repository). Expected run time on one
# recent GPU: 2-4 minutes; each part has its own time limit (4 minutes
# each), so the whole check stays under 8 minutes. Exit status: 0 when every
# test passed and the benchmark ran; 1 otherwise, including when torch sees
# no CUDA device (then nothing else runs).
set -u -o pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
OUT="${1:-$ROOT/work_dirs/gpu_check}"
TESTS_LIMIT_S=240
BENCH_LIMIT_S=240
START=$(date +%s)

fail() {
    echo
    echo "=== GPU check: FAILED: $*"
    exit 1
}

[ -x "$PY" ] ||
    fail "no Python environment at $VENV (run \`make env\`, or set VENV=...)"
mkdir -p "$OUT" || fail "cannot create $OUT"
cd "$ROOT" || fail "cannot enter $ROOT"

echo "=== 1/3 CUDA device and mmcv ops"
"$PY" - <<'EOF' 2>&1 | tee "$OUT/device.txt"
import sys

import torch

if not torch.cuda.is_available():
    print(f'torch {torch.__version__} (built for CUDA {torch.version.cuda}) '
          f'sees no CUDA device')
    sys.exit(3)
print(f'device: {torch.cuda.get_device_name(0)} '
      f'({torch.cuda.device_count()} visible), '
      f'{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB')
print(f'torch {torch.__version__}, CUDA {torch.version.cuda}, '
      f'cuDNN {torch.backends.cudnn.version()}')
try:
    import mmcv
    from mmcv.ops import get_compiling_cuda_version
except ImportError as exc:
    print(f'mmcv ops: not importable ({exc})')
else:
    print(f'mmcv {mmcv.__version__} ops compiled with CUDA: '
          f'{get_compiling_cuda_version()}')
EOF
status=$?
if [ "$status" -eq 3 ]; then
    fail "torch sees no CUDA device: this check needs a GPU"
elif [ "$status" -ne 0 ]; then
    fail "the environment check itself failed (exit $status, see above)"
fi

echo
echo "=== 2/3 CUDA tests (limit ${TESTS_LIMIT_S}s)"
timeout "$TESTS_LIMIT_S" "$PY" -m pytest -m gpu tests/test_gpu.py -q -rA \
    -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" 2>&1 \
    | tee "$OUT/gpu_tests.log"
tests_status=$?

echo
echo "=== 3/3 CUDA benchmark (limit ${BENCH_LIMIT_S}s)"
timeout "$BENCH_LIMIT_S" "$PY" tools/benchmark.py --device cuda \
    --models posmlp_t,swin_t --sizes 800x1333 --batches 1 --modes fwd \
    --repeats 10 --warmup 3 --scaling-sizes none --check-size none \
    --no-count --train-models posmlp_t,swin_t \
    --train-shapes 2x512x512,1x800x1333 --train-cp off,on \
    --detectors posmlp_t,swin_t --detector-shape 1x800x1333 \
    --train-repeats 5 --train-warmup 2 --no-chart \
    --out "$OUT/benchmark.json" 2>&1 | tee "$OUT/benchmark.log"
bench_status=$?

echo
elapsed=$(( $(date +%s) - START ))
"$PY" - "$OUT" "$tests_status" "$bench_status" "$elapsed" <<'EOF'
import json
import os
import sys
import xml.etree.ElementTree as ET

out, tests_status, bench_status, seconds = sys.argv[1:]
ok = True
print('=' * 72)
print('GPU check summary')
print('=' * 72)
with open(os.path.join(out, 'device.txt')) as f:
    for line in f:
        print('  ' + line.rstrip())

xml_path = os.path.join(out, 'gpu_tests.xml')
if tests_status in ('124', '137'):
    print('tests: TIMED OUT')
    ok = False
if os.path.exists(xml_path):
    suite = ET.parse(xml_path).getroot()
    suite = suite if suite.tag == 'testsuite' else suite.find('testsuite')
    counts = {k: int(suite.get(k, 0)) for k in
              ('tests', 'failures', 'errors', 'skipped')}
    passed = counts['tests'] - counts['failures'] - counts['errors'] \
        - counts['skipped']
    print(f"tests: {passed} passed, {counts['failures']} failed, "
          f"{counts['errors']} errors, {counts['skipped']} skipped "
          f"(of {counts['tests']})")
    for case in suite.iter('testcase'):
        for kind in ('failure', 'error', 'skipped'):
            node = case.find(kind)
            if node is not None:
                message = (node.get('message') or '').splitlines()
                print(f"  {kind.upper():8s} {case.get('name')}: "
                      f"{message[0][:160] if message else ''}")
    ok = ok and passed == counts['tests'] and counts['tests'] > 0
else:
    print(f'tests: no report (pytest exit {tests_status})')
    ok = False

bench_path = os.path.join(out, 'benchmark.json')
if bench_status != '0' or not os.path.exists(bench_path):
    why = 'TIMED OUT' if bench_status in ('124', '137') else \
        f'exit {bench_status}'
    print(f'benchmark: FAILED ({why}; see {out}/benchmark.log)')
    ok = False
else:
    with open(bench_path) as f:
        report = json.load(f)
    for r in report['results']:
        print(f"inference {r['model']:<9s} {'x'.join(map(str, r['size']))} "
              f"b{r['batch']}: {r['median_s'] * 1e3:8.2f} ms, peak "
              f"{r['peak_mem_mb'] or 0:7.0f} MB")
    for e in report['targets']['posmlp_vs_swin']:
        print(f"  PosMLP-T / Swin-T inference latency "
              f"{e['latency_ratio']:.2f}, memory "
              f"{e['peak_mem_ratio'] or float('nan'):.2f}"
              + (f" (target {e['target']}: "
                 f"{'met' if e['met'] else 'NOT met'})" if 'met' in e else ''))
    for r in report['training']:
        print(f"train {r['kind']:<8s} {r['label']:<32s} "
              f"{'x'.join(map(str, r['shape'])):>10s}: "
              f"{r['median_s'] * 1e3:8.1f} ms, peak "
              f"{r.get('peak_mb') or 0:7.0f} MB, saved "
              f"{r.get('saved_activation_mb_per_image') or 0:7.1f} MB/image")
    for e in report['targets']['training']:
        ratio = e['peak_ratio']
        print(f"  PosMLP-T / Swin-T {e['kind']:<8s} "
              f"{'x'.join(map(str, e['shape'])):>10s} "
              f"with_cp {'on ' if e['with_cp'] else 'off'}: time "
              f"{e['time_ratio']:.2f}, peak "
              f"{ratio if ratio is not None else float('nan'):.2f}, saved "
              f"{e['saved_ratio'] or float('nan'):.2f}"
              + (f" ({'met' if e['met'] else 'NOT met'})" if 'met' in e
                 else ''))
    print(f"benchmark: {report['run_seconds']:.0f} s; tables in "
          f"{os.path.splitext(bench_path)[0]}.md")
print(f'total: {seconds} s')
print('RESULT: ' + ('PASS' if ok else 'FAIL'))
sys.exit(0 if ok else 1)
EOF
