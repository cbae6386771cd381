#!/usr/bin/env bash
# Create or update the project's Python environment; `make env` runs this.
#
# Settings (environment variables):
#   VENV         environment folder (default: .venv in the repository root).
#                If it already holds a Python with torch >= 2.1 (a CUDA build,
#                say), that torch is kept.
#   PYTHON       interpreter used to create a new environment
#                (default: python3.11 when on PATH, else python3).
#   FORCE_CUDA   1: build mmcv's CUDA ops (needs a CUDA torch and a CUDA
#                toolkit); 0: CPU ops only; unset: CUDA ops only when torch
#                sees a GPU and a CUDA toolkit is found.
#   MAX_JOBS     parallel compile jobs for mmcv's ops (default: CPU count).
#   POSMLP_CACHE_DIR  where built mmcv wheels are kept
#                (default: ${XDG_CACHE_HOME:-$HOME/.cache}/posmlp-dense).
#   POSMLP_ENV_FORCE=1  redo every step even when the environment is current.
set -Eeuo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO_ROOT"

TORCH_VERSION="2.14.1"
TORCHVISION_VERSION="0.29.1"
MIN_TORCH="2.1"
VENV="${VENV:-.venv}"
CACHE_ROOT="${POSMLP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/posmlp-dense}"
WHEEL_ROOT="$CACHE_ROOT/wheels"
LOG_DIR="$CACHE_ROOT/logs"

STEP="start"
STEP_NO=0
STEPS=7
T_START=$(date +%s)

say() { echo "[setup_env] $*"; }
step() {
    STEP_NO=$((STEP_NO + 1))
    STEP="$1"
    echo
    say "==> step $STEP_NO/$STEPS: $STEP  (+$(($(date +%s) - T_START))s)"
}
die() {
    echo "[setup_env] FAILED in step $STEP_NO/$STEPS ($STEP): $*" >&2
    exit 1
}
on_error() {
    local rc=$? line=$1 cmd=$2
    echo "[setup_env] FAILED in step $STEP_NO/$STEPS ($STEP): command exited" \
        "with status $rc (tools/setup_env.sh line $line): $cmd" >&2
    echo "[setup_env] the lines above say why." >&2
    exit "$rc"
}
trap 'on_error $LINENO "$BASH_COMMAND"' ERR

WORK_DIR="$(mktemp -d -t posmlp-setup.XXXXXX)"
BUILD_PID=""
cleanup() {
    if [ -n "$BUILD_PID" ] && kill -0 "$BUILD_PID" 2>/dev/null; then
        kill "$BUILD_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK_DIR"
}
trap cleanup EXIT

# Requirement lines of a requirements file, comments and blanks dropped.
req_lines() { sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' "$1"; }

# The exact version pinned for a package in requirements/mm.txt.
mm_pin() {
    local v
    v="$(req_lines requirements/mm.txt | sed -n "s/^$1==//p")"
    [ -n "$v" ] || die "requirements/mm.txt has no '$1==<version>' line"
    echo "$v"
}

# ---------------------------------------------------------------------------
step "Python environment ($VENV)"
case "$VENV" in
    /*) VENV_ABS="$VENV" ;;
    *) VENV_ABS="$REPO_ROOT/$VENV" ;;
esac
PY="$VENV_ABS/bin/python"
if [ -x "$PY" ]; then
    say "using the existing environment $VENV_ABS"
else
    if [ -z "${PYTHON:-}" ]; then
        if command -v python3.11 >/dev/null 2>&1; then PYTHON=python3.11
        else PYTHON=python3; fi
    fi
    command -v "$PYTHON" >/dev/null 2>&1 ||
        die "no Python interpreter '$PYTHON' on PATH (set PYTHON=...)"
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 9))' ||
        die "$PYTHON is $("$PYTHON" -V 2>&1); Python >= 3.9 is needed (3.11 is tested)"
    "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null ||
        die "$PYTHON lacks the venv/ensurepip modules (Debian/Ubuntu: apt-get install python3-venv)"
    say "creating a virtual environment with $("$PYTHON" -V 2>&1)"
    "$PYTHON" -m venv "$VENV_ABS"
fi
PY_VER="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
say "python $PY_VER at $PY"
# Build tools installed into the environment (ninja) must be on PATH.
export PATH="$VENV_ABS/bin:$PATH"
PIP=("$PY" -m pip --disable-pip-version-check)

MMCV_VERSION="$(mm_pin mmcv)"
MMENGINE_VERSION="$(mm_pin mmengine)"

# Everything that decides the result of the later steps; when it matches the
# stamp left by the last successful run, the installs are skipped.
STAMP="$VENV_ABS/.posmlp-dense-env"
fingerprint() {
    {
        cat requirements/*.txt setup.py tools/setup_env.sh
        echo "$REPO_ROOT|$PY|${FORCE_CUDA:-}|${TORCH_CUDA_ARCH_LIST:-}"
    } | "$PY" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())'
}
FINGERPRINT="$(fingerprint)"
if [ "${POSMLP_ENV_FORCE:-0}" != "1" ] && [ -f "$STAMP" ] &&
    [ "$(cat "$STAMP")" = "$FINGERPRINT" ]; then
    STEP_NO=$((STEPS - 1))
    step "check (environment is current; installs skipped)"
    if "$PY" tools/check_env.py; then
        say "done in $(($(date +%s) - T_START))s"
        exit 0
    fi
    say "the environment no longer passes its check: redoing every step"
    rm -f "$STAMP"
    STEP_NO=1
fi
rm -f "$STAMP"

# ---------------------------------------------------------------------------
step "pip"
"${PIP[@]}" install --progress-bar off 'pip>=23.1'
say "$("${PIP[@]}" --version)"

# ---------------------------------------------------------------------------
step "torch"
TORCH_FOUND="$("$PY" - <<'EOF' 2>/dev/null || true
import torch
print(torch.__version__)
EOF
)"
CONSTRAINTS="$WORK_DIR/constraints.txt"
: > "$CONSTRAINTS"
TORCH_REQS=()
if [ -n "$TORCH_FOUND" ]; then
    if "$PY" -c "
import re, sys
m = re.match(r'(\d+)\.(\d+)', '$TORCH_FOUND')
sys.exit(not m or (int(m[1]), int(m[2])) < tuple(map(int, '$MIN_TORCH'.split('.'))))"; then
        say "found torch $TORCH_FOUND in this environment: keeping it"
        # Pin the public version: '2.5.1' is met by an installed '2.5.1+cu121'
        # (pip then keeps it), while a pin with the local label can fail.
        echo "torch==${TORCH_FOUND%%+*}" >> "$CONSTRAINTS"
        TV_FOUND="$("$PY" -c 'import importlib.metadata as m; print(m.version("torchvision"))' 2>/dev/null || true)"
        if [ -n "$TV_FOUND" ]; then
            say "found torchvision $TV_FOUND: keeping it"
            echo "torchvision==${TV_FOUND%%+*}" >> "$CONSTRAINTS"
        else
            say "no torchvision here: pip will look for one that matches torch $TORCH_FOUND"
            TORCH_REQS=(torchvision)
        fi
    else
        die "this environment has torch $TORCH_FOUND, older than $MIN_TORCH; upgrade it or use another VENV"
    fi
else
    say "no torch in this environment: installing torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION with the other packages"
    TORCH_REQS=("torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION")
    # PyPI's x86_64 torch is a CUDA build: with its NVIDIA libraries and
    # triton the environment takes about 6.2 GB. Say so before pip runs out
    # of space halfway through an install.
    NEED_KB=$((7 * 1024 * 1024))
    FREE_KB="$(df -Pk "$VENV_ABS" | awk 'NR == 2 {print $4}')"
    if [ -n "$FREE_KB" ] && [ "$FREE_KB" -lt "$NEED_KB" ]; then
        die "only $((FREE_KB / 1024)) MB free on the disk of $VENV_ABS; installing torch $TORCH_VERSION (a CUDA build, with its NVIDIA libraries) and the other packages needs about 7 GB. Free some space, or point VENV at a disk with room."
    fi
fi

# ---------------------------------------------------------------------------
step "packages (one pip run)"
# mmcv is built in the next step; mmengine is installed there with --no-deps
# because its wheel asks for opencv-python next to our headless OpenCV.
MM_REST="$WORK_DIR/mm-rest.txt"
req_lines requirements/mm.txt | grep -Ev '^(mmcv|mmengine)([^a-zA-Z0-9_.-]|$)' > "$MM_REST"
"${PIP[@]}" install --progress-bar off --prefer-binary -c "$CONSTRAINTS" \
    "${TORCH_REQS[@]}" \
    -r requirements/env.txt -r requirements/runtime.txt \
    -r requirements/tests.txt -r requirements/export.txt -r "$MM_REST"

# ---------------------------------------------------------------------------
step "mmcv $MMCV_VERSION with compiled ops"
# Decide CPU or CUDA ops, and name the wheel-cache folder after what the
# compiled ops depend on.
OPS_INFO="$("$PY" - <<'EOF'
import os, re, sys
import torch
from torch.utils.cpp_extension import CUDA_HOME

force = os.environ.get('FORCE_CUDA', '')
gpu = torch.cuda.is_available()
cuda_build = torch.version.cuda
if force == '1':
    if not cuda_build:
        sys.exit('FORCE_CUDA=1, but this torch is a CPU-only build')
    if CUDA_HOME is None:
        sys.exit('FORCE_CUDA=1, but no CUDA toolkit found (put nvcc on PATH '
                 'or set CUDA_HOME)')
    mode, why = 'cuda', 'FORCE_CUDA=1'
elif force == '0':
    mode, why = 'cpu', 'FORCE_CUDA=0'
elif gpu and cuda_build and CUDA_HOME is not None:
    mode, why = 'cuda', f'torch sees a GPU and a CUDA toolkit is at {CUDA_HOME}'
elif gpu and cuda_build:
    mode, why = 'cpu', ('torch sees a GPU but no CUDA toolkit was found; '
                        'install one and set FORCE_CUDA=1 for CUDA ops')
else:
    mode, why = 'cpu', 'torch sees no GPU (set FORCE_CUDA=1 to build CUDA ops anyway)'
key = f'py{sys.version_info[0]}{sys.version_info[1]}-torch{torch.__version__}'
if mode == 'cuda':
    arch = os.environ.get('TORCH_CUDA_ARCH_LIST', '')
    if not arch and gpu:
        caps = sorted({torch.cuda.get_device_capability(i)
                       for i in range(torch.cuda.device_count())})
        arch = ' '.join(f'{a}.{b}' for a, b in caps)
    arch = re.sub(r'[^0-9A-Za-z.]+', '_', arch.strip()) or 'default'
    key += f'-cu{cuda_build}-arch{arch}'
else:
    key += '-cpu'
major, minor = (int(x) for x in re.match(r'(\d+)\.(\d+)', torch.__version__).groups())
# torch >= 2.13 headers need C++20; mmcv's setup.py asks for C++17.
std = 'c++20' if (major, minor) >= (2, 13) else 'c++17'
print(mode, key, std, why, sep='|')
EOF
)" || die "could not decide how to build mmcv's ops (see above)"
IFS='|' read -r OPS_MODE OPS_KEY CXX_STD OPS_WHY <<< "$OPS_INFO"
say "ops: $OPS_MODE ($OPS_WHY)"

mmcv_installed_ok() {
    # Succeeds when mmcv $MMCV_VERSION with ops of the wanted kind is installed.
    "$PY" - "$MMCV_VERSION" "$OPS_MODE" <<'EOF' >/dev/null 2>&1
import sys, importlib.metadata as md
import torch
if md.version('mmcv') != sys.argv[1]:
    sys.exit(1)
import mmcv._ext as ext
from mmcv.ops import nms, RoIAlign
cuda = ext.get_compiling_cuda_version() != 'not available'
sys.exit(0 if cuda == (sys.argv[2] == 'cuda') else 1)
EOF
}

WHEEL_DIR="$WHEEL_ROOT/mmcv-$MMCV_VERSION/$OPS_KEY"
WHEEL="$(ls "$WHEEL_DIR"/mmcv-"$MMCV_VERSION"-*.whl 2>/dev/null | head -n 1 || true)"
if mmcv_installed_ok; then
    say "mmcv $MMCV_VERSION with $OPS_MODE ops is already installed here"
else
    if [ -n "$WHEEL" ]; then
        say "reusing the cached wheel $WHEEL"
    else
        say "no cached wheel in $WHEEL_DIR: building mmcv $MMCV_VERSION from its sdist"
        say "(CPU ops take about 6-10 minutes on 2 cores; the wheel is cached for later runs)"
        SDIST_DIR="$WORK_DIR/sdist"
        mkdir -p "$SDIST_DIR" "$LOG_DIR"
        # pip reads the sdist's metadata by running its setup.py, which
        # imports torch: hide any GPU so that this stays a quick CPU-only pass.
        CUDA_VISIBLE_DEVICES="" FORCE_CUDA=0 MMCV_WITH_OPS=1 \
            "${PIP[@]}" download --progress-bar off --no-deps --no-build-isolation \
            --no-binary mmcv "mmcv==$MMCV_VERSION" -d "$SDIST_DIR"
        SDIST="$(ls "$SDIST_DIR"/mmcv-"$MMCV_VERSION".tar.gz 2>/dev/null || true)"
        [ -n "$SDIST" ] || die "pip did not download mmcv-$MMCV_VERSION.tar.gz"
        tar -xzf "$SDIST" -C "$WORK_DIR"
        SRC="$WORK_DIR/mmcv-$MMCV_VERSION"
        [ -f "$SRC/setup.py" ] || die "the mmcv sdist has no setup.py"
        if [ "$CXX_STD" = "c++20" ]; then
            grep -q -- '-std=c++17' "$SRC/setup.py" ||
                die "mmcv's setup.py no longer contains -std=c++17; the C++20 patch needs updating"
            sed -i 's/-std=c++17/-std=c++20/g' "$SRC/setup.py"
            say "patched mmcv's setup.py: -std=c++17 -> -std=c++20 (torch >= 2.13 headers need C++20)"
        fi
        # -g0: Python's default compile flags ask for debug info, which makes
        # the compile about a third slower and the library ~50x larger.
        # CPPFLAGS is appended after those flags (CFLAGS would replace them,
        # -O3 included, with current setuptools).
        BUILD_ENV=(MMCV_WITH_OPS=1 "MAX_JOBS=${MAX_JOBS:-$(nproc 2>/dev/null || echo 2)}"
            "CPPFLAGS=${CPPFLAGS:-} -g0")
        if [ "$OPS_MODE" = "cuda" ]; then
            BUILD_ENV+=(FORCE_CUDA=1)
        else
            # mmcv's setup.py builds CUDA ops whenever torch sees a GPU.
            BUILD_ENV+=(FORCE_CUDA=0 CUDA_VISIBLE_DEVICES=)
        fi
        # Sources that mmcv's setup.py compiles: pytorch/*.cpp and
        # pytorch/cpu/*.cpp, plus pytorch/cuda/* for CUDA ops.
        CSRC="$SRC/mmcv/ops/csrc/pytorch"
        SRC_DIRS=("$CSRC" "$CSRC/cpu")
        if [ "$OPS_MODE" = "cuda" ]; then SRC_DIRS+=("$CSRC/cuda"); fi
        N_SRC="$(find "${SRC_DIRS[@]}" -maxdepth 1 \( -name '*.cpp' -o -name '*.cu' \) | wc -l)"
        BUILD_LOG="$LOG_DIR/mmcv-$MMCV_VERSION-$OPS_KEY.log"
        say "compiling with ${BUILD_ENV[*]}; full log: $BUILD_LOG"
        env "${BUILD_ENV[@]}" "${PIP[@]}" wheel --no-deps --no-build-isolation \
            --no-cache-dir -v -w "$WORK_DIR/dist" "$SRC" > "$BUILD_LOG" 2>&1 &
        BUILD_PID=$!
        T_BUILD=$(date +%s)
        TICKS=0
        while kill -0 "$BUILD_PID" 2>/dev/null; do
            sleep 5
            TICKS=$((TICKS + 1))
            if [ $((TICKS % 6)) -eq 0 ] && kill -0 "$BUILD_PID" 2>/dev/null; then
                N_OBJ="$( (find "$SRC/build" -name '*.o' 2>/dev/null || true) | wc -l)"
                say "  still compiling: $N_OBJ of $N_SRC objects, $(($(date +%s) - T_BUILD))s"
            fi
        done
        BUILD_RC=0
        wait "$BUILD_PID" || BUILD_RC=$?
        BUILD_PID=""
        if [ "$BUILD_RC" -ne 0 ]; then
            echo "----- last lines of $BUILD_LOG -----" >&2
            tail -n 60 "$BUILD_LOG" >&2
            die "building the mmcv wheel failed (exit status $BUILD_RC); full log: $BUILD_LOG"
        fi
        say "compiled in $(($(date +%s) - T_BUILD))s"
        BUILT="$(ls "$WORK_DIR"/dist/mmcv-"$MMCV_VERSION"-*.whl 2>/dev/null | head -n 1 || true)"
        [ -n "$BUILT" ] || die "pip reported success but wrote no mmcv wheel; see $BUILD_LOG"
        # A build that could not see torch silently leaves the ops out.
        "$PY" - "$BUILT" <<'EOF' || die "the built wheel has no compiled ops (mmcv/_ext*.so); see $BUILD_LOG"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
sys.exit(0 if any(n.startswith('mmcv/_ext') and n.endswith('.so') for n in names) else 1)
EOF
        mkdir -p "$WHEEL_DIR"
        WHEEL="$WHEEL_DIR/$(basename "$BUILT")"
        # Copy, then rename: a concurrent run never sees half a wheel.
        cp "$BUILT" "$WHEEL.part.$$"
        mv -f "$WHEEL.part.$$" "$WHEEL"
        say "cached the wheel as $WHEEL"
    fi
    "${PIP[@]}" install --progress-bar off --no-deps --force-reinstall "$WHEEL"
fi

# ---------------------------------------------------------------------------
step "mmengine $MMENGINE_VERSION and this project (no dependency changes)"
"${PIP[@]}" install --progress-bar off --no-deps --no-build-isolation \
    "mmengine==$MMENGINE_VERSION" -e "$REPO_ROOT"

# OpenCV: exactly one distribution, the headless one. A package that pulled in
# opencv-python shares the cv2 folder with it, so remove it and reinstall
# the headless files.
OTHER_CV="$("$PY" - <<'EOF'
import importlib.metadata as md
names = {(d.metadata['Name'] or '').lower() for d in md.distributions()}
print(' '.join(sorted(n for n in names
                      if n.startswith('opencv') and n != 'opencv-python-headless')))
EOF
)"
if [ -n "$OTHER_CV" ]; then
    say "removing $OTHER_CV (only opencv-python-headless is kept)"
    # shellcheck disable=SC2086
    "${PIP[@]}" uninstall -y $OTHER_CV
    "${PIP[@]}" install --progress-bar off --no-deps --force-reinstall \
        "opencv-python-headless$(req_lines requirements/env.txt | sed -n 's/^opencv-python-headless//p')"
fi

# pip check: mmengine's own wish for opencv-python is expected and ignored.
CHECK_OUT="$("${PIP[@]}" check 2>&1 || true)"
CHECK_BAD="$(echo "$CHECK_OUT" | grep -v -i -e 'No broken requirements' \
    -e '^mmengine .* requires opencv-python' || true)"
if [ -n "$CHECK_BAD" ]; then
    echo "$CHECK_BAD" >&2
    die "pip check found broken requirements (above)"
fi

# ---------------------------------------------------------------------------
step "check"
"$PY" tools/check_env.py || die "the environment check failed (reasons above)"
echo "$FINGERPRINT" > "$STAMP"
say "done in $(($(date +%s) - T_START))s; environment: $VENV_ABS"
