#!/usr/bin/env bash
# make demo: classify the sample raster with the demo model and say where the outputs are.
set -euo pipefail
bin=${1:-build/tilewise}
cd "$(dirname "$0")/.."
echo "== tilewise validate workflows/sample.yaml"
"$bin" validate workflows/sample.yaml
echo
echo "== tilewise run workflows/sample.yaml"
"$bin" run workflows/sample.yaml
echo
echo "Outputs are in $(pwd)/out/sample/ (open the .class.tif in QGIS: the legend comes with it)."
