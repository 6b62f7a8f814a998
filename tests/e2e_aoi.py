#!/usr/bin/python3
"""input.aoi on a real raster (sample_data/L7_ETMs.tif, SIRGAS 2000 / UTM 25S).

* A polygon covering part of the raster (pixels x 100..300, y 50..130) in the
  raster's CRS, as a GeoPackage: only the tiles whose footprint touches it are
  computed (counted independently here: 40 of 100 with tile 64, stride 32);
  run.json says so (tiles_classified + tiles_outside_aoi = tiles_total);
  every output cell inside the polygon equals the full run's, cells no
  computed tile covers are nodata.
* The same polygon in WGS84 (EPSG:4326), as GeoJSON: the same tiles, the
  same bytes.
* validate says how many tiles touch it; an AOI file that cannot be opened
  fails before any tile (exit 3, naming input.aoi).
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from e2eutil import BIN, FIX, SRC, check, gdal_or_skip

X0, X1, Y0, Y1 = 100, 300, 50, 130  # the polygon, in input pixels
T, S = 64, 32


def workflow(path, out, aoi=None):
    with open(path, "w") as f:
        f.write(f"""input:
  path: {SRC}/sample_data/L7_ETMs.tif
{f"  aoi: {aoi}" if aoi else ""}
model:
  weights: {FIX}/resnet18_6b_7c.safetensors
  mean: [79.0, 67.5, 64.4, 60.0, 80.0, 60.0]
  std: [14.7, 16.4, 21.6, 15.0, 25.0, 20.0]
tiling:
  tile: {T}
  stride: {S}
runtime:
  device: cpu
  memory: 1GiB
  threads: 1
output:
  dir: {out}
  products: [class, prob]
""")


def write_polygon(gdal, path, driver, epsg=None):
    from osgeo import ogr, osr
    ds = gdal.Open(f"{SRC}/sample_data/L7_ETMs.tif")
    gt = ds.GetGeoTransform()
    src = osr.SpatialReference()
    src.ImportFromWkt(ds.GetProjection())
    src.SetAxisMappingStrategy(osr.OAMS_TRADITIONAL_GIS_ORDER)
    srs = src
    ct = None
    if epsg:
        srs = osr.SpatialReference()
        srs.ImportFromEPSG(epsg)
        srs.SetAxisMappingStrategy(osr.OAMS_TRADITIONAL_GIS_ORDER)
        ct = osr.CoordinateTransformation(src, srs)
    ring = ogr.Geometry(ogr.wkbLinearRing)
    for px, py in [(X0, Y0), (X1, Y0), (X1, Y1), (X0, Y1), (X0, Y0)]:
        x, y = gt[0] + px * gt[1] + py * gt[2], gt[3] + px * gt[4] + py * gt[5]
        if ct:
            x, y, _ = ct.TransformPoint(x, y)
        ring.AddPoint_2D(x, y)
    poly = ogr.Geometry(ogr.wkbPolygon)
    poly.AddGeometry(ring)
    v = ogr.GetDriverByName(driver).CreateDataSource(path)
    layer = v.CreateLayer("aoi", srs, ogr.wkbPolygon)
    feat = ogr.Feature(layer.GetLayerDefn())
    feat.SetGeometry(poly)
    layer.CreateFeature(feat)
    v = None


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600)


def outputs(gdal, out):
    return {p: gdal.Open(f"{out}/L7_ETMs.{p}.tif").ReadAsArray() for p in ("class", "prob")}


def main():
    gdal = gdal_or_skip()
    if not gdal:
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        gpkg, geojson = f"{tmp}/aoi.gpkg", f"{tmp}/aoi4326.geojson"
        write_polygon(gdal, gpkg, "GPKG")
        write_polygon(gdal, geojson, "GeoJSON", epsg=4326)

        full_wf, aoi_wf, wgs_wf = f"{tmp}/full.yaml", f"{tmp}/aoi.yaml", f"{tmp}/wgs.yaml"
        workflow(full_wf, f"{tmp}/full")
        workflow(aoi_wf, f"{tmp}/aoi", gpkg)
        workflow(wgs_wf, f"{tmp}/wgs", geojson)
        for wf in (full_wf, aoi_wf, wgs_wf):
            r = run("run", wf, "-q")
            check(r.returncode == 0, f"run {os.path.basename(wf)}: {r.stderr}")
        full, aoi, wgs = (outputs(gdal, f"{tmp}/{n}") for n in ("full", "aoi", "wgs"))

        # The tiles whose footprint touches the polygon, counted here.
        ds = gdal.Open(f"{SRC}/sample_data/L7_ETMs.tif")
        W, H = ds.RasterXSize, ds.RasterYSize
        # edge: pad: a tile every S pixels until the last cell is covered
        xs = [x for x in range(0, W, S) if x + T - S < W]
        ys = [y for y in range(0, H, S) if y + T - S < H]
        touched = [(x, y) for y in ys for x in xs
                   if x < X1 and x + T > X0 and y < Y1 and y + T > Y0]
        with open(f"{tmp}/aoi/run.json") as f:
            rep = json.load(f)["inputs"][0]
        check(rep["tiles_classified"] == len(touched) == 40,
              f"computes only the {len(touched)} tiles the polygon touches "
              f"(run.json: {rep['tiles_classified']})", True)
        check(rep["tiles_classified"] + rep["tiles_outside_aoi"] == rep["tiles_total"],
              f"run.json counts the others as outside the AOI ({rep['tiles_outside_aoi']} of "
              f"{rep['tiles_total']})", True)

        # Cells inside the polygon: every tile covering them touches it, so
        # they equal the full run; cells no computed tile covers: nodata.
        gh, gw = full["class"].shape
        inside = np.zeros((gh, gw), bool)
        covered = np.zeros((gh, gw), bool)
        for r in range(gh):
            for c in range(gw):
                x0, y0 = c * S, r * S
                inside[r, c] = x0 >= X0 and x0 + S <= X1 and y0 >= Y0 and y0 + S <= Y1
                covered[r, c] = any(x <= x0 < x + T and y <= y0 < y + T for x, y in touched)
        check(inside.sum() > 0, f"{inside.sum()} cells wholly inside the polygon")
        check(np.array_equal(aoi["class"][inside], full["class"][inside]) and
              np.array_equal(aoi["prob"][:, inside], full["prob"][:, inside]),
              f"the {inside.sum()} cells inside equal the full run (class and prob)", True)
        check((aoi["class"][~covered] == 255).all() and (aoi["prob"][:, ~covered] == -1).all(),
              f"the {(~covered).sum()} cells no computed tile covers are nodata", True)
        check((aoi["class"][covered] != 255).all(), "every covered cell is classified", True)

        check(np.array_equal(wgs["class"], aoi["class"]) and
              np.array_equal(wgs["prob"], aoi["prob"]),
              "the polygon in EPSG:4326 (GeoJSON) gives the same outputs", True)

        r = run("validate", aoi_wf)
        check(r.returncode == 0 and "40 of 100 tiles touch" in r.stdout,
              "validate says how many tiles touch the AOI", True)
        workflow(aoi_wf, f"{tmp}/bad", f"{tmp}/nothere.gpkg")
        os.makedirs(f"{tmp}/bad")
        r = run("run", aoi_wf, "-q")
        with open(f"{tmp}/bad/run.failed.json") as f:
            rj = json.load(f)
        check(r.returncode == 3 and "input.aoi: cannot open" in r.stderr and
              rj["tiles_classified"] == 0,
              f"a missing AOI fails before any tile: {r.stderr.strip()}", True)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
