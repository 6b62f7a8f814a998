#!/bin/bash
# read_speed.sh - the raster reader alone, GDAL against the direct libtiff path
# (io/input/tiff_direct.c), on the layouts users' GeoTIFFs come in.
#
#   bench/read_speed.sh [BUILD_DIR]      (default build; needs its libtilewise_core.a)
#
# Makes 4096 x 4096 x 6 Byte copies of bench/cpu_vs_peers' mirrored raster
# (made from sample_data/L7_ETMs.tif when missing) in five tiled layouts
# (256 x 256 tiles: pixel- and band-interleaved, DEFLATE / ZSTD / none), then
# for each and for windows of 64, 224 and 256 pixels (256: whole tiles) runs bench/read_speed.c:
# row-major windows as the pipeline reads them, best of 3 passes from the page
# cache, GDAL and direct alternating. Prints windows/s and the ratio.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build}
work=${TMPDIR:-/tmp}/tilewise_read_speed
mkdir -p "$work"
src=${TMPDIR:-/tmp}/tilewise_cpu_vs_peers/l7_mirror_4096.tif
if [ ! -f "$src" ]; then
  src=$work/l7_mirror_4096.tif
  if [ ! -f "$src" ]; then
    # mirrored copies of L7_ETMs.tif, tiled each way up to 4096 x 4096
    /usr/bin/python3 - "$repo/sample_data/L7_ETMs.tif" "$src" <<'PY'
import sys
import numpy as np
from osgeo import gdal
ds = gdal.Open(sys.argv[1])
a = ds.ReadAsArray()
t = np.concatenate([a, a[:, :, ::-1]], axis=2)
t = np.concatenate([t, t[:, ::-1, :]], axis=1)
reps = (4096 + t.shape[1] - 1) // t.shape[1], (4096 + t.shape[2] - 1) // t.shape[2]
big = np.tile(t, (1, reps[0], reps[1]))[:, :4096, :4096]
out = gdal.GetDriverByName("GTiff").Create(sys.argv[2], 4096, 4096, big.shape[0], gdal.GDT_Byte,
                                           ["TILED=YES", "COMPRESS=DEFLATE"])
for i in range(big.shape[0]):
    out.GetRasterBand(i + 1).WriteArray(big[i])
out = None
PY
  fi
fi
gcc -O2 -I"$repo" $(gdal-config --cflags) "$repo/bench/read_speed.c" "$build/libtilewise_core.a" \
  -o "$work/read_speed" $(pkg-config --libs libtiff-4) $(gdal-config --libs) -lm -lpthread -fopenmp
declare -A layouts=(
  [pixel_deflate]="-co COMPRESS=DEFLATE"
  [pixel_zstd]="-co COMPRESS=ZSTD"
  [pixel_none]=""
  [band_deflate]="-co COMPRESS=DEFLATE -co INTERLEAVE=BAND"
  [band_none]="-co INTERLEAVE=BAND"
)
for name in pixel_deflate pixel_zstd pixel_none band_deflate band_none; do
  f=$work/$name.tif
  # shellcheck disable=SC2086
  [ -f "$f" ] || gdal_translate -q -co TILED=YES ${layouts[$name]} "$src" "$f"
  for tile in 64 224 256; do
    echo "== $name, windows of $tile"
    "$work/read_speed" "$f" "$tile" 3
  done
done
