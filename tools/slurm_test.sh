#!/usr/bin/env bash
# Evaluation on a Slurm cluster.
#   bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py options]
# GPUS (total, default 8), GPUS_PER_NODE (default 8), CPUS_PER_TASK (5) and
# SRUN_ARGS can be set in the environment.
set -euo pipefail
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
CHECKPOINT=$4
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
    "${PYTHON:-python}" -u "$HERE/test.py" "$CONFIG" "$CHECKPOINT" --launcher=slurm "$@"
