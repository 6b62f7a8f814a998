#!/usr/bin/python3
"""End to end: products: [polygons], the class map as vector features.

A narrow ResNet-18 (tests/e2e_gis.py's, width 8, fc weights large enough that
the class map follows the image) classifies the sample raster with tile 32 and
stride 4 (an 88 x 88 cell grid of a few hundred regions). A copy of the raster
with a block of nodata (0, its nodata value) makes nodata cells. Everything is
checked against independent references: the class map through GDAL, scipy's
4-connected labelling, OGR/GEOS geometry operations.

* Per class, the sum of `area` = the class map's cells x the cell area
  (relative 1e-9: doubles summed over a few hundred polygons of ~1e6 m²
  coordinates of ~1e7 m); `cells` and `mean_confidence` of each polygon = the
  4-connected region of scipy.ndimage.label whose first cell in raster order
  is the polygon's top-left vertex (mean confidence to 1e-6: float32
  confidences summed in double); one polygon per region; class_name; the
  layer's AREA_UNIT; the input's CRS.
* The polygons tile the valid area: every geometry IsValid(), the union's area
  = valid cells x cell area, the sum of the areas = the union's (no overlap),
  and every pair of polygons whose envelopes meet intersects with zero area.
* output.min_area: no polygon is smaller unless it has no neighbour (a region
  within nodata has nothing to merge into), and the coverage is still exact.
* output.simplify (6 cells, where plain Douglas-Peucker makes polygons
  self-intersect): valid geometries, fewer vertices, no overlap (sum of areas
  = union's area) and no gap (union area = the raster's area, on a run
  without nodata).
* products: [polygons] alone (class map and confidence made in the parts
  directory and removed with it) in FlatGeobuf (output.vector_format: fgb)
  gives the same features as the GeoPackage made with class and confidence.
* Shards + merge: the same polygons (count, classes, cells, areas) as one run.
* tilewise info NAME.class.gpkg summarises the layer; QGIS (where installed)
  loads it categorised by `class` with the class map's colours and names, as
  the Processing provider styles it (tests/qgis/style_polygons.py).
* validate: the budget's polygons item and the product's line (regions at
  most, file size, how many regions the budget leaves room for).
* Bad input: output.min_area < 0, an unknown output.vector_format: exit 2 and
  one message naming the key.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

FIX = os.environ.get("TW_FIXTURES")
SRC = os.environ.get("TW_SOURCE_DIR")
BIN = os.environ.get("TW_BIN")
CLASSES = ["open water", "forest", "urban/built", "crop", "bare"]
TILE, STRIDE = 32, 4


def check(cond, what):
    if not cond:
        sys.exit("FAIL: " + what)
    print("ok   " + what)


def run(work, name, model, raster, products, extra="", args=()):
    wf = os.path.join(work, name + ".yaml")
    out = os.path.join(work, name)
    with open(wf, "w") as f:
        f.write(f"""input:
  path: {raster}
model:
  weights: {model}
  mean: [79.0, 67.5, 64.4, 60.0, 80.0, 60.0]
  std: [14.7, 16.4, 21.6, 15.0, 25.0, 20.0]
  classes: [{", ".join('"' + c + '"' for c in CLASSES)}]
tiling:
  tile: {TILE}
  stride: {STRIDE}
runtime:
  device: cpu
  memory: 1GiB
output:
  dir: {out}
  products: [{", ".join(products)}]
{extra}""")
    r = subprocess.run([BIN, "run", wf, "-q", *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: tilewise run {name} ({r.returncode}): {r.stderr}")
    return wf, out


def features(path, ogr):
    ds = ogr.Open(path)
    lyr = ds.GetLayerByName("classes")
    fs = []
    for f in lyr:
        g = f.GetGeometryRef().Clone()
        fs.append({"class": f.GetField("class"), "class_name": f.GetField("class_name"),
                   "area": f.GetField("area"), "cells": f.GetField("cells"),
                   "mean_confidence": f.GetField("mean_confidence"), "geom": g})
    return ds, lyr, fs


def coverage(fs, ogr, what):
    """Union area and sum of areas; checks validity and pairwise overlaps."""
    check(all(f["geom"].IsValid() for f in fs), f"{what}: every polygon IsValid()")
    union = ogr.Geometry(ogr.wkbMultiPolygon)
    for f in fs:
        union.AddGeometry(f["geom"])
    union = union.UnionCascaded()
    total = sum(f["geom"].GetArea() for f in fs)
    worst = 0.0
    env = [f["geom"].GetEnvelope() for f in fs]
    pairs = 0
    for i in range(len(fs)):
        a = env[i]
        for j in range(i + 1, len(fs)):
            b = env[j]
            if a[0] > b[1] or b[0] > a[1] or a[2] > b[3] or b[2] > a[3]:
                continue
            pairs += 1
            inter = fs[i]["geom"].Intersection(fs[j]["geom"])
            if inter is not None and inter.GetDimension() == 2:
                worst = max(worst, inter.GetArea())
    check(worst == 0.0, f"{what}: {pairs} pairs of neighbouring polygons overlap with zero area")
    return union.GetArea(), total


def main():
    if not (FIX and SRC and BIN):
        print("TW_FIXTURES/TW_SOURCE_DIR/TW_BIN not set: skipped")
        return 77
    from osgeo import gdal, ogr
    import scipy.ndimage
    gdal.UseExceptions()
    ogr.UseExceptions()
    sys.path.insert(0, os.path.join(SRC, "tests"))
    from e2e_gis import narrow_resnet18
    work = tempfile.mkdtemp(prefix="tw_polygons_")
    model = os.path.join(work, "narrow.safetensors")
    narrow_resnet18(model, 6, len(CLASSES), 8, seed=3)
    plain = os.path.join(SRC, "sample_data", "L7_ETMs.tif")
    # the raster with a block of nodata (0) in its middle and its nodata set
    holed = os.path.join(work, "holed.tif")
    src = gdal.Open(plain)
    ds = gdal.GetDriverByName("GTiff").CreateCopy(holed, src)
    for b in range(1, ds.RasterCount + 1):
        band = ds.GetRasterBand(b)
        a = band.ReadAsArray()
        a[120:230, 100:200] = 0
        band.WriteArray(a)
        band.SetNoDataValue(0)
    ds = src = None

    # ---- exact: areas, cells, mean confidence, coverage ----
    _, out = run(work, "full", model, holed, ["class", "confidence", "polygons"])
    cls_ds = gdal.Open(os.path.join(out, "holed.class.tif"))
    cls = cls_ds.GetRasterBand(1).ReadAsArray()
    conf_ds = gdal.Open(os.path.join(out, "holed.conf.tif"))
    conf = conf_ds.GetRasterBand(1).ReadAsArray()
    gt = cls_ds.GetGeoTransform()
    cell_area = abs(gt[1] * gt[5] - gt[2] * gt[4])
    gpkg = os.path.join(out, "holed.class.gpkg")
    pds, lyr, fs = features(gpkg, ogr)
    valid = cls != 255
    check(0 < valid.sum() < cls.size, f"the class map has nodata ({(~valid).sum()} cells) and "
          f"{len(np.unique(cls[valid]))} classes")
    check(lyr.GetMetadataItem("AREA_UNIT") == "square metre", "AREA_UNIT metadata: square metre")
    check(lyr.GetSpatialRef().IsSame(cls_ds.GetSpatialRef()) == 1, "the input's CRS")
    for c in range(len(CLASSES)):
        want = float((cls == c).sum()) * cell_area
        got = sum(f["area"] for f in fs if f["class"] == c)
        check(abs(got - want) <= 1e-9 * max(want, 1.0),
              f"class {c}: sum of area {got:.3f} = {(cls == c).sum()} cells x {cell_area}")
    check(all(f["class_name"] == CLASSES[f["class"]] for f in fs), "class_name per class")
    # scipy's 4-connected regions, keyed by their first cell in raster order
    ref = {}
    for c in range(len(CLASSES)):
        lab, n = scipy.ndimage.label(cls == c)
        for k in range(1, n + 1):
            ys, xs = np.nonzero(lab == k)
            first = (int(ys[0]), int(xs[0]))  # np.nonzero: raster order
            ref[first] = (c, len(ys), float(conf[lab == k].astype(np.float64).mean()))
    check(len(fs) == len(ref), f"one polygon per 4-connected region ({len(fs)} = scipy's {len(ref)})")
    inv = gdal.InvGeoTransform(gt)
    bad = 0
    for f in fs:
        ring = f["geom"].GetGeometryRef(0)
        pts = [gdal.ApplyGeoTransform(inv, *ring.GetPoint_2D(i)) for i in range(ring.GetPointCount())]
        key = min((round(py), round(px)) for px, py in pts)
        r = ref.get(key)
        if (r is None or r[0] != f["class"] or r[1] != f["cells"]
                or abs(r[2] - f["mean_confidence"]) > 1e-6
                or abs(f["area"] - f["cells"] * cell_area) > 1e-9 * f["area"]):
            bad += 1
    check(bad == 0, "every polygon's class, cells, mean_confidence and area = its scipy region's")
    union, total = coverage(fs, ogr, "full")
    want = float(valid.sum()) * cell_area
    check(abs(union - want) <= 1e-9 * want, f"no gap: union area {union:.1f} = valid area {want:.1f}")
    check(abs(total - union) <= 1e-9 * want, "no overlap: sum of areas = union area")
    pds = None
    full_fs = fs

    # ---- min_area: nothing smaller, unless it has no neighbour ----
    min_area = 6 * cell_area
    _, out = run(work, "sieved", model, holed, ["polygons"],
                 extra=f"  min_area: {min_area}\n")
    check(not os.path.exists(os.path.join(out, "holed.class.tif")),
          "products: [polygons] writes no class map")
    check(not os.path.exists(os.path.join(out, ".tilewise", "holed")),
          "its scratch rasters went with the parts")
    _, _, fs = features(os.path.join(out, "holed.class.gpkg"), ogr)
    small = [f for f in fs if f["area"] < min_area]
    lonely = all(not any(g is not f and f["geom"].Touches(g["geom"]) for g in fs) for f in small)
    check(len(fs) < len(full_fs) and lonely,
          f"min_area {min_area}: {len(fs)} polygons (from {len(full_fs)}), the {len(small)} "
          f"smaller ones have no neighbour")
    union, total = coverage(fs, ogr, "min_area")
    check(abs(union - want) <= 1e-9 * want and abs(total - union) <= 1e-9 * want,
          "min_area: the polygons still tile the valid area exactly")

    # ---- products: [polygons] alone, in FlatGeobuf = with class and confidence ----
    def key(fs):
        return sorted((f["class"], f["cells"], round(f["area"], 3), round(f["mean_confidence"], 6),
                       f["geom"].ExportToWkt()) for f in fs)

    _, out = run(work, "fgb", model, holed, ["polygons"], extra="  vector_format: fgb\n")
    fgb = os.path.join(out, "holed.class.fgb")
    check(ogr.Open(fgb).GetDriver().GetName() == "FlatGeobuf", "vector_format: fgb is FlatGeobuf")
    _, _, fs = features(fgb, ogr)
    check(key(fs) == key(full_fs), "products: [polygons] alone, FlatGeobuf: the same polygons")

    # ---- simplify: valid, no gap, no overlap (no nodata: union = raster) ----
    _, out = run(work, "exact", model, plain, ["class", "polygons"])
    _, _, exact = features(os.path.join(out, "L7_ETMs.class.gpkg"), ogr)
    cds = gdal.Open(os.path.join(out, "L7_ETMs.class.tif"))
    raster_area = cds.RasterXSize * cds.RasterYSize * cell_area
    cds = None
    pixel = abs(gt[1])
    _, out = run(work, "simple", model, plain, ["polygons"], extra=f"  simplify: {6 * pixel}\n")
    _, _, fs = features(os.path.join(out, "L7_ETMs.class.gpkg"), ogr)
    nv = sum(f["geom"].GetGeometryRef(r).GetPointCount() for f in fs
             for r in range(f["geom"].GetGeometryCount()))
    nv0 = sum(f["geom"].GetGeometryRef(r).GetPointCount() for f in exact
              for r in range(f["geom"].GetGeometryCount()))
    check(len(fs) == len(exact) and nv < nv0,
          f"simplify {6 * pixel}: {len(fs)} polygons, {nv} vertices (from {nv0})")
    union, total = coverage(fs, ogr, "simplify")
    check(abs(union - raster_area) <= 1e-9 * raster_area,
          f"simplify: no gap (union {union:.1f} = the raster's area {raster_area:.1f})")
    check(abs(total - union) <= 1e-9 * raster_area, "simplify: no overlap (sum of areas = union)")

    # ---- shards + merge = one run ----
    for i in (1, 2):
        wf, shard = run(work, "sharded", model, holed, ["polygons"], args=["--shard", f"{i}/2"])
    r = subprocess.run([BIN, "merge", shard], capture_output=True, text=True)
    check(r.returncode == 0, f"merge: {r.stderr.strip()}")
    _, _, fs = features(os.path.join(shard, "holed.class.gpkg"), ogr)
    check(key(fs) == key(full_fs), f"2 shards + merge: the same {len(fs)} polygons as one run")
    leftovers = [n for n in os.listdir(shard) if ".part" in n]
    check(not leftovers, "no temporary left beside the products")

    # ---- tilewise info ----
    r = subprocess.run([BIN, "info", gpkg], capture_output=True, text=True)
    check(r.returncode == 0 and "classes" in r.stdout and f"{len(full_fs)} features" in r.stdout
          and "forest" in r.stdout, f"tilewise info summarises the layer:\n{r.stdout}")

    # ---- QGIS: the provider's styling, categorised by class with the class map's colours ----
    try:
        import qgis.core  # noqa: F401
        have_qgis = True
    except ImportError:
        have_qgis = False
        print("skip QGIS styling: python3-qgis not installed")
    if have_qgis:
        home = os.path.join(work, "home")
        os.makedirs(home, mode=0o700)
        env = dict(os.environ, HOME=home, XDG_RUNTIME_DIR=home, QT_QPA_PLATFORM="offscreen")
        r = subprocess.run([sys.executable, os.path.join(SRC, "tests", "qgis", "style_polygons.py"),
                            gpkg, *CLASSES], capture_output=True, text=True, env=env, timeout=300)
        lines = r.stdout.strip().splitlines()
        got = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
        ct = cls_ds.GetRasterBand(1).GetColorTable()
        want = [[k, CLASSES[k], "#%02x%02x%02x" % ct.GetColorEntry(k)[:3]]
                for k in range(len(CLASSES))]
        check(got.get("valid") and got.get("features") == len(full_fs)
              and got.get("attribute") == "class" and got.get("categories") == want,
              f"QGIS loads the polygons categorised by class, the class map's colours and names "
              f"({got.get('categories') if got else r.stderr[-500:]})")

    # ---- validate: the budget item and the product's estimate ----
    r = subprocess.run([BIN, "validate", wf], capture_output=True, text=True)
    est = [ln for ln in r.stdout.splitlines() if ln.startswith("polygons ")]
    check(r.returncode == 0 and " + polygons " in r.stdout and len(est) == 1
          and "holed.class.gpkg: at most 7744 regions in 88 x 88 cells" in est[0],
          f"validate shows the polygons' budget item and estimate: {est}")

    # ---- the regions' memory: validate and the run agree (issue 40.2) ----
    # The run counts the class map's regions before the sieve against what
    # the budget leaves at assembly (more: exit 4, tests/test_polygons.c);
    # validate and the run warn, with the run's words, when a region per
    # cell would not fit, and --strict refuses. At output.resolution: input
    # the class map has 349 x 352 cells, whose worst case (9.4 MiB) a tight
    # budget cannot hold although this map's 36 regions fit. runtime.memory
    # is searched (in bytes) for a room of a given number of regions: with
    # tiling.batch fixed a byte less is 1/80 region less, or 3/4 of that
    # where GDAL's cache is capped at a quarter of what the fixed items leave.
    full_wf = os.path.join(work, "full.yaml")
    cells = 349 * 352

    def tw(cmd, memory, name, *more):
        args = [BIN, cmd, full_wf, "--set", f"runtime.memory={memory}", "--set", "tiling.batch=4",
                "--set", "output.resolution=input", "--set",
                f"output.dir={os.path.join(work, name)}", *more]
        return subprocess.run(args + (["-q"] if cmd == "run" else []), capture_output=True,
                              text=True)

    def fit_of(r):
        m = re.search(r"left for them at 80 bytes each \(beside their rows\): (\d+) regions",
                      r.stdout)
        return int(m.group(1)) if m else -1

    def memory_for(lo, hi):
        memory = 1 << 30
        for _ in range(30):
            r = tw("validate", memory, "v")
            fit = fit_of(r)
            if lo <= fit <= hi:
                return memory, fit, r
            memory += ((lo + hi) // 2 - fit) * 80
        sys.exit(f"FAIL: no runtime.memory leaves room for {lo}..{hi} regions ({r.stdout})")

    tight, tight_fit, r = memory_for(cells - 20000, cells - 10000)
    warn = [ln for ln in r.stdout.splitlines() if ln.startswith("warning") and "polygons:" in ln]
    words = (f"polygons: its class map of 349 x 352 cells may have up to {cells} regions and "
             f"runtime.memory leaves room for {tight_fit} at assembly: a class map with more "
             f"stops the run (exit 4)")
    check(r.returncode == 0 and len(warn) == 1 and words in warn[0]
          and "output.min_area cannot help" in warn[0] and "give runtime.memory about" in warn[0],
          f"validate, room for {tight_fit} of {cells} regions: the polygons warning "
          f"({warn or r.stdout})")
    r = tw("run", tight, "r1")
    check(r.returncode == 0 and words in r.stderr
          and os.path.exists(os.path.join(work, "r1", "holed.class.gpkg")),
          f"the run warns the same and, with 36 regions, fits ({r.returncode}: {r.stderr[-400:]})")
    r = tw("run", tight, "r2", "--strict")
    check(r.returncode == 2 and words in r.stderr and not os.path.exists(os.path.join(work, "r2")),
          f"run --strict: refused before the first tile ({r.returncode}: {r.stderr[-300:]})")
    roomy, roomy_fit, r = memory_for(cells, cells + 2000)  # room for a region per cell
    check(not [ln for ln in r.stdout.splitlines() if ln.startswith("warning")],
          f"room for {roomy_fit} regions: no warning ({r.stdout})")
    r = tw("run", roomy, "r3")
    check(r.returncode == 0 and r.stderr.strip() == "",
          f"and the run fits without a warning ({r.returncode}: {r.stderr[-300:]})")

    # ---- bad input ----
    for setting, key_name in (("output.min_area=-1", "output.min_area"),
                              ("output.vector_format=shp", "output.vector_format")):
        r = subprocess.run([BIN, "run", wf, "-q", "--set", setting], capture_output=True, text=True)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        check(r.returncode == 2 and len(lines) == 1 and key_name in lines[0],
              f"--set {setting}: exit 2, one message naming {key_name}: {r.stderr.strip()}")

    subprocess.run(["rm", "-rf", work])
    return 0


if __name__ == "__main__":
    sys.exit(main())
