#!/usr/bin/env bash
# Distributed training with torchrun, one process per GPU (or per CPU
# process with gloo when no GPU is present).
#   bash tools/dist_train.sh CONFIG NUM_PROCS [train.py options]
# Multi-node: set NNODES, NODE_RANK, MASTER_ADDR (and PORT) on every node.
# PYTHON picks the interpreter (default: python on PATH).
set -euo pipefail
CONFIG=$1
NPROC=$2
shift 2
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
    "$HERE/train.py" "$CONFIG" --launcher pytorch "$@"
