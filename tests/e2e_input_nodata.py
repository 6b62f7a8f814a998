#!/usr/bin/python3
"""output.resolution: input keeps the input's nodata (issue 29.3).

A 6-band uint16 raster with nodata 0 over a triangle (x + y < 220) and a
few scattered nodata pixels, classified in tiles of 64 at the input's
resolution:
* every pixel that is nodata in the input is nodata in every product (class
  255, probabilities and confidence -1); before, bilinear resampling gave
  many of them a class;
* run.json's valid_pixels_unclassified counts exactly the pixels valid in the
  input that are nodata in the class map (their tiles were skipped for
  nodata), and it is above 0 here;
* validate warns that max_nodata_fraction leaves more than 1 % of the valid
  pixels unclassified; with max_nodata_fraction 1 it does not, and the run
  leaves far fewer valid pixels unclassified;
* shards + merge write the same bytes as one run (merge reads the input's
  nodata again).
"""
import json
import subprocess
import sys
import tempfile

import numpy as np

from e2eutil import BIN, FIX, check, gdal_or_skip

W = H = 256


def main():
    gdal = gdal_or_skip()
    if not gdal:
        return 77
    from osgeo import osr
    with tempfile.TemporaryDirectory() as tmp:
        raster = f"{tmp}/scene.tif"
        ds = gdal.GetDriverByName("GTiff").Create(raster, W, H, 6, gdal.GDT_UInt16)
        ds.SetGeoTransform((600000, 10, 0, 5000000, 0, -10))
        srs = osr.SpatialReference()
        srs.ImportFromEPSG(32632)
        ds.SetProjection(srs.ExportToWkt())
        rng = np.random.default_rng(11)
        yy, xx = np.mgrid[0:H, 0:W]
        nodata = (xx + yy < 220) | (rng.random((H, W)) < 0.002)
        for b in range(6):
            a = rng.integers(1, 3000, size=(H, W)).astype(np.uint16)
            a[nodata] = 0
            band = ds.GetRasterBand(b + 1)
            band.WriteArray(a)
            band.SetNoDataValue(0)
        ds = None

        def workflow(path, out, frac=0.5):
            with open(path, "w") as f:
                f.write(f"""input:
  path: {raster}
  scale: 0.0001
model:
  weights: {FIX}/resnet18_6b_7c.safetensors
  mean: [0.15, 0.15, 0.15, 0.15, 0.15, 0.15]
  std: [0.09, 0.09, 0.09, 0.09, 0.09, 0.09]
tiling:
  tile: 64
  max_nodata_fraction: {frac}
runtime:
  device: cpu
output:
  dir: {out}
  products: [class, prob, confidence]
  resolution: input
""")

        wf, out = f"{tmp}/w.yaml", f"{tmp}/out"
        workflow(wf, out)
        r = subprocess.run([BIN, "validate", wf], capture_output=True, text=True)
        check(r.returncode == 0 and "stay unclassified" in r.stdout and "max_nodata_fraction" in r.stdout,
              f"validate warns about unclassified valid pixels ({r.stdout[-600:]})", True)
        r = subprocess.run([BIN, "run", wf, "-q"], capture_output=True, text=True)
        check(r.returncode == 0, f"run: {r.stderr}")
        cls = gdal.Open(f"{out}/scene.class.tif").ReadAsArray()
        prob = gdal.Open(f"{out}/scene.prob.tif").ReadAsArray()
        conf = gdal.Open(f"{out}/scene.conf.tif").ReadAsArray()
        check(cls.shape == (H, W), f"class map at the input's grid {cls.shape}")
        got = int((cls[nodata] != 255).sum())
        check(got == 0, f"every input-nodata pixel is nodata in the class map ({got} of "
              f"{int(nodata.sum())} got a class)", True)
        check(bool((prob[:, nodata] == -1).all()) and bool((conf[nodata] == -1).all()),
              "and in the probabilities and the confidence", True)
        lost = int(((cls == 255) & ~nodata).sum())
        with open(f"{out}/run.json") as f:
            rep = json.load(f)["inputs"][0]
        check(lost > 0 and rep["valid_pixels_unclassified"] == lost,
              f"run.json counts the valid pixels left unclassified: "
              f"{rep['valid_pixels_unclassified']} == {lost}", True)

        # shards + merge: merge reads the input's nodata again, same bytes
        sh = f"{tmp}/shards"
        for i in (1, 2):
            r = subprocess.run([BIN, "run", wf, "-q", "--shard", f"{i}/2", "--set",
                                f"output.dir={sh}"], capture_output=True, text=True)
            check(r.returncode == 0, f"shard {i}/2: {r.stderr}")
        r = subprocess.run([BIN, "merge", "-q", sh], capture_output=True, text=True)
        check(r.returncode == 0, f"merge: {r.stderr}")
        merged = gdal.Open(f"{sh}/scene.class.tif").ReadAsArray()
        check(np.array_equal(merged, cls), "merged shards equal one run", True)

        wf2, out2 = f"{tmp}/w2.yaml", f"{tmp}/out2"
        workflow(wf2, out2, frac=1)
        r = subprocess.run([BIN, "validate", wf2], capture_output=True, text=True)
        check(r.returncode == 0 and "stay unclassified" not in r.stdout,
              "max_nodata_fraction 1: no such warning", True)
        r = subprocess.run([BIN, "run", wf2, "-q"], capture_output=True, text=True)
        with open(f"{out2}/run.json") as f:
            lost2 = json.load(f)["inputs"][0]["valid_pixels_unclassified"]
        check(r.returncode == 0 and lost2 < lost,
              f"max_nodata_fraction 1 leaves fewer valid pixels unclassified ({lost2} < {lost})",
              True)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
