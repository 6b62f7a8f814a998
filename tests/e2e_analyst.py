#!/usr/bin/python3
"""Analyst controls on sample_data/L7_ETMs.tif.

* output.resolution: input: class, prob and conf rasters have the input's
  size and exactly its geotransform and CRS; the class map at every cell
  centre (tile 63, stride 21: pixel 10 of a cell is its centre) equals the
  cell map of the same run at output.resolution: cells; probabilities sum to
  1; the class map is the argmax of the probability raster everywhere; with
  input.aoi, pixels far from every computed cell are nodata.
* model.colors: the class map's colour table holds the given colours.
* Default compression: DEFLATE with PREDICTOR 2 (Byte) / 3 (float32); an
  explicit COMPRESS in output.creation_options wins.
* uint8 probabilities of a 3-class model are not tagged Red/Green/Blue.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

from e2eutil import BIN, FIX, SRC, check, gdal_or_skip

sys.path.insert(0, os.path.join(SRC or ".", "tools"))


def workflow(path, out, extra_model="", extra_output="", tile=64, stride=32, weights=None,
             products="[class, prob, confidence]"):
    with open(path, "w") as f:
        f.write(f"""input:
  path: {SRC}/sample_data/L7_ETMs.tif
model:
  weights: {weights or f"{FIX}/resnet18_6b_7c.safetensors"}
  mean: [79.0, 67.5, 64.4, 60.0, 80.0, 60.0]
  std: [14.7, 16.4, 21.6, 15.0, 25.0, 20.0]
{extra_model}
tiling:
  tile: {tile}
  stride: {stride}
runtime:
  device: cpu
  memory: 1GiB
  threads: 1
output:
  dir: {out}
  products: {products}
{extra_output}
""")


def run(wf, *args):
    r = subprocess.run([BIN, "run", wf, "-q", *args], capture_output=True, text=True, timeout=600)
    check(r.returncode == 0, f"run {os.path.basename(wf)} {args}: {r.stderr}")


def main():
    gdal = gdal_or_skip()
    if not gdal:
        return 77
    src = gdal.Open(f"{SRC}/sample_data/L7_ETMs.tif")
    with tempfile.TemporaryDirectory() as tmp:
        # ---- output.resolution: input
        wf = f"{tmp}/res.yaml"
        workflow(wf, f"{tmp}/cells", tile=63, stride=21)
        run(wf)
        run(wf, "--set", f"output.dir={tmp}/input", "--set", "output.resolution=input")
        cells = gdal.Open(f"{tmp}/cells/L7_ETMs.class.tif").ReadAsArray()
        for prod in ("class", "prob", "conf"):
            ds = gdal.Open(f"{tmp}/input/L7_ETMs.{prod}.tif")
            check((ds.RasterXSize, ds.RasterYSize) == (src.RasterXSize, src.RasterYSize) and
                  ds.GetGeoTransform() == src.GetGeoTransform() and
                  ds.GetProjection() == src.GetProjection(),
                  f"{prod} at output.resolution: input has the input's size, geotransform and CRS",
                  True)
        cls = gdal.Open(f"{tmp}/input/L7_ETMs.class.tif").ReadAsArray()
        prob = gdal.Open(f"{tmp}/input/L7_ETMs.prob.tif").ReadAsArray()
        S = 21
        gh, gw = cells.shape
        centres = cls[S // 2::S, S // 2::S]
        ch, cw = centres.shape
        check(np.array_equal(centres, cells[:ch, :cw]),
              f"the class map equals the cell map at all {ch * cw} cell centres", True)
        check(np.allclose(prob.sum(0), 1.0, atol=1e-5), "probabilities sum to 1 at every pixel",
              True)
        check(np.array_equal(cls, prob.argmax(0)), "the class map is the argmax of prob", True)

        # shards + merge write the products as one run does (the merge reads the
        # resolution and the colours from the manifest)
        shard_args = ["--set", f"output.dir={tmp}/shards", "--set", "output.resolution=input"]
        for i in (1, 2):
            run(wf, *shard_args, "--shard", f"{i}/2")
        r = subprocess.run([BIN, "merge", f"{tmp}/shards", "-q"], capture_output=True, text=True)
        check(r.returncode == 0, f"merge: {r.stderr}")
        for prod in ("class", "prob"):
            a = gdal.Open(f"{tmp}/input/L7_ETMs.{prod}.tif")
            b = gdal.Open(f"{tmp}/shards/L7_ETMs.{prod}.tif")
            check(a.GetGeoTransform() == b.GetGeoTransform() and
                  np.array_equal(a.ReadAsArray(), b.ReadAsArray()),
                  f"2 shards + merge at output.resolution: input: the {prod} raster of one run",
                  True)

        # with an AOI the pixels far from every computed cell are nodata
        from osgeo import ogr, osr
        gt = src.GetGeoTransform()
        srs = osr.SpatialReference()
        srs.ImportFromWkt(src.GetProjection())
        aoi = f"{tmp}/aoi.geojson"
        x0, y0 = gt[0] + 10 * gt[1], gt[3] + 10 * gt[5]
        x1, y1 = gt[0] + 40 * gt[1], gt[3] + 40 * gt[5]
        v = ogr.GetDriverByName("GeoJSON").CreateDataSource(aoi)
        layer = v.CreateLayer("aoi", srs, ogr.wkbPolygon)
        feat = ogr.Feature(layer.GetLayerDefn())
        feat.SetGeometry(ogr.CreateGeometryFromWkt(
            f"POLYGON(({x0} {y0},{x1} {y0},{x1} {y1},{x0} {y1},{x0} {y0}))"))
        layer.CreateFeature(feat)
        v = None
        run(wf, "--set", f"output.dir={tmp}/aoi", "--set", "output.resolution=input", "--set",
            f"input.aoi={aoi}")
        a = gdal.Open(f"{tmp}/aoi/L7_ETMs.class.tif").ReadAsArray()
        check(a[200:, 200:].max() == 255 and a[0:63, 0:63].max() < 255,
              "with input.aoi: classified near the polygon, nodata far from it", True)

        # ---- model.colors, default compression, explicit options win
        wf = f"{tmp}/colors.yaml"
        colors = ["#102030", "#405060", "#708090", "#a0b0c0", "#d0e0f0", "#112233", "#445566"]
        workflow(wf, f"{tmp}/colors", extra_model="  colors: [" +
                 ", ".join(f"'{c}'" for c in colors) + "]")
        run(wf)
        cds = gdal.Open(f"{tmp}/colors/L7_ETMs.class.tif")  # keep: its band dies with it
        ct = cds.GetRasterBand(1).GetColorTable()
        got = ["#%02x%02x%02x" % ct.GetColorEntry(i)[:3] for i in range(len(colors))]
        check(got == colors, f"model.colors make the colour table ({got})", True)
        for i in (1, 2):
            run(wf, "--set", f"output.dir={tmp}/colors_shards", "--shard", f"{i}/2")
        r = subprocess.run([BIN, "merge", f"{tmp}/colors_shards", "-q"], capture_output=True,
                           text=True)
        check(r.returncode == 0, f"merge: {r.stderr}")
        mds = gdal.Open(f"{tmp}/colors_shards/L7_ETMs.class.tif")  # keep, as above
        mct = mds.GetRasterBand(1).GetColorTable()
        got = ["#%02x%02x%02x" % mct.GetColorEntry(i)[:3] for i in range(len(colors))]
        check(got == colors, "2 shards + merge keep model.colors", True)
        for prod, pred in (("class", "2"), ("prob", "3"), ("conf", "3")):
            md = gdal.Open(f"{tmp}/colors/L7_ETMs.{prod}.tif").GetMetadata("IMAGE_STRUCTURE")
            check(md.get("COMPRESSION") == "DEFLATE" and md.get("PREDICTOR") == pred,
                  f"{prod}: DEFLATE with predictor {pred} by default ({md})", True)
        run(wf, "--set", f"output.dir={tmp}/lzw", "--set", "output.creation_options=[COMPRESS=LZW]")
        md = gdal.Open(f"{tmp}/lzw/L7_ETMs.prob.tif").GetMetadata("IMAGE_STRUCTURE")
        check(md.get("COMPRESSION") == "LZW" and "PREDICTOR" not in md,
              f"an explicit COMPRESS wins ({md})", True)
        r = subprocess.run([BIN, "run", wf, "-q", "--set", "model.colors=['#102030']"],
                           capture_output=True, text=True)
        check(r.returncode == 2 and "model.colors has 1 colours" in r.stderr,
              f"model.colors of the wrong length: {r.stderr.strip()}", True)
        r = subprocess.run([BIN, "validate", wf, "--set", "model.colors=[blue]"],
                           capture_output=True, text=True)
        check(r.returncode == 2 and "'#rrggbb'" in r.stderr,
              f"a bad colour: {r.stderr.strip()}", True)

        # ---- uint8 probabilities of 3 classes are not an RGB image
        import safetensors_io
        sd, _ = safetensors_io.load(f"{FIX}/resnet18_6b_7c.safetensors")
        sd["fc.weight"] = sd["fc.weight"][:3].copy()
        sd["fc.bias"] = sd["fc.bias"][:3].copy()
        three = f"{tmp}/three.safetensors"
        with open(three, "wb") as f:
            f.write(safetensors_io.encode(sd))
        wf = f"{tmp}/three.yaml"
        workflow(wf, f"{tmp}/three", weights=three, products="[prob]",
                 extra_output="  prob_type: uint8")
        run(wf)
        ds = gdal.Open(f"{tmp}/three/L7_ETMs.prob.tif")
        interp = [gdal.GetColorInterpretationName(ds.GetRasterBand(b).GetColorInterpretation())
                  for b in (1, 2, 3)]
        check(ds.RasterCount == 3 and "Red" not in interp and "Green" not in interp and
              "Blue" not in interp, f"3 uint8 probability bands are not RGB ({interp})", True)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
