#!/bin/bash
# Peak RSS of embedding_raster against the raster's size (issue 31.4):
# a headless ResNet-50 (random weights, seed 31, 6 bands; D = 2048) on the
# sample raster upsampled to W x H1 and W x H2 pixels (same width: memory may
# grow with the width, through one strip of output rows, not with the height),
# tile 32 = stride, products [embedding_raster], float32 and int8.
#   bench/emb_memory.sh [build/tilewise] [WIDTH] [H1] [H2]
set -euo pipefail
TW=$(realpath "${1:-build/tilewise}")
W=${2:-1024}; H1=${3:-512}; H2=${4:-2048}
SRC=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/emb_memory.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
/usr/bin/python3 - <<'PY'
import torch, torchvision
torch.manual_seed(31)
m = torchvision.models.resnet50()
m.conv1 = torch.nn.Conv2d(6, 64, 7, 2, 3, bias=False)
m.fc = torch.nn.Identity()
torch.save({"state_dict": {"backbone." + k: v for k, v in m.state_dict().items()}}, "ssl.ckpt")
PY
/usr/bin/python3 "$SRC/tools/export_model.py" ssl.ckpt -o r50.h5 >/dev/null
for H in "$H1" "$H2"; do
  gdal_translate -q -outsize "$W" "$H" -co TILED=YES "$SRC/sample_data/L7_ETMs.tif" "in_$H.tif"
done
for TYPE in float32 int8; do
  for H in "$H1" "$H2"; do
    cat > flow.yaml <<YAML
input: {path: in_$H.tif}
model: {weights: r50.h5, mean: [80, 70, 60, 60, 60, 60], std: [30, 30, 30, 30, 30, 30]}
tiling: {tile: 32, stride: 32}
runtime: {device: cpu, memory: 1GiB}
output: {dir: out_${TYPE}_$H, products: [embedding_raster], embedding_type: $TYPE}
YAML
    "$TW" run flow.yaml -q >/dev/null
    /usr/bin/python3 - "out_${TYPE}_$H/run.json" "$W" "$H" "$TYPE" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
d = os.path.dirname(sys.argv[1])
emb = [f for f in os.listdir(d) if f.endswith(".emb.tif")][0]
print(f"{sys.argv[4]:8s} {sys.argv[2]} x {sys.argv[3]} px: {r['tiles_classified']} tiles, "
      f"peak RSS {r['peak_rss_bytes'] / 2**20:.1f} MiB, estimate "
      f"{r['memory']['estimate'] / 2**20:.1f} MiB (strip {r['memory']['items']['strip'] / 2**20:.2f} MiB), "
      f"{r['seconds']:.1f} s, emb.tif {os.path.getsize(os.path.join(d, emb)) / 2**20:.1f} MiB")
PY
  done
done
