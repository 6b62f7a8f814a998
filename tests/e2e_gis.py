#!/usr/bin/python3
"""End to end: are the outputs GIS-ready? Everything is read back through GDAL/OGR.

A narrow ResNet-18 (width 8, made here, deterministic) classifies the sample
raster (through a VRT of its first 348 columns: even sizes, so overview cells
are exactly 2x2 blocks; GDAL weighs fractional cells otherwise) with tile 32
and stride 2, so the output grid (174 x 176) is larger than the COG block
size asked for (BLOCKSIZE=128) and the COG driver must build an overview
level; the narrow model keeps that under a few seconds.

* COG: LAYOUT=COG in IMAGE_STRUCTURE, the user's creation options reach the COG
  driver (DEFLATE, 128 blocks), one overview level whose cells are the AVERAGE
  of the 2x2 full-resolution cells (probabilities) and their MODE (class map,
  checked where three or four of the four cells agree).
* Class map: nodata 255, a color table with a distinct color per class,
  category names = class names (what QGIS shows as the legend), statistics.
* Probabilities: band descriptions = class names, nodata -1, statistics equal
  to numpy's; confidence = the max probability per cell.
* GeoPackage (output.products: tiles_gpkg): one polygon per classified tile,
  the same tiles as the HDF5 tile table and run.json's tiles_classified, the
  fields, probabilities equal to the tile table's, class = argmax, geometry =
  the tile's footprint through the input's geotransform, the input's CRS.
* Embeddings go to the HDF5 tile table: chunked, deflate-compressed, with the
  input's CRS and geotransform as attributes.
* Reproducibility: run.json and the TILEWISE_RUN metadata item carry the
  tilewise and GDAL versions and the SHA-256 of the model file.
* Shards: a GeoPackage merged from two shards equals one run's.
* BigTIFF: BIGTIFF=YES passes through to the file's header (0x2B), while the
  default for a small raster stays classic TIFF (0x2A).
"""
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

FIX = os.environ.get("TW_FIXTURES")
SRC = os.environ.get("TW_SOURCE_DIR")
BIN = os.environ.get("TW_BIN")
CLASSES = ["open water", "forest", "urban/built", "crop", "bare"]
TILE, STRIDE = 32, 2


def narrow_resnet18(path, bands, classes, width, seed):
    """A torchvision-layout ResNet-18 state_dict with widths w, 2w, 4w, 8w.
    A large fc weight makes the argmax follow the image, so the class map is
    not one class."""
    sys.path.insert(0, os.path.join(SRC, "tools"))
    import safetensors_io
    rng = np.random.default_rng(seed)
    sd = {}

    def conv(name, o, i, k):
        sd[name] = (rng.standard_normal((o, i, k, k)) * np.sqrt(2.0 / (i * k * k))).astype(np.float32)

    def bn(name, c):
        sd[name + ".weight"] = rng.uniform(0.5, 1.5, c).astype(np.float32)
        sd[name + ".bias"] = rng.uniform(-0.2, 0.2, c).astype(np.float32)
        sd[name + ".running_mean"] = rng.uniform(-0.2, 0.2, c).astype(np.float32)
        sd[name + ".running_var"] = rng.uniform(0.5, 2.0, c).astype(np.float32)

    conv("conv1.weight", width, bands, 7)
    bn("bn1", width)
    cin = width
    for stage in range(4):
        w = width << stage
        for b in range(2):
            p = f"layer{stage + 1}.{b}"
            conv(p + ".conv1.weight", w, cin, 3)
            bn(p + ".bn1", w)
            conv(p + ".conv2.weight", w, w, 3)
            bn(p + ".bn2", w)
            if b == 0 and cin != w:
                conv(p + ".downsample.0.weight", w, cin, 1)
                bn(p + ".downsample.1", w)
            cin = w
    sd["fc.weight"] = (rng.standard_normal((classes, cin)) * 3.0).astype(np.float32)
    sd["fc.bias"] = np.zeros(classes, np.float32)
    safetensors_io.save(path, sd, "F32")


def run(work, name, model, products, fmt, options, stride=STRIDE, raster=None, extra=()):
    wf = os.path.join(work, name + ".yaml")
    out = os.path.join(work, name)
    with open(wf, "w") as f:
        f.write(f"""input:
  path: {raster or SRC + "/sample_data/L7_ETMs.tif"}
model:
  weights: {model}
  mean: [79.0, 67.5, 64.4, 60.0, 80.0, 60.0]
  std: [14.7, 16.4, 21.6, 15.0, 25.0, 20.0]
  classes: [{", ".join('"' + c + '"' for c in CLASSES)}]
tiling:
  tile: {TILE}
  stride: {stride}
runtime:
  device: cpu
  memory: 1GiB
output:
  dir: {out}
  products: [{", ".join(products)}]
  format: {fmt}
  creation_options: [{", ".join(options)}]
""")
    r = subprocess.run([BIN, "run", wf, "-q", *extra], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"tilewise run {name} failed ({r.returncode}): {r.stderr}")
    return out


def check(cond, what):
    if not cond:
        sys.exit("FAIL: " + what)


def check_cog(path, gdal):
    ds = gdal.Open(path)
    check(ds.GetMetadataItem("LAYOUT", "IMAGE_STRUCTURE") == "COG", f"{path}: LAYOUT=COG")
    check(ds.GetMetadataItem("COMPRESSION", "IMAGE_STRUCTURE") == "DEFLATE",
          f"{path}: COMPRESS=DEFLATE passed through")
    b = ds.GetRasterBand(1)
    check(b.GetBlockSize() == [128, 128], f"{path}: BLOCKSIZE=128 passed through, got {b.GetBlockSize()}")
    check(b.GetOverviewCount() >= 1, f"{path}: has overviews")
    o = b.GetOverview(0)
    check((o.XSize * 2, o.YSize * 2) == (ds.RasterXSize, ds.RasterYSize),
          f"{path}: first overview is half size")
    return ds


def overview_reference(a, how):
    """The 2x overview of 2-D array a (even sizes): the mean of each 2x2
    block, or (how == "mode") the class holding three or four of its cells,
    -1 where none does (a 2-2 tie may go either way)."""
    h, w = a.shape
    blk = a.reshape(h // 2, 2, w // 2, 2).transpose(0, 2, 1, 3).reshape(h // 2, w // 2, 4)
    if how == "mean":
        return blk.mean(axis=2)
    out = np.full((h // 2, w // 2), -1.0)
    for c in np.unique(a):
        out[(blk == c).sum(axis=2) >= 3] = c
    return out


def main():
    if not (FIX and SRC and BIN):
        print("TW_FIXTURES/TW_SOURCE_DIR/TW_BIN not set: skipped")
        return 77
    from osgeo import gdal, ogr, osr
    import h5py
    gdal.UseExceptions()
    work = tempfile.mkdtemp(prefix="tw_gis_")
    model = os.path.join(work, "narrow.safetensors")
    narrow_resnet18(model, 6, len(CLASSES), 8, seed=3)
    sha = hashlib.sha256(open(model, "rb").read()).hexdigest()
    vrt = os.path.join(work, "L7_ETMs.vrt")
    gdal.Translate(vrt, os.path.join(SRC, "sample_data", "L7_ETMs.tif"), format="VRT",
                   srcWin=[0, 0, 348, 352])
    out = run(work, "a", model, ["class", "prob", "confidence", "embeddings", "tiles_gpkg"], "COG",
              ["BLOCKSIZE=128", "COMPRESS=DEFLATE"], raster=vrt)
    src = gdal.Open(vrt)
    gt = src.GetGeoTransform()
    K = len(CLASSES)

    # ---- COG, class map ----
    cls_ds = check_cog(os.path.join(out, "L7_ETMs.class.tif"), gdal)
    cb = cls_ds.GetRasterBand(1)
    cls = cb.ReadAsArray()
    check(cb.GetNoDataValue() == 255, "class nodata 255")
    check(cb.GetCategoryNames() == CLASSES, f"category names {cb.GetCategoryNames()}")
    ct = cb.GetColorTable()
    check(ct is not None and ct.GetCount() >= K, "class map has a color table")
    colors = [ct.GetColorEntry(i)[:3] for i in range(K)]
    check(len(set(colors)) == K, f"one distinct color per class: {colors}")
    check(cb.GetColorInterpretation() == gdal.GCI_PaletteIndex, "palette color interpretation")
    present = np.unique(cls)
    check(len(present) >= 2 and present.max() < K, f"class map has several classes: {present}")
    ovr = cb.GetOverview(0).ReadAsArray()
    ref = overview_reference(cls, "mode")
    sure = ref >= 0
    agree = int(sure.sum())
    check(np.array_equal(ovr[sure], ref[sure]), "class overview is the MODE of its cells "
          f"({int((ovr[sure] != ref[sure]).sum())} of {agree} differ)")
    check(agree > 1000 and len(np.unique(ref[sure])) >= 2,
          f"enough unambiguous overview cells of several classes ({agree})")
    st_min = float(cb.GetMetadataItem("STATISTICS_MINIMUM"))
    st_max = float(cb.GetMetadataItem("STATISTICS_MAXIMUM"))
    check((st_min, st_max) == (cls.min(), cls.max()), f"class statistics {st_min} {st_max}")

    # ---- probabilities, confidence ----
    prob_ds = check_cog(os.path.join(out, "L7_ETMs.prob.tif"), gdal)
    check(prob_ds.RasterCount == K, "one probability band per class")
    probs = prob_ds.ReadAsArray().astype(np.float64)  # (K, H, W)
    for k in range(K):
        b = prob_ds.GetRasterBand(k + 1)
        check(b.GetDescription() == CLASSES[k], f"band {k + 1} description {b.GetDescription()!r}")
        check(b.GetNoDataValue() == -1, "prob nodata -1")
        md = b.GetMetadata()
        check(abs(float(md["STATISTICS_MEAN"]) - probs[k].mean()) < 1e-5, f"band {k + 1} mean statistic")
        check(abs(float(md["STATISTICS_MAXIMUM"]) - probs[k].max()) < 1e-6, f"band {k + 1} max statistic")
        o = b.GetOverview(0).ReadAsArray().astype(np.float64)
        d = np.abs(o - overview_reference(probs[k], "mean")).max()
        check(d < 1e-5, f"probability overview is the AVERAGE of its cells (band {k + 1}: {d})")
    check(np.abs(probs.sum(axis=0) - 1).max() < 1e-4, "probabilities sum to 1")
    check(np.array_equal(probs.argmax(axis=0), cls), "class = argmax of the probabilities")
    conf_ds = check_cog(os.path.join(out, "L7_ETMs.conf.tif"), gdal)
    conf = conf_ds.ReadAsArray().astype(np.float64)
    check(conf_ds.GetRasterBand(1).GetNoDataValue() == -1, "confidence nodata -1")
    check(np.abs(conf - probs.max(axis=0)).max() < 1e-6, "confidence = max probability")

    # ---- reproducibility ----
    rep = json.load(open(os.path.join(out, "run.json")))
    version = subprocess.run([BIN, "--version"], capture_output=True, text=True).stdout.split()[1]
    check(rep["versions"]["tilewise"] == version, "run.json tilewise version")
    check(rep["versions"]["gdal"] == gdal.__version__, "run.json GDAL version")
    check(rep["config"]["model"]["sha256"] == sha, "run.json model sha256")
    meta = json.loads(cls_ds.GetMetadataItem("TILEWISE_RUN"))
    check(meta["tilewise_version"] == version, "TILEWISE_RUN tilewise version")
    check(meta["gdal_version"] == gdal.__version__, "TILEWISE_RUN GDAL version")
    check(meta["model"]["sha256"] == sha, "TILEWISE_RUN model sha256")
    check(meta["tiling"]["stride"] == STRIDE and meta["model"]["classes"] == CLASSES,
          "TILEWISE_RUN holds the resolved config")

    # ---- GeoPackage vs tile table ----
    n_classified = rep["inputs"][0]["tiles_classified"]
    with h5py.File(os.path.join(out, "L7_ETMs.tiles.h5"), "r") as h:
        origin = h["origin"][:]
        tprobs = h["probabilities"][:]
        emb = h["embeddings"]
        check(emb.shape == (len(origin), 64) and emb.dtype == np.float32, f"embeddings {emb.shape}")
        check(emb.chunks is not None and emb.compression == "gzip", "embeddings chunked + compressed")
        check(np.isfinite(emb[:]).all() and np.abs(emb[:]).max() > 0, "embeddings hold features")
        check(np.allclose(h.attrs["geotransform"], gt, rtol=0, atol=1e-9), "tile table geotransform")
        crs = h.attrs["crs_wkt"]
        crs = crs.decode() if isinstance(crs, bytes) else str(crs)
        check(osr.SpatialReference(wkt=crs).IsSame(osr.SpatialReference(wkt=src.GetProjection())),
              "tile table CRS")
    check(len(origin) == n_classified, "tile table rows = tiles_classified")
    gp = ogr.Open(os.path.join(out, "L7_ETMs.tiles.gpkg"))
    check(gp is not None and gp.GetDriver().GetName() == "GPKG", "GeoPackage opens with OGR")
    layer = gp.GetLayerByName("tiles")
    check(layer is not None and layer.GetFeatureCount() == n_classified,
          f"one feature per classified tile ({layer.GetFeatureCount()} vs {n_classified})")
    check(layer.GetGeomType() == ogr.wkbPolygon, "polygon layer")
    srs = osr.SpatialReference(wkt=src.GetProjection())
    check(layer.GetSpatialRef().IsSame(srs), "GeoPackage CRS = input's")
    defn = layer.GetLayerDefn()
    names = [defn.GetFieldDefn(i).GetName() for i in range(defn.GetFieldCount())]
    pnames = ["p_open_water", "p_forest", "p_urban_built", "p_crop", "p_bare"]
    check(names == ["row", "col", "class", "class_name", "confidence"] + pnames, f"fields {names}")
    by_origin = {(int(r), int(c)): i for i, (r, c) in enumerate(origin)}
    seen = set()
    worst = 0.0
    for f in layer:
        key = (f.GetField("row"), f.GetField("col"))
        check(key in by_origin and key not in seen, f"feature {key} is a tile of the table, once")
        seen.add(key)
        pr = tprobs[by_origin[key]]
        got = np.array([f.GetField(n) for n in pnames])
        worst = max(worst, float(np.abs(got - pr).max()))
        best = int(np.argmax(pr))
        check(f.GetField("class") == best and f.GetField("class_name") == CLASSES[best],
              f"tile {key}: class = argmax")
        check(abs(f.GetField("confidence") - pr[best]) < 1e-6, f"tile {key}: confidence")
        r, c = key
        x0, y0 = gt[0] + c * gt[1], gt[3] + r * gt[5]
        x1, y1 = gt[0] + (c + TILE) * gt[1], gt[3] + (r + TILE) * gt[5]
        env = f.GetGeometryRef().GetEnvelope()  # minx, maxx, miny, maxy
        want = (min(x0, x1), max(x0, x1), min(y0, y1), max(y0, y1))
        check(max(abs(a - b) for a, b in zip(env, want)) < 1e-6, f"tile {key}: footprint {env} vs {want}")
        check(abs(f.GetGeometryRef().GetArea() - abs(TILE * gt[1] * TILE * gt[5])) < 1e-3,
              f"tile {key}: footprint is the whole tile")
    check(len(seen) == n_classified, "every tile has its feature")
    check(worst < 1e-6, f"GeoPackage probabilities = tile table's ({worst})")
    left = [n for n in os.listdir(out) if n.startswith(".") or n.endswith(("-journal", "-wal", "-shm"))]
    # .tilewise/ keeps only the log of attempts (DESIGN.md, run.json)
    if left == [".tilewise"] and os.listdir(f"{out}/.tilewise") == ["attempts.jsonl"]:
        left = []
    check(not left, f"no temporaries left: {left}")

    # ---- BigTIFF passes through; classic TIFF by default ----
    big = run(work, "big", model, ["class"], "COG", ["BIGTIFF=YES"], stride=TILE)
    small = run(work, "small", model, ["class"], "GTiff", [], stride=TILE)
    with open(os.path.join(big, "L7_ETMs.class.tif"), "rb") as f:
        check(f.read(4) == b"II+\x00", "BIGTIFF=YES gives a BigTIFF")
    with open(os.path.join(small, "L7_ETMs.class.tif"), "rb") as f:
        check(f.read(4) == b"II*\x00", "a small raster is classic TIFF")
    big_ds = gdal.Open(os.path.join(big, "L7_ETMs.class.tif"))  # keep: bands borrow from it
    big_band = big_ds.GetRasterBand(1)
    # GDAL 3.6's GTiff loads the .aux.xml lazily and GetCategoryNames alone
    # does not trigger it (None when asked first): ask for the nodata first,
    # as QGIS does when it opens a layer.
    check(big_band.GetNoDataValue() == 255, "BigTIFF class nodata")
    check(big_band.GetCategoryNames() == CLASSES,
          "BigTIFF COG keeps the category names")
    big_ds = None

    # ---- shards + merge give the same GeoPackage as one run ----
    def features(path):
        ds = ogr.Open(path)
        rows = sorted((f.GetField("row"), f.GetField("col"), f.GetField("class"),
                       tuple(f.GetField(n) for n in pnames), f.GetGeometryRef().ExportToWkt())
                      for f in ds.GetLayer(0))
        return rows
    one = run(work, "one", model, ["tiles_gpkg"], "GTiff", [], stride=16)
    for i in (1, 2):
        shard = run(work, "sharded", model, ["tiles_gpkg"], "GTiff", [], stride=16,
                    extra=["--shard", f"{i}/2"])
    r = subprocess.run([BIN, "merge", shard], capture_output=True, text=True)
    check(r.returncode == 0, f"merge: {r.stderr}")
    f_one = features(os.path.join(one, "L7_ETMs.tiles.gpkg"))
    f_sharded = features(os.path.join(shard, "L7_ETMs.tiles.gpkg"))
    check(len(f_one) > 100 and f_one == f_sharded,
          f"2 shards + merge: the same GeoPackage as one run ({len(f_sharded)} vs {len(f_one)} tiles)")

    subprocess.run(["rm", "-rf", work])
    print(f"ok: COG + overviews (MODE on {agree} unambiguous cells, AVERAGE), legend, "
          f"{n_classified} GeoPackage tiles = tile table, versions + sha256, BigTIFF, "
          f"shards + merge = one run ({len(f_one)} tiles)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
