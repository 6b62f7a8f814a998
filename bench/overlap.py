#!/usr/bin/python3
"""Stage overlap benchmark (issue: bounded memory and overlapped stages).

Builds a 4096 x 4096 six-band GeoTIFF (tiled, DEFLATE) from the real
sample_data/L7_ETMs.tif (mirrored copies, so every tile holds real pixels),
classifies it with tilewise, and prints, from run.json, the wall time of the
input's pipeline against the busy time of the busiest stage. With the stages
overlapped, wall <= 1.1 x busiest; run one after another they would add up.

usage: bench/overlap.py [--bin build/tilewise] [--model FILE] [--size 4096]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def make_raster(path, size):
    from osgeo import gdal
    gdal.UseExceptions()
    src = gdal.Open(os.path.join(REPO, "sample_data", "L7_ETMs.tif")).ReadAsArray()
    h, w = src.shape[1:]
    # mirror-tile the scene: continuous texture, real values everywhere
    tile = np.concatenate([src, src[:, :, ::-1]], axis=2)
    tile = np.concatenate([tile, tile[:, ::-1, :]], axis=1)
    reps_y, reps_x = -(-size // tile.shape[1]), -(-size // tile.shape[2])
    big = np.tile(tile, (1, reps_y, reps_x))[:, :size, :size]
    drv = gdal.GetDriverByName("GTiff")
    ds = drv.Create(path, size, size, 6, gdal.GDT_Byte,
                    ["TILED=YES", "BLOCKXSIZE=256", "BLOCKYSIZE=256", "COMPRESS=DEFLATE"])
    ds.SetProjection(gdal.Open(os.path.join(REPO, "sample_data", "L7_ETMs.tif")).GetProjection())
    ds.SetGeoTransform((288776.3, 28.5, 0, 9120748.2, 0, -28.5))
    for b in range(6):
        ds.GetRasterBand(b + 1).WriteArray(big[b])
    ds = None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "tilewise"))
    ap.add_argument("--model", default=os.path.join(REPO, "sample_data", "demo_resnet18.h5"))
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--memory", default="1GiB")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ras = os.path.join(tmp, "scene.tif")
        make_raster(ras, a.size)
        wf = os.path.join(tmp, "w.yaml")
        with open(wf, "w") as f:
            f.write(f"""input:
  path: {ras}
model:
  weights: {a.model}
tiling:
  tile: 64
  stride: 64
runtime:
  device: cpu
  memory: {a.memory}
output:
  dir: {tmp}/out
  products: [class, prob]
""")
        r = subprocess.run([a.bin, "run", wf, "-q"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(r.stderr)
        rep = json.load(open(os.path.join(tmp, "out", "run.json")))
    inp = rep["inputs"][0]
    stages = inp["stages"]
    busiest = max(stages, key=lambda s: stages[s]["busy_s"])
    wall = inp["seconds"]
    print(f"raster {a.size} x {a.size} x 6 Byte, model {os.path.basename(a.model)}, "
          f"batch {rep['memory']['batch']}, {inp['tiles_classified']} tiles, "
          f"{inp['tiles_classified'] / wall:.0f} tiles/s")
    for s, v in stages.items():
        print(f"  {s:9s} busy {v['busy_s']:7.2f} s   waiting {v['wait_s']:7.2f} s")
    total_busy = sum(v["busy_s"] for v in stages.values())
    print(f"wall {wall:.2f} s; busiest stage {busiest} {stages[busiest]['busy_s']:.2f} s; "
          f"sum of busy {total_busy:.2f} s")
    ratio = wall / stages[busiest]["busy_s"]
    print(f"wall / busiest = {ratio:.3f}  (goal <= 1.1)")
    return 0 if ratio <= 1.1 else 1


if __name__ == "__main__":
    sys.exit(main())
