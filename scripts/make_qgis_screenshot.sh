#!/usr/bin/env bash
# docs/qgis_class_map.png: QGIS 3.22 (Debian's qgis, under Xvfb) showing the
# demo's class map with the legend the tilewise provider gives it (colours and
# class names from the file). Usage: scripts/make_qgis_screenshot.sh [BUILD_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
(cd "$here" && "$build/tilewise" run workflows/sample.yaml -q --set "output.dir=$tmp/out" \
  --set output.products=[class] --set runtime.device=cpu)
mkdir -p "$tmp/profiles/default/QGIS" "$tmp/xdg"
chmod 700 "$tmp/xdg"
printf '[qgis]\ncheckVersion=false\nshowTips322=false\nshowTips=false\n[core]\nNewsFeed\\httpsfeedqgisorg\\disabled=true\n' \
  > "$tmp/profiles/default/QGIS/QGIS3.ini"
HOME=$tmp XDG_RUNTIME_DIR=$tmp/xdg TW_CLASS_TIF=$tmp/out/L7_ETMs.class.tif \
  TW_SHOT=$tmp/shot.png TW_PLUGINS=$tmp/prefix/share/tilewise/qgis \
  timeout 120 xvfb-run -a -s "-screen 0 1024x700x24" \
  qgis --nologo --noplugins --profiles-path "$tmp/profiles" --code "$here/scripts/qgis_screenshot.py" \
  >/dev/null 2>&1 || true
test -s "$tmp/shot.png" || { echo "no screenshot made" >&2; exit 1; }
cp "$tmp/shot.png" "$here/docs/qgis_class_map.png"
echo "wrote docs/qgis_class_map.png ($(stat -c %s "$here/docs/qgis_class_map.png") bytes)"
