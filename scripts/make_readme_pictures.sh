#!/usr/bin/env bash
# Make docs/sample_and_classes.png: the sample raster (bands 3,2,1 as RGB,
# stretched to 8 bits) next to its class map from the demo model, in the
# class map's own colour table. Only tilewise and GDAL's command-line tools
# are used (no ImageMagick): both halves are put on one canvas by a VRT
# mosaic, the class map shifted east of the image by its width plus a gap.
#
#   scripts/make_readme_pictures.sh [path/to/tilewise]   (default build/tilewise)
#
# Prints the legend (class, colour) as Markdown table rows for README.md.
set -euo pipefail
bin=${1:-build/tilewise}
bin=$(readlink -f "$bin")
cd "$(dirname "$0")/.."

raster=sample_data/L7_ETMs.tif
model=sample_data/demo_resnet18.h5
gap=12                                   # white pixels between the halves
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Stride 8 with 64-pixel tiles: a class map fine enough to read (44 x 44 cells).
"$bin" run workflows/sample.yaml -q \
    --set output.dir="$tmp/out" \
    --set tiling.stride=8 \
    --set 'output.products=[class]' \
    --set runtime.device=cpu >/dev/null
class="$tmp/out/L7_ETMs.class.tif"

read -r w h < <(gdalinfo "$raster" | sed -n 's/^Size is \([0-9]*\), \([0-9]*\)$/\1 \2/p')
read -r x0 y1 < <(gdalinfo "$raster" | sed -n 's/^Upper Left *( *\([-0-9.]*\), *\([-0-9.]*\)).*/\1 \2/p')
read -r x1 y0 < <(gdalinfo "$raster" | sed -n 's/^Lower Right *( *\([-0-9.]*\), *\([-0-9.]*\)).*/\1 \2/p')
px=$(awk -v a="$x0" -v b="$x1" -v n="$w" 'BEGIN { printf "%.10f\n", (b - a) / n }')

# Left: natural colours, each band stretched from mean - 2 sd .. mean + 3 sd
# to 0..255 (a min..max stretch leaves this scene dark: a few saturated
# pixels set the maximum). Statistics on a VRT in $tmp, so that gdalinfo
# -stats writes its .aux.xml there and not next to the sample.
gdal_translate -q -of VRT -b 3 -b 2 -b 1 "$raster" "$tmp/bgr.vrt"
scale=()
for band in 1 2 3; do
    read -r mean sd < <(gdalinfo -stats "$tmp/bgr.vrt" |
        sed -n 's/.*Mean=\([-0-9.e+]*\), StdDev=\([-0-9.e+]*\).*/\1 \2/p' | sed -n "${band}p")
    read -r lo hi < <(awk -v m="$mean" -v s="$sd" 'BEGIN { lo = m - 2 * s; if (lo < 0) lo = 0; printf "%g %g\n", lo, m + 3 * s }')
    scale+=("-scale_$band" "$lo" "$hi" 0 255)
done
gdal_translate -q -ot Byte "${scale[@]}" -a_nodata none -colorinterp red,green,blue \
    "$tmp/bgr.vrt" "$tmp/rgb.tif"

# Right: the class map through its colour table, on the image's pixel grid
# (nearest neighbour: each cell stays one class), moved east by w + gap pixels.
gdal_translate -q -expand rgb "$class" "$tmp/class_rgb.tif"
shift_x0=$(awk -v a="$x0" -v p="$px" -v n="$w" -v g="$gap" 'BEGIN { printf "%.6f", a + (n + g) * p }')
shift_x1=$(awk -v a="$x1" -v p="$px" -v n="$w" -v g="$gap" 'BEGIN { printf "%.6f", a + (n + g) * p }')
gdalwarp -q -overwrite -r near -te "$x0" "$y0" "$x1" "$y1" -ts "$w" "$h" \
    "$tmp/class_rgb.tif" "$tmp/class_grid.tif"
gdal_translate -q -a_ullr "$shift_x0" "$y1" "$shift_x1" "$y0" -colorinterp red,green,blue \
    "$tmp/class_grid.tif" "$tmp/class_shifted.tif"

# One canvas: the gap is filled with 255 (white) in every band.
gdalbuildvrt -q -srcnodata none -vrtnodata 255 "$tmp/both.vrt" "$tmp/rgb.tif" "$tmp/class_shifted.tif"
mkdir -p docs
gdal_translate -q -of PNG -a_nodata none "$tmp/both.vrt" docs/sample_and_classes.png
rm -f docs/sample_and_classes.png.aux.xml
echo "wrote docs/sample_and_classes.png ($((2 * w + gap)) x $h)"

# Legend rows: the class names and their colour table entries.
names=$(gdalinfo "$class" | sed -n '/^  Categories:/,/^  [A-Z]/p' | sed -n 's/^ *\([0-9]*\): \(.*\)$/\1 \2/p')
while read -r idx name; do
    rgb=$(gdalinfo "$class" | sed -n "/Color Table/,\$p" | sed -n "s/^ *$idx: \([0-9]*\),\([0-9]*\),\([0-9]*\),.*/\1 \2 \3/p" | head -1)
    read -r r g b <<<"$rgb"
    printf '| %s | `#%02x%02x%02x` |\n' "$name" "$r" "$g" "$b"
done <<<"$names"

# docs/tiles_and_pixels.png: the tile classifier's class map (stride 8, as
# above) beside the demo U-Net's per-pixel map (workflows/sample_seg.yaml),
# both through their colour tables, on the image's pixel grid.
"$bin" run workflows/sample_seg.yaml -q \
    --set output.dir="$tmp/seg" \
    --set 'output.products=[class]' >/dev/null
gdal_translate -q -expand rgb "$tmp/seg/L7_ETMs.class.tif" "$tmp/seg_rgb.tif"
gdal_translate -q -a_ullr "$shift_x0" "$y1" "$shift_x1" "$y0" -colorinterp red,green,blue \
    "$tmp/seg_rgb.tif" "$tmp/seg_shifted.tif"
gdal_translate -q -colorinterp red,green,blue "$tmp/class_grid.tif" "$tmp/class_left.tif"
gdalbuildvrt -q -srcnodata none -vrtnodata 255 "$tmp/pair.vrt" "$tmp/class_left.tif" \
    "$tmp/seg_shifted.tif"
gdal_translate -q -of PNG -a_nodata none "$tmp/pair.vrt" docs/tiles_and_pixels.png
rm -f docs/tiles_and_pixels.png.aux.xml
echo "wrote docs/tiles_and_pixels.png ($((2 * w + gap)) x $h)"
