#!/bin/bash
# Peak RSS of a segmentation run against the raster's size (issue 36, "Memory"):
# the demo U-Net (sample_data/demo_unet_resnet18.h5) on the sample raster
# upsampled to each size, tile 64, stride 48 (any stride: per-pixel blending,
# tiling.blend cosine), products [class, prob, confidence] per pixel,
# runtime.memory 512MiB. Peak RSS is run.json's peak_rss_bytes; the estimate and
# its strip (the blender's tile rows and the rows on their way to the chunks)
# validate's budget. Memory may grow with the width (one strip of pixel rows),
# never with the height.
#   bench/seg_memory.sh [build/tilewise] [SIZE...]   (SIZE: WxH, default 1024x1024
#                                                    2048x2048 4096x4096 8192x2048)
set -euo pipefail
TW=$(realpath "${1:-build/tilewise}")
shift || true
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(1024x1024 2048x2048 4096x4096 8192x2048)
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/seg_memory.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
echo "| W x H pixels | tiles | peak RSS | estimate (strip) | worst case | seconds |"
echo "|---|---|---|---|---|---|"
for S in "${SIZES[@]}"; do
  W=${S%x*}; H=${S#*x}
  gdal_translate -q -outsize "$W" "$H" -co TILED=YES "$SRC/sample_data/L7_ETMs.tif" "in_$S.tif"
  cat > flow.yaml <<YAML
input: {path: in_$S.tif, bands: [1, 2, 3, 4, 5, 6]}
model: {weights: $SRC/sample_data/demo_unet_resnet18.h5}
tiling: {tile: 64, stride: 48, blend: cosine}
runtime: {device: cpu, memory: 512MiB}
output: {dir: out_$S, products: [class, prob, confidence]}
YAML
  "$TW" run flow.yaml -q >/dev/null
  /usr/bin/python3 - "out_$S/run.json" "$W" "$H" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
m = r["memory"]
print(f"| {sys.argv[2]} x {sys.argv[3]} | {r['tiles_classified']} | "
      f"{r['peak_rss_bytes'] / 2**20:.1f} MiB | {m['estimate'] / 2**20:.1f} MiB "
      f"({m['items']['strip'] / 2**20:.2f} MiB) | {m['worst_case'] / 2**20:.1f} MiB | "
      f"{r['seconds']:.0f} |")
PY
  rm -rf "out_$S" "in_$S.tif"
done
