#!/usr/bin/env bash
# make demo: classify the sample raster with the demo models (a tile classifier, then a
# U-Net giving a class per pixel) and say where the outputs are.
set -euo pipefail
bin=${1:-build/tilewise}
cd "$(dirname "$0")/.."
echo "== tilewise validate workflows/sample.yaml"
"$bin" validate workflows/sample.yaml
echo
echo "== tilewise run workflows/sample.yaml"
"$bin" run workflows/sample.yaml
echo
echo "== tilewise run workflows/sample_seg.yaml (a U-Net: a class per pixel)"
"$bin" run workflows/sample_seg.yaml
echo
echo "Outputs are in $(pwd)/out/sample/ (the tile classifier's) and $(pwd)/out/sample_seg/"
echo "(the U-Net's per-pixel map); open the .class.tif files in QGIS: the legend comes with them."
