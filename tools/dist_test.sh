#!/usr/bin/env bash
# Distributed evaluation with torchrun.
#   bash tools/dist_test.sh CONFIG CHECKPOINT NUM_PROCS [test.py options]
# Multi-node: set NNODES, NODE_RANK, MASTER_ADDR (and PORT) on every node.
# PYTHON picks the interpreter (default: python on PATH).
set -euo pipefail
CONFIG=$1
CHECKPOINT=$2
NPROC=$3
shift 3
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHONPATH="$HERE/..:${PYTHONPATH:-}" \
"${PYTHON:-python}" -m torch.distributed.run \
    --nnodes="$NNODES" --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" --master_port="$PORT" \
    --nproc_per_node="$NPROC" \
    "$HERE/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "$@"
