#!/usr/bin/env bash
# gpu_checks.sh - the GPU checks of issue 4, one command each.
#
# Here (the development machine, no GPU needed), once per build:
#   bench/gpu_checks.sh prepare [BUILD_DIR]     (default build-cuda)
#     BUILD_DIR must be a -DTILEWISE_CUDA=ON build. Fills .carry/gpu/ (ignored
#     by git): tilewise-gpu + tilewise-gpu.tar.xz from scripts/pack_gpu.sh
#     (skipped while the tarball is newer than BUILD_DIR/tilewise: packing takes
#     ~6 min), test_cuda_backend with the one library the pack lacks for it
#     (libcmocka), and the input tiles of the model fixtures (tiles_64.f32,
#     from sample_data/L7_ETMs.tif; the models and PyTorch references are
#     rebuilt on the GPU machine: ResNet-50's weights alone would not fit the
#     64 MiB that travels).
#
# On the GPU machine (device tool: run with carry [".carry/gpu"]):
#   bench/gpu_checks.sh [--quick] [STEP...]     STEP: parity memory torch (default: all)
#     parity  test_cuda_backend (fp32 vs PyTorch on ResNet-18/50 <= 1e-3,
#             tf32/fp16/bf16, uint16 + nodata on the device, forced halving,
#             no host allocation in infer); then workflows/sample.yaml through
#             the packed tilewise on cpu and on cuda (fp32): class rasters equal,
#             probabilities within 1e-3
#     memory  bench/gpu_memory_sweep.py (extra options in $GPU_MEMORY_SWEEP_ARGS)
#     torch   bench/gpu_vs_torch.py (extra options in $GPU_VS_TORCH_ARGS,
#             e.g. "--cases r50")
# Logs and JSON go to $OUT (the device tool's folder that comes back), else
# /tmp/tw_gpu_checks. Exit status 0 only when every step passed.
# GPU_CHECKS_DRY_RUN=1 exercises the glue on a machine without a GPU (the
# Python scripts get --device cpu; whatever needs CUDA fails, as it should).
set -uo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
carry="$repo/.carry/gpu"
die() { echo "gpu_checks.sh: $*" >&2; exit 1; }

# ----------------------------------------------------------- prepare ----
prepare() {
    local build=${1:-build-cuda}
    [ -d "$build" ] || build="$repo/$build"
    [ -x "$build/tilewise" ] || die "$build/tilewise: no binary; build it first:
  cmake -S . -B build-cuda -DTILEWISE_WERROR=ON -DTILEWISE_CUDA=ON && cmake --build build-cuda -j2"
    [ -x "$build/test_cuda_backend" ] || die "$build/test_cuda_backend: missing (cmake --build $build -j2)"
    ldd "$build/tilewise" | grep -q libcudart || die "$build/tilewise does not link libcudart: not a -DTILEWISE_CUDA=ON build"
    mkdir -p "$carry/test/lib" "$carry/fixtures"
    if [ -f "$carry/tilewise-gpu.tar.xz" ] && [ "$carry/tilewise-gpu.tar.xz" -nt "$build/tilewise" ]; then
        echo "gpu_checks.sh: $carry/tilewise-gpu.tar.xz is newer than $build/tilewise: not packing again"
    else
        "$repo/scripts/pack_gpu.sh" "$build" "$carry" || die "scripts/pack_gpu.sh failed"
    fi
    cp "$build/test_cuda_backend" "$carry/test/"
    [ -x "$build/run_hooked" ] || die "$build/run_hooked: missing (cmake --build $build -j2)"
    cp "$build/run_hooked" "$carry/test/"
    # Libraries the test needs beyond tilewise's (cmocka), minus what the
    # target provides itself (same rule as pack_gpu.sh).
    local skip_re='^(linux-vdso|ld-linux|libc\.so|libm\.so|libmvec\.so|libpthread\.so|libdl\.so|librt\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda|libcudnn|libcudart|libnvidia|libnvrtc|libcublas)'
    local lib path have
    have=" $(ldd "$build/tilewise" | awk '{print $1}' | tr '\n' ' ') "
    rm -f "$carry/test/lib/"*
    while read -r lib path; do
        [[ $lib =~ $skip_re ]] && continue
        [[ $have == *" $lib "* ]] && continue
        cp -L "$path" "$carry/test/lib/$lib"
    done < <(ldd "$build/test_cuda_backend" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
    /usr/bin/python3 -c "import sys; sys.path.insert(0, '$repo/tests/fixtures'); import fx_models; fx_models.make_tiles('$carry/fixtures')" \
        || die "could not make the fixture tiles (needs /usr/bin/python3 with rasterio)"
    rm -f "$carry/fixtures/raster_stats.txt"
    local mib tree
    mib=$(du -sm "$carry" | cut -f1)
    tree=$(cd "$repo" && git ls-files -z | xargs -0 du -cm 2>/dev/null | tail -1 | cut -f1)
    echo "gpu_checks.sh: $carry holds $(ls "$carry/test/lib" | tr '\n' ' ')and ${mib} MiB; tracked tree ~${tree} MiB (limit 64 MiB in all)"
    [ $((mib + tree)) -lt 64 ] || echo "gpu_checks.sh: WARNING: over the device tool's 64 MiB" >&2
    echo "next: device tool run, carry [\".carry/gpu\"], command: bench/gpu_checks.sh"
}

# --------------------------------------------------------------- run ----
out=${OUT:-/tmp/tw_gpu_checks}
py=${PYTHON:-python3}
quick=()
dry=()
unpack=${TILEWISE_UNPACK_DIR:-/tmp/tw-unpack}
declare -A status

preflight() {
    mkdir -p "$out"
    [ -x "$carry/tilewise-gpu" ] && [ -f "$carry/tilewise-gpu.tar.xz" ] \
        || die "$carry/tilewise-gpu(.tar.xz) missing: run 'bench/gpu_checks.sh prepare' on the development machine and carry .carry/gpu"
    if [ -n "${GPU_CHECKS_DRY_RUN:-}" ]; then
        echo "gpu_checks.sh: GPU_CHECKS_DRY_RUN: no GPU required; the scripts run with --device cpu and every cuda run fails" >&2
        dry=(--device cpu)
    elif ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
        die "no NVIDIA GPU here (nvidia-smi missing or failing): these checks need the GPU machine (see bench/RESULTS.md, 'GPU (issue 4)')"
    else
        "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
            || die "$py: PyTorch missing or sees no CUDA device (set PYTHON to the python3 that has torch)"
    fi
    {
        date -u
        nvidia-smi -L
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
        "$py" -c 'import torch, torchvision; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "torchvision", torchvision.__version__)'
        nproc
    } >"$out/env.txt" 2>&1
    # Unpack once; env.sh = the pack's run.sh with its library search, but
    # running any program (the test binary) instead of tilewise.
    TILEWISE_UNPACK_DIR=$unpack "$carry/tilewise-gpu" --version >>"$out/env.txt" 2>&1 \
        || die "the packed tilewise does not start (see $out/env.txt)"
    local rs="$unpack/tilewise-gpu/run.sh"
    grep -q 'exec "$here/bin/tilewise" "$@"' "$rs" || die "$rs: no exec line to adapt (pack_gpu.sh changed?)"
    sed 's|exec "$here/bin/tilewise" "$@"|exec "$@"|' "$rs" >"$unpack/tilewise-gpu/env.sh"
    chmod +x "$unpack/tilewise-gpu/env.sh"
    local libs
    libs=$("$unpack/tilewise-gpu/env.sh" sh -c 'echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"; ldd "$0"' \
        "$unpack/tilewise-gpu/bin/tilewise" 2>&1)
    echo "$libs" | grep -E "LD_LIBRARY_PATH|cudart|cudnn|=> not found" >>"$out/env.txt"
    if echo "$libs" | grep -q "=> not found"; then
        die "libraries not found for the packed tilewise: $(echo "$libs" | grep '=> not found' | tr -s ' \t\n' ' ')"
    fi
    export TILEWISE_UNPACK_DIR=$unpack
    bin="$carry/tilewise-gpu"
}

step_parity() {
    local fx=/tmp/tw_gpu_fixtures
    mkdir -p "$fx"
    cp "$carry/fixtures/"tiles_64* "$fx/"
    echo "== fixtures: ResNet-18/50 and PyTorch float64 references ($py)"
    "$py" -c "import sys; sys.path.insert(0, '$repo/tests/fixtures'); import fx_models as f; f.make_resnet18('$fx'); f.make_resnet50('$fx')" \
        || { echo "FAIL: fixture generation"; return 1; }
    echo "== test_cuda_backend"
    local rc=0 log=/tmp/tw_gpu_test_cuda.log
    TW_FIXTURES=$fx LD_LIBRARY_PATH="$carry/test/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        "$unpack/tilewise-gpu/env.sh" "$carry/test/test_cuda_backend" 2>&1 | tee "$log" || rc=$?
    [ $rc -eq 0 ] || echo "FAIL: test_cuda_backend exited $rc"
    # With a GPU only the "no device" test may skip; any other skip means
    # the device or a fixture was not found, which is a failure here.
    local skipped
    skipped=$(awk '/^\[  SKIPPED \] test_/ && !seen[$4]++ {print $4}' "$log" | grep -v '^test_no_device_is_clear_error$')
    if [ -n "$skipped" ]; then
        echo "FAIL: device tests skipped on a GPU machine: $(echo $skipped)"
        rc=1
    fi
    echo "== sample workflow: cpu vs cuda (fp32) through the packed tilewise"
    local dev
    for dev in cpu cuda; do
        rm -rf "/tmp/tw_gpu_sample_$dev"
        (cd "$repo" && "$bin" run workflows/sample.yaml -q --set runtime.device=$dev \
            --set runtime.precision=fp32 --set output.dir=/tmp/tw_gpu_sample_$dev \
            --set "output.creation_options=[COMPRESS=NONE]") || { echo "FAIL: sample run on $dev"; rc=1; }
    done
    [ -f /tmp/tw_gpu_sample_cpu/run.json ] && [ -f /tmp/tw_gpu_sample_cuda/run.json ] || return 1
    "$py" - <<EOF || rc=1
import json, sys
import numpy as np
sys.path.insert(0, "$repo/bench")
from gpu_vs_torch import read_tiff
a, b = "/tmp/tw_gpu_sample_cpu", "/tmp/tw_gpu_sample_cuda"
rep = json.load(open(b + "/run.json"))
assert rep["backend"] == "cuda", "the cuda run used backend " + rep["backend"]
ca, cb = read_tiff(a + "/L7_ETMs.class.tif"), read_tiff(b + "/L7_ETMs.class.tif")
pa, pb = read_tiff(a + "/L7_ETMs.prob.tif"), read_tiff(b + "/L7_ETMs.prob.tif")
d = float(np.nanmax(np.abs(pa.astype(np.float64) - pb)))
n = int(np.count_nonzero(ca != cb))
print(f"sample: {ca.size} cells, classes differing {n}, prob max |dp| {d:.3g} "
      f"(backend_stats {rep['backend_stats']})")
ok = n == 0 and d <= 1e-3
print("sample cpu vs cuda:", "ok" if ok else "FAIL")
sys.exit(0 if ok else 1)
EOF
    return $rc
}

step_memory() {
    # shellcheck disable=SC2086
    "$py" "$repo/bench/gpu_memory_sweep.py" --bin "$bin" "${quick[@]}" "${dry[@]}" --json "$out/memory.json" \
        --hooked "$unpack/tilewise-gpu/env.sh $carry/test/run_hooked" \
        ${GPU_MEMORY_SWEEP_ARGS:-}
}

step_torch() {
    # shellcheck disable=SC2086
    "$py" "$repo/bench/gpu_vs_torch.py" --bin "$bin" "${quick[@]}" "${dry[@]}" --json "$out/vs_torch.json" \
        ${GPU_VS_TORCH_ARGS:-}
}

main() {
    if [ "${1:-}" = prepare ]; then
        shift
        prepare "$@"
        return
    fi
    local steps=()
    for a in "$@"; do
        case $a in
        --quick) quick=(--quick) ;;
        parity | memory | torch) steps+=("$a") ;;
        -h | --help) sed -n '2,30p' "$0"; return 0 ;;
        *) die "unknown argument '$a' (steps: parity memory torch; option --quick; or: prepare [BUILD_DIR])" ;;
        esac
    done
    [ ${#steps[@]} -gt 0 ] || steps=(parity memory torch)
    preflight
    export PYTHONUNBUFFERED=1
    local s fail=0
    for s in "${steps[@]}"; do
        local t0=$SECONDS
        echo "######## $s"
        if "step_$s" 2>&1 | tee "$out/$s.log"; then status[$s]=PASS; else status[$s]=FAIL; fail=1; fi
        echo "$s: ${status[$s]} ($((SECONDS - t0)) s)" | tee -a "$out/summary.txt"
        if [ "$s" = torch ]; then grep "(goal >=" "$out/torch.log" | sed 's/^/    /' | tee -a "$out/summary.txt"; fi
    done
    echo "logs: $out"
    return $fail
}

main "$@"
