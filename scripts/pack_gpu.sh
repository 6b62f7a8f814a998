#!/usr/bin/env bash
# pack_gpu.sh BUILD_DIR OUT_DIR - ship a built tilewise to a GPU machine.
#
# The target has the NVIDIA driver, CUDA, cuDNN and PyTorch, but none of
# GDAL, HDF5, libyaml or oneDNN (nor their long dependency tails). This packs
# the tilewise binary, every shared library ldd resolves for it except those
# the target already has (glibc, libstdc++/libgcc, the CUDA driver, cudart,
# cuDNN), and GDAL's and PROJ's data files into one xz-compressed tarball,
# plus a wrapper that unpacks it once and runs tilewise with the right
# LD_LIBRARY_PATH, GDAL_DATA and PROJ_DATA.
#
# Output:
#   OUT_DIR/tilewise-gpu.tar.xz   (must stay under 60 MiB)
#   OUT_DIR/tilewise-gpu          wrapper: ./tilewise-gpu run workflow.yaml ...
# On the target, cudart 13 and cuDNN 9 are found via ldconfig, /usr/local/cuda,
# or the nvidia-* Python wheels that PyTorch installs.
set -euo pipefail

die() { echo "pack_gpu.sh: $*" >&2; exit 1; }

[ $# -eq 2 ] || die "usage: pack_gpu.sh BUILD_DIR OUT_DIR"
build=$1
out=$2
bin="$build/tilewise"
[ -x "$bin" ] || die "$bin: no tilewise binary (build first)"
mkdir -p "$out"
out=$(cd "$out" && pwd)

limit=$((60 * 1024 * 1024))
name=tilewise-gpu
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/$name"
mkdir -p "$root/bin" "$root/lib" "$root/share"
cp "$bin" "$root/bin/tilewise"

# What the target provides itself: the C runtime, the C++ runtime, and the
# NVIDIA stack (which must match its driver, so never ours).
skip_re='^(linux-vdso|linux-gate|ld-linux|libc\.so|libm\.so|libmvec\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libanl\.so|libnsl\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda|libcudnn|libcudart|libnvidia|libnvrtc|libcublas)'

missing=$(ldd "$bin" | awk '/not found/ {print $1}')
[ -z "$missing" ] || die "$bin: libraries not found here: $missing"

n_libs=0
while read -r lib path; do
    base=$(basename "$lib")
    if [[ $base =~ $skip_re ]]; then continue; fi
    [ -n "$path" ] && [ -f "$path" ] || continue
    cp -L "$path" "$root/lib/$base"
    n_libs=$((n_libs + 1))
done < <(ldd "$bin" | awk '$2 == "=>" {print $1, $3} $2 != "=>" && $1 ~ /^\// {print $1, $1}')

# GDAL needs its data files for CRS work; PROJ needs proj.db.
gdal_data=$(gdal-config --datadir 2>/dev/null || true)
[ -n "$gdal_data" ] && [ -d "$gdal_data" ] || gdal_data=/usr/share/gdal
[ -d "$gdal_data" ] && cp -r "$gdal_data" "$root/share/gdal"
mkdir -p "$root/share/proj"
for f in /usr/share/proj/proj.db /usr/share/proj/proj.ini; do
    [ -f "$f" ] && cp "$f" "$root/share/proj/"
done

cat >"$root/run.sh" <<'EOF'
#!/bin/sh
# Run the packed tilewise with its own libraries and the target's CUDA/cuDNN.
here=$(dirname "$(readlink -f "$0")")
extra=""
add_dir() { [ -d "$1" ] && extra="${extra:+$extra:}$1"; }
has_lib() { ldconfig -p 2>/dev/null | grep -q "$1"; }
# cudart 13 and cuDNN 9: system-wide, in the CUDA toolkit, or in PyTorch's wheels.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib; do
    add_dir "$d"
done
if ! has_lib libcudnn.so.9 || ! has_lib libcudart.so.13; then
    for py in python3 /opt/torch/.venv/bin/python3; do
        sp=$("$py" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null) || continue
        for s in $sp; do
            for d in "$s"/nvidia/*/lib "$s"/nvidia/cu*/lib "$s"/torch/lib; do
                if [ -e "$d/libcudnn.so.9" ] || [ -e "$d/libcudart.so.13" ]; then add_dir "$d"; fi
            done
        done
    done
fi
export LD_LIBRARY_PATH="$here/lib${extra:+:$extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GDAL_DATA="${GDAL_DATA:-$here/share/gdal}"
export PROJ_DATA="${PROJ_DATA:-$here/share/proj}"
export PROJ_LIB="${PROJ_LIB:-$here/share/proj}"
exec "$here/bin/tilewise" "$@"
EOF
chmod +x "$root/run.sh"

tarball="$out/$name.tar.xz"
tar -C "$stage" -cf - "$name" | xz -9 -T2 -c >"$tarball.tmp"
mv "$tarball.tmp" "$tarball"

cat >"$out/$name" <<'EOF'
#!/bin/sh
# Unpack tilewise-gpu.tar.xz next to this script (or into $TILEWISE_UNPACK_DIR)
# on first use, then run tilewise from it: ./tilewise-gpu run workflow.yaml
set -e
here=$(dirname "$(readlink -f "$0")")
dest="${TILEWISE_UNPACK_DIR:-$here}"
if [ ! -x "$dest/tilewise-gpu/run.sh" ] || [ "$here/tilewise-gpu.tar.xz" -nt "$dest/tilewise-gpu/run.sh" ]; then
    mkdir -p "$dest"
    rm -rf "$dest/tilewise-gpu"
    tar -C "$dest" -xJf "$here/tilewise-gpu.tar.xz"
    touch "$dest/tilewise-gpu/run.sh"
fi
exec "$dest/tilewise-gpu/run.sh" "$@"
EOF
chmod +x "$out/$name"

size=$(stat -c %s "$tarball")
raw=$(du -sb "$root" | cut -f1)
printf 'pack_gpu.sh: %s: %d libraries, %.1f MiB unpacked, %.1f MiB compressed (limit 60 MiB)\n' \
    "$tarball" "$n_libs" "$(echo "$raw / 1048576" | bc -l)" "$(echo "$size / 1048576" | bc -l)"
[ "$size" -lt "$limit" ] || die "$tarball is $size bytes, over the 60 MiB limit"
