#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check, docs/gpu.md), run from the
# repository root as a module so that the package comes from this source
# tree. Arguments go to the check, e.g.
#
#   bash tools/gpu_check.sh --json work_dirs/gpu_check/gpu_check.json
#   bash tools/gpu_check.sh --device cpu --tiny      # a dry run on a CPU
#
# Interpreter: $VENV/bin/python when that exists (VENV as for `make env`;
# default .venv in the repository), else python3 from PATH (a machine
# without the project's environment, such as the GPU test machine).
# Expected run time on one recent GPU: 3-6 minutes. Exit status: the
# check's (1 when a check failed or torch sees no CUDA device).
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
if [ -x "$VENV/bin/python" ]; then
    PY="$VENV/bin/python"
else
    PY="$(command -v python3)" || { echo "no python3 on PATH" >&2; exit 1; }
fi
echo "gpu_check.sh: $PY -m benchmarks.gpu_check $*"
cd "$ROOT" && exec "$PY" -m benchmarks.gpu_check "$@"
