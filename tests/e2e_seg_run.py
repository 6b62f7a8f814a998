#!/usr/bin/python3
"""End to end: `tilewise run` with a segmentation model (issue 36), against an
independent reference, through shards, merge, a stop and a checkpoint.

The model: tests/e2e_seg_parity.py's U-Net on a ResNet-18 with narrow decoder
widths (random weights, seed 5, 4 bands, 5 classes, logits spread over the
raster's own pixels), exported to safetensors; 64 px tiles. The rasters: crops
of the shared NAIP scene (4 bands, Byte, UTM), no model.mean/std (the network
sees the raw values, 0 for nodata and padding pixels as the engine feeds it).

1. prob.tif = the reference within TOL = 1e-4 on every probability: PyTorch's
   per-tile softmax (float64 after the float32 network), blended with
   tests/e2e_blend_ref.py's functions (KEYS.md's formulas: tile positions per
   tiling.edge, weights per tiling.blend and tiling.margin), written here
   independently of the engine: which tiles are classified (nodata share
   <= tiling.max_nodata_fraction of the pixels inside the raster), which pixels
   are valid (no band equal to the nodata value), nodata where the weights sum to
   0. Cases: blend mean, linear, cosine; margins; a stride that does not divide
   the tile (40); edge pad, shift and skip; a raster with a nodata value and a
   block of nodata covering a whole tile (left out) and most of another.
   class.tif = argmax of prob.tif (lowest index on ties; also the reference's
   argmax where its top two differ by more than 1e-3), 255 where nodata;
   conf.tif = max probability (io/output/writer.c), -1 where nodata; prob -1
   there. Size, geotransform and CRS = the input's.
2. Shards 1/2 + 2/2 + `tilewise merge` = one run: every product (class, prob,
   conf GeoTIFFs: pixel bytes and georeferencing through GDAL and the files'
   SHA-256; the polygons: every feature's fields and geometry). A run stopped
   by SIGTERM at 10 % done (exit 75) and rerun: the same bytes, the rerun
   classifying fewer tiles than the whole. A row longer than a checkpoint
   interval (a 64 px strip, stride 8): kill -9 once the periodic checkpoint's
   state file appears, rerun: the same bytes (skipped, saying so, where the row
   takes under 5 s).
3. Refusals (exit 2, the message naming the key): tile products with a
   segmentation model, tiling.blend / tiling.margin with a classifier,
   runtime.device cuda with a segmentation model (runtime.device auto runs on
   the CPU). output.products [polygons] per pixel: per class, the polygons'
   area = the class map's pixels x the pixel area.

Skipped (77) without torch or the shared NAIP raster. About 90 s of CPU (some 200
tiles; 4 min of wall time on a 2-core machine loaded 4 times over).
"""
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from e2eutil import BIN, SRC, check

TOL = 1e-4
CLASSES = 5
T = 64
EXIT_USAGE, EXIT_INTERRUPTED = 2, 75


def tw(*args, **kw):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600, **kw)


def crop(gdal, src, dst, x, y, w, h, nodata_block=None):
    """dst: src's window (x, y, w, h), tiled GeoTIFF; with nodata_block
    (x0, y0, x1, y1) those pixels set to 0 in every band and 0 the nodata."""
    gdal.Translate(dst, src, srcWin=[x, y, w, h],
                   creationOptions=["TILED=YES", "BLOCKXSIZE=128", "BLOCKYSIZE=128"])
    if nodata_block:
        x0, y0, x1, y1 = nodata_block
        ds = gdal.Open(dst, gdal.GA_Update)
        for b in range(1, ds.RasterCount + 1):
            band = ds.GetRasterBand(b)
            a = band.ReadAsArray()
            a[y0:y1, x0:x1] = 0
            band.WriteArray(a)
            band.SetNoDataValue(0)
        ds = None


def workflow(path, raster, weights, out, tiling, products="[class, prob, confidence]",
             device="cpu", extra=""):
    lines = "\n".join(f"  {k}: {v}" for k, v in tiling.items())
    with open(path, "w") as f:
        f.write(f"""input:
  path: {raster}
model:
  weights: {weights}
tiling:
{lines}
runtime:
  device: {device}
  memory: 1GiB
  threads: 2
output:
  dir: {out}
  products: {products}
{extra}""")


# ---- the reference ----

def reference(gdal, model, raster, stride, edge, blend, margin, max_nodata=0.5):
    """(probabilities h x w x C float64, has h x w bool, tiles classified,
    tiles left out)."""
    import torch
    import e2e_blend_ref as br
    ds = gdal.Open(raster)
    a = ds.ReadAsArray().astype(np.float32)
    bands, h, w = a.shape
    nd = ds.GetRasterBand(1).GetNoDataValue()
    invalid = np.zeros((h, w), bool) if nd is None else np.any(a == nd, axis=0)
    xs, ys = br.positions(w, T, stride, edge), br.positions(h, T, stride, edge)
    tiles, where, left_out = [], [], 0
    for ty, y0 in enumerate(ys):
        for tx, x0 in enumerate(xs):
            vh, vw = min(T, h - y0), min(T, w - x0)
            bad = int(invalid[y0:y0 + vh, x0:x0 + vw].sum())
            inside = vh * vw
            if not (inside > 0 and bad < inside and bad / inside <= max_nodata):
                left_out += 1
                continue
            x = np.zeros((bands, T, T), np.float32)
            x[:, :vh, :vw] = np.where(invalid[None, y0:y0 + vh, x0:x0 + vw], 0.0,
                                      a[:, y0:y0 + vh, x0:x0 + vw])
            tiles.append(x)
            where.append((ty, tx, y0, x0, vh, vw))
    with torch.no_grad():
        pr = torch.softmax(model(torch.from_numpy(np.stack(tiles))), dim=1).double().numpy()
    num = np.zeros((h + T, w + T, CLASSES))
    den = np.zeros((h + T, w + T))
    for k, (ty, tx, y0, x0, vh, vw) in enumerate(where):
        wt = np.outer(br.axis_weights(blend, T, margin, ys, ty),
                      br.axis_weights(blend, T, margin, xs, tx))
        valid = np.ones((T, T), bool)
        valid[:vh, :vw] = ~invalid[y0:y0 + vh, x0:x0 + vw]
        wt = wt * valid
        num[y0:y0 + T, x0:x0 + T] += wt[:, :, None] * pr[k].transpose(1, 2, 0)
        den[y0:y0 + T, x0:x0 + T] += wt
    num, den = num[:h, :w], den[:h, :w]
    has = den > 0
    return num / np.where(has, den, 1.0)[:, :, None], has, len(where), left_out


def check_products(gdal, out, stem, raster, ref, has, what):
    src = gdal.Open(raster)
    ds = {p: gdal.Open(f"{out}/{stem}.{p}.tif") for p in ("class", "prob", "conf")}
    for p, d in ds.items():
        check((d.RasterXSize, d.RasterYSize) == (src.RasterXSize, src.RasterYSize)
              and d.GetGeoTransform() == src.GetGeoTransform()
              and d.GetSpatialRef().IsSame(src.GetSpatialRef()) == 1,
              f"{what}: {p}.tif has the input's size, geotransform and CRS")
    prob = ds["prob"].ReadAsArray().transpose(1, 2, 0)
    cls = ds["class"].ReadAsArray()
    conf = ds["conf"].ReadAsArray()
    check(prob.shape[2] == CLASSES, f"{what}: {prob.shape[2]} bands in prob.tif")
    diff = float(np.abs(prob[has] - ref[has]).max())
    check(diff <= TOL, f"{what}: max |prob - reference| = {diff:.3g} (<= {TOL})", True)
    nod = ~has
    check(np.all(prob[nod] == -1) and np.all(cls[nod] == 255) and np.all(conf[nod] == -1),
          f"{what}: the {int(nod.sum())} pixels the reference has no tile for are nodata "
          f"(class 255, prob and conf -1)", True)
    check(np.all(cls != 255) if nod.sum() == 0 else np.all(cls[has] != 255),
          f"{what}: no other pixel is nodata")
    check(np.array_equal(cls[has], prob[has].argmax(axis=1)), f"{what}: class = argmax of prob",
          True)
    top = np.sort(ref[has], axis=1)
    clear = top[:, -1] - top[:, -2] > 1e-3
    check(np.array_equal(cls[has][clear], ref[has][clear].argmax(axis=1)),
          f"{what}: class = the reference's argmax where its top two differ by > 1e-3 "
          f"({int(clear.sum())} of {int(has.sum())} pixels)")
    check(np.array_equal(conf[has], prob[has].max(axis=1)), f"{what}: conf = max probability", True)
    return cls


# ---- comparing whole runs ----

def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def products(gdal, ogr, out, stem, with_polygons=True):
    """Everything a run wrote that a second run must equal: each GeoTIFF's
    pixels, georeferencing and SHA-256; the polygons' features."""
    res = {}
    for p in ("class", "prob", "conf"):
        path = f"{out}/{stem}.{p}.tif"
        d = gdal.Open(path)
        res[p] = (d.ReadAsArray().tobytes(), d.GetGeoTransform(), d.GetProjection(), sha(path))
    if with_polygons:
        v = ogr.Open(f"{out}/{stem}.class.gpkg")
        lyr = v.GetLayerByName("classes")
        res["polygons"] = sorted((f.GetField("class"), f.GetField("cells"), f.GetField("area"),
                                  f.GetField("mean_confidence"),
                                  bytes(f.GetGeometryRef().ExportToWkb())) for f in lyr)
    return res


def differs(a, b):
    for k in a:
        if a[k] != b.get(k):
            if k == "polygons":
                return f"polygons differ ({len(a[k])} vs {len(b.get(k) or [])} features)"
            parts = ("pixels", "geotransform", "CRS", "file SHA-256")
            return f"{k}.tif: " + ", ".join(n for n, x, y in zip(parts, a[k], b[k]) if x != y)
    return None


def classified(out):
    with open(f"{out}/run.json") as f:
        rep = json.load(f)
    return sum(i.get("tiles_classified", 0) for i in rep.get("inputs", [rep]))


def main():
    if not (SRC and BIN):
        print("TW_SOURCE_DIR/TW_BIN not set: skipped")
        return 77
    try:
        import torch
    except ImportError:
        print("torch not importable: skipped")
        return 77
    import e2e_seg_parity as sp
    import e2e_stop as es
    naip = sp.raster_path()
    if naip is None:
        print(f"shared data absent ({sp.NAIP}): skipped")
        return 77
    from osgeo import gdal, ogr
    gdal.UseExceptions()
    ogr.UseExceptions()
    torch.set_num_threads(2)
    t_start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        base = f"{tmp}/scene.tif"
        crop(gdal, naip, base, 100, 100, 150, 120)
        holed = f"{tmp}/holed.tif"
        # a block covering the tile at (0, 0) (left out) and 2/3 of the tile
        # at (48, 0) with stride 48 (above 0.5: left out too)
        crop(gdal, naip, holed, 300, 200, 150, 120, nodata_block=(0, 0, 90, 70))
        x = gdal.Open(base).ReadAsArray(0, 0, T, T).astype(np.float32)[None]
        model = sp.make("unet18_narrow", 5, x)
        weights = f"{tmp}/unet.safetensors"
        sp.export(model, weights)

        # ---- 1. every pixel against the reference ----
        cases = (("blend mean, stride 48, pad", base, 48, "pad", "mean", 0, {}),
                 ("blend linear, stride 40 (not dividing 64), margin 6", base, 40, "pad",
                  "linear", 6, {}),
                 ("blend cosine, stride 32, margin 8, edge shift", base, 32, "shift", "cosine",
                  8, {}),
                 ("blend linear, stride 48, edge skip", base, 48, "skip", "linear", 0, {}),
                 ("input nodata, stride 48, max_nodata_fraction 0.5", holed, 48, "pad",
                  "linear", 0, {"max_nodata_fraction": 0.5}))
        for i, (what, raster, stride, edge, blend, margin, more) in enumerate(cases):
            out = f"{tmp}/case{i}"
            wf = f"{tmp}/case{i}.yaml"
            workflow(wf, raster, weights, out, dict(tile=T, stride=stride, edge=edge,
                                                    blend=blend, margin=margin, **more))
            r = tw("run", wf, "-q")
            check(r.returncode == 0, f"{what}: run exit {r.returncode}: {r.stderr.strip()}")
            ref, has, n_tiles, left_out = reference(gdal, model, raster, stride, edge, blend, margin,
                                           more.get("max_nodata_fraction", 0.5))
            stem = os.path.splitext(os.path.basename(raster))[0]
            check_products(gdal, out, stem, raster, ref, has, what)
            with open(f"{out}/run.json") as f:
                rep = json.load(f)["inputs"][0]
            check(rep["tiles_classified"] == n_tiles and rep["tiles_nodata"] == left_out,
                  f"{what}: run.json counts {rep['tiles_classified']} tiles classified, "
                  f"{rep['tiles_nodata']} nodata (the reference: {n_tiles}, {left_out})", True)
            if raster == holed:
                check(left_out >= 2 and (~has).sum() > 0,
                      f"{what}: {left_out} tiles above max_nodata_fraction left out", True)
            if edge == "skip":
                check((~has).sum() > 0, f"{what}: the uncovered edge is nodata", True)

        # ---- 2. shards + merge, a stop, a checkpoint: one run's bytes ----
        tiling = dict(tile=T, stride=48, blend="linear", margin=6)
        all4 = "[class, prob, confidence, polygons]"
        wf = f"{tmp}/one.yaml"
        workflow(wf, base, weights, f"{tmp}/one", tiling, all4)
        r = tw("run", wf, "-q")
        check(r.returncode == 0, f"one run: {r.stderr.strip()}")
        one = products(gdal, ogr, f"{tmp}/one", "scene")
        workflow(wf, base, weights, f"{tmp}/shards", tiling, all4)
        for s in ("1/2", "2/2"):
            r = tw("run", wf, "-q", "--shard", s)
            check(r.returncode == 0, f"shard {s}: exit {r.returncode} {r.stderr.strip()}")
        r = tw("merge", "-q", f"{tmp}/shards")
        check(r.returncode == 0, f"merge: exit {r.returncode} {r.stderr.strip()}")
        d = differs(one, products(gdal, ogr, f"{tmp}/shards", "scene"))
        check(d is None, "shards 1/2 + 2/2 + merge = one run (class, prob, conf: pixels, "
              "georeferencing, file bytes; polygons)" + (f": {d}" if d else ""), True)

        # SIGTERM at 10 %: a strip of 20 tiles in one row
        strip = f"{tmp}/strip.tif"
        crop(gdal, naip, strip, 0, 300, 934, 64)
        slow = dict(tile=T, stride=48, blend="cosine", margin=4)
        wf = f"{tmp}/strip.yaml"
        workflow(wf, strip, weights, f"{tmp}/strip_ref", slow)
        t0 = time.time()
        r = tw("run", wf, "-q")
        took = time.time() - t0
        check(r.returncode == 0, f"strip run ({took:.1f} s): {r.stderr.strip()}")
        ref = products(gdal, ogr, f"{tmp}/strip_ref", "strip", False)
        n_ref = classified(f"{tmp}/strip_ref")
        out = f"{tmp}/strip_stop"
        workflow(wf, strip, weights, out, slow)
        rc, after = es.stop_run([BIN, "run", wf])
        check(rc == EXIT_INTERRUPTED, f"SIGTERM at 10 % done: exit {rc} ({after:.2f} s after "
              "the signal)", True)
        check(not os.path.exists(f"{out}/strip.class.tif"), "no final product after the stop")
        r = tw("run", wf, "-q")
        check(r.returncode == 0, f"rerun after the stop: {r.stderr.strip()}")
        d = differs(ref, products(gdal, ogr, out, "strip", False))
        check(d is None, "stopped and rerun = one uninterrupted run" + (f": {d}" if d else ""),
              True)
        n = classified(out)
        check(0 < n < n_ref, f"the rerun classified {n} of {n_ref} tiles (the stop kept its "
              "work)", True)

        # kill -9 once a checkpoint of the row is taken (TW_CHECKPOINT_S, 5 s)
        out = f"{tmp}/strip_kill"
        workflow(wf, strip, weights, out, slow)
        state = f"{out}/.tilewise/strip/state.0001-of-0001"
        rc, _ = es.stop_run([BIN, "run", wf], sig=signal.SIGKILL,
                            when=lambda: os.path.exists(state))
        if rc == 0:
            print(f"skip kill -9 after a checkpoint: the strip took {took:.1f} s here, under "
                  "the 5 s between checkpoints")
        else:
            check(rc == -signal.SIGKILL, f"kill -9 once a checkpoint is taken (exit {rc})")
            r = tw("run", wf, "-q")
            check(r.returncode == 0, f"rerun after kill -9: {r.stderr.strip()}")
            d = differs(ref, products(gdal, ogr, out, "strip", False))
            check(d is None, "kill -9 after a checkpoint, rerun = uninterrupted run" +
                  (f": {d}" if d else ""), True)
            n = classified(out)
            check(n < n_ref, f"the rerun after kill -9 classified {n} of {n_ref} tiles: the "
                  "checkpoint was used", True)

        # ---- 3. refusals; polygons per pixel ----
        wf = f"{tmp}/bad.yaml"
        for prod in ("tiles", "tiles_gpkg", "embeddings", "embedding_raster"):
            workflow(wf, base, weights, f"{tmp}/bad", dict(tile=T), f"[class, {prod}]")
            r = tw("run", wf, "-q")
            check(r.returncode == EXIT_USAGE and "output.products" in r.stderr
                  and prod in r.stderr and not os.path.exists(f"{tmp}/bad/scene.class.tif"),
                  f"segmentation model with product {prod}: exit 2 naming output.products "
                  f"({r.returncode}: {r.stderr.strip()})", True)
        r18 = f"{SRC}/sample_data/demo_resnet18.h5"
        l7 = f"{SRC}/sample_data/L7_ETMs.tif"
        for key, value in (("blend", "mean"), ("margin", 4)):
            workflow(wf, l7, r18, f"{tmp}/bad", {"tile": T, "stride": 32, key: value})
            r = tw("run", wf, "-q")
            check(r.returncode == EXIT_USAGE and f"tiling.{key}" in r.stderr,
                  f"a classifier with tiling.{key}: exit 2 naming it "
                  f"({r.returncode}: {r.stderr.strip()})", True)
        # refused before any device is looked for (pipeline/run/prepare.c): before,
        # a build or machine without CUDA said "built without the CUDA backend"
        # (exit 4) and one with CUDA exit 2
        for dev in ("cuda", "cuda:0"):
            workflow(wf, base, weights, f"{tmp}/bad", dict(tile=T), device=dev)
            r = tw("run", wf, "-q")
            check(r.returncode == EXIT_USAGE and f"runtime.device {dev}:" in r.stderr
                  and "segmentation" in r.stderr and "runtime.device: cpu" in r.stderr
                  and not os.path.exists(f"{tmp}/bad/scene.class.tif"),
                  f"runtime.device {dev} with a segmentation model: exit 2 naming the key "
                  f"({r.returncode}: {r.stderr.strip()})", True)
        workflow(wf, base, weights, f"{tmp}/auto", dict(tile=T), "[class, polygons]",
                 device="auto")
        r = tw("run", wf, "-q")
        check(r.returncode == 0, f"runtime.device auto runs a segmentation model: "
              f"{r.stderr.strip()}", True)
        cls_ds = gdal.Open(f"{tmp}/auto/scene.class.tif")
        cls = cls_ds.ReadAsArray()
        gt = cls_ds.GetGeoTransform()
        px_area = abs(gt[1] * gt[5] - gt[2] * gt[4])
        v = ogr.Open(f"{tmp}/auto/scene.class.gpkg")
        fs = [(f.GetField("class"), f.GetField("area"), f.GetField("cells"))
              for f in v.GetLayerByName("classes")]
        check(len(np.unique(cls)) >= 2, f"the class map has {len(np.unique(cls))} classes")
        for c in range(CLASSES):
            want = float((cls == c).sum()) * px_area
            got = sum(a for k, a, _ in fs if k == c)
            cells = sum(n for k, _, n in fs if k == c)
            check(abs(got - want) <= 1e-9 * max(want, 1.0) and cells == (cls == c).sum(),
                  f"polygons, class {c}: area {got:.1f} = {(cls == c).sum()} pixels x "
                  f"{px_area} (cells {cells})", True)
    print(f"PASS ({time.time() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
