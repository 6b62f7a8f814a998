#!/bin/bash
# identity_cost.sh - what the resume fingerprint of a local input costs
# (io/input/identity.c: size, mtime, sampled SHA-256 and TIFF block index of every
# file of the dataset), against the run it belongs to.
#
#   bench/identity_cost.sh [BUILD_DIR]    (default build; needs libtilewise_core.a and tilewise)
#
# Makes two 32768 x 32768 x 3 Byte GeoTIFFs, 256 x 256 tiles, in
# ${TMPDIR:-/tmp}/tilewise_identity (3 GiB uncompressed and its DEFLATE copy,
# both of mirrored copies of sample_data/L7_ETMs.tif), then
# * bench/identity_cost.c: seconds and bytes read of the identity, with the
#   file's pages evicted first (cold) and again (warm);
# * tilewise run --shard 1/64 of the DEFLATE file (ResNet-18 fixture, tile 64,
#   bands 1,2,3,1,2,3, CPU): the run's seconds for 1/64 of the rows, and x64
#   for the whole raster.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build}
work=${TMPDIR:-/tmp}/tilewise_identity
mkdir -p "$work"
for kind in none deflate; do
  f=$work/s32k_$kind.tif
  [ -f "$f" ] && continue
  /usr/bin/python3 - "$repo/sample_data/L7_ETMs.tif" "$f" "$kind" <<'PY'
import sys
import numpy as np
from osgeo import gdal
gdal.UseExceptions()
a = gdal.Open(sys.argv[1]).ReadAsArray()[:3]
t = np.concatenate([a, a[:, :, ::-1]], axis=2)
t = np.concatenate([t, t[:, ::-1, :]], axis=1)          # 698 x 698, seamless
n = 32768
reps = -(-n // t.shape[1])
row = np.tile(t, (1, 1, reps))[:, :, :n]                 # 3 x 698 x 32768
opts = ["TILED=YES", "BLOCKXSIZE=256", "BLOCKYSIZE=256", "BIGTIFF=YES", "NUM_THREADS=2"]
if sys.argv[3] == "deflate":
    opts.append("COMPRESS=DEFLATE")
ds = gdal.GetDriverByName("GTiff").Create(sys.argv[2], n, n, 3, gdal.GDT_Byte, opts)
y = 0
while y < n:
    h = min(row.shape[1], n - y)
    for b in range(3):
        ds.GetRasterBand(b + 1).WriteArray(row[b, :h], 0, y)
    y += h
ds = None
PY
done
ls -l "$work"/s32k_*.tif
gcc -O2 -I"$repo" $(gdal-config --cflags) "$repo/bench/identity_cost.c" \
  "$build/libtilewise_core.a" "$build/libtilewise_base.a" -o "$work/identity_cost" \
  $(pkg-config --libs libtiff-4 nettle) $(gdal-config --libs) -lm -lpthread
"$work/identity_cost" "$work/s32k_none.tif" "$work/s32k_deflate.tif"

fix=$build/fixtures/resnet18_6b_7c.safetensors
cat > "$work/run.yaml" <<EOF
input:
  path: $work/s32k_deflate.tif
  bands: [1, 2, 3, 1, 2, 3]
model:
  weights: $fix
  mean: [79.0, 67.5, 64.4, 79.0, 67.5, 64.4]
  std: [14.7, 16.4, 21.6, 14.7, 16.4, 21.6]
tiling:
  tile: 64
runtime:
  device: cpu
  memory: 2GiB
output:
  dir: $work/out
  products: [class]
EOF
rm -rf "$work/out"
t0=$(date +%s.%N)
"$build/tilewise" run "$work/run.yaml" -q --shard 1/64
t1=$(date +%s.%N)
python3 -c "s=$t1-$t0; print(f'run, shard 1/64 of the DEFLATE file: {s:.1f} s; x64: {64*s:.0f} s for the whole raster')"
