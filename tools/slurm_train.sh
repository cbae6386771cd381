#!/usr/bin/env bash
# Training on a Slurm cluster.
#   bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py options]
# GPUS (total, default 8), GPUS_PER_NODE (default 8), CPUS_PER_TASK (5) and
# SRUN_ARGS can be set in the environment.
set -euo pipefail
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
shift 4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHONPATH="$HERE/..:${PYTHONPATH:-}" \
srun -p "$PARTITION" --job-name="$JOB_NAME" \
    --gres=gpu:"$GPUS_PER_NODE" --ntasks="$GPUS" \
    --ntasks-per-node="$GPUS_PER_NODE" --cpus-per-task="$CPUS_PER_TASK" \
    --kill-on-bad-exit=1 ${SRUN_ARGS:-} \
    "${PYTHON:-python}" -u "$HERE/train.py" "$CONFIG" --work-dir="$WORK_DIR" \
    --launcher=slurm "$@"
