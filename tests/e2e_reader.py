#!/usr/bin/python3
"""End to end: a run reading its input through libtiff (io/input/tiff_direct.c)
writes exactly what the same run reading through GDAL writes.

sample_data/L7_ETMs.tif is copied (gdal_translate) into three tiled GeoTIFFs:
pixel-interleaved DEFLATE with 64 x 64 tiles, band-interleaved uncompressed
with 32 x 32 tiles and nodata 0, and one with an internal mask (which only
GDAL honours, so libtiff must not be used for it). Each is run twice with the
ResNet-18 fixture (tile 64, stride 32: overlapping tiles; products class and
prob; the band-interleaved one with input.bands reversed): once as tilewise
chooses, once with TILEWISE_TIFF_DIRECT=0. Checked: run.json's
inputs[0].reader (libtiff for the first two, gdal for the masked one and for
every forced run) and `tilewise validate`'s reader line, and the class and
probability rasters' pixels, read back with GDAL, equal bit for bit between
the two runs.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from e2eutil import BIN, SRC, gdal_or_skip, workflow
from e2eutil import check as check_quiet


def check(cond, what):
    check_quiet(cond, what, say_ok=True)


def make_inputs(gdal, work):
    src = os.path.join(SRC, "sample_data", "L7_ETMs.tif")
    made = {}
    for name, opts in [
        ("pixel_deflate", ["TILED=YES", "BLOCKXSIZE=64", "BLOCKYSIZE=64", "COMPRESS=DEFLATE"]),
        ("band_none", ["TILED=YES", "BLOCKXSIZE=32", "BLOCKYSIZE=32", "INTERLEAVE=BAND"]),
    ]:
        p = os.path.join(work, name + ".tif")
        gdal.Translate(p, src, creationOptions=opts,
                       noData=0 if name == "band_none" else None)
        made[name] = p
    # an internal mask that cuts the left quarter: GDAL applies it, libtiff cannot
    p = os.path.join(work, "masked.tif")
    gdal.SetConfigOption("GDAL_TIFF_INTERNAL_MASK", "YES")
    try:
        ds = gdal.Translate(p, src, creationOptions=["TILED=YES", "BLOCKXSIZE=64",
                                                      "BLOCKYSIZE=64"])
        ds.CreateMaskBand(gdal.GMF_PER_DATASET)
        m = ds.GetRasterBand(1).GetMaskBand()
        import numpy as np
        a = np.full((ds.RasterYSize, ds.RasterXSize), 255, np.uint8)
        a[:, : ds.RasterXSize // 4] = 0
        m.WriteArray(a)
        ds = None
    finally:
        gdal.SetConfigOption("GDAL_TIFF_INTERNAL_MASK", None)
    made["masked"] = p
    return made


def run(work, name, path, bands, forced):
    wf, out = workflow(work, f"{name}_{'gdal' if forced else 'default'}", [path], bands=bands,
                       stride=32, products="[class, prob]")
    env = dict(os.environ)
    env.pop("TILEWISE_TIFF_DIRECT", None)
    if forced:
        env["TILEWISE_TIFF_DIRECT"] = "0"
    r = subprocess.run([BIN, "run", wf, "-q"], capture_output=True, text=True, env=env)
    check(r.returncode == 0, f"{name} ({'GDAL forced' if forced else 'default'}) runs: {r.stderr}")
    with open(os.path.join(out, "run.json")) as f:
        return out, json.load(f)


def pixels(gdal, path):
    ds = gdal.Open(path)
    a = ds.ReadAsArray()
    ds = None
    return a


def main():
    gdal = gdal_or_skip()
    if gdal is None:
        return 77
    import numpy as np
    work = tempfile.mkdtemp(prefix="tw_reader_")
    inputs = make_inputs(gdal, work)
    expect = {"pixel_deflate": "libtiff", "band_none": "libtiff", "masked": "gdal"}
    bands = {"pixel_deflate": "[1, 2, 3, 4, 5, 6]", "band_none": "[6, 5, 4, 3, 2, 1]",
             "masked": "[1, 2, 3, 4, 5, 6]"}
    for name, path in inputs.items():
        out_d, rj_d = run(work, name, path, bands[name], False)
        v = subprocess.run([BIN, "validate", out_d + ".yaml"], capture_output=True, text=True)
        said = [l for l in v.stdout.splitlines() if l.startswith("reader ")]
        check(v.returncode == 0 and len(said) == 1
              and ("libtiff" in said[0]) == (expect[name] == "libtiff")
              and (name != "masked" or "mask or alpha" in said[0]),
              f"{name}: validate names the reader: {said}")
        out_g, rj_g = run(work, name, path, bands[name], True)
        check(rj_d["inputs"][0]["reader"] == expect[name],
              f"{name}: read by {rj_d['inputs'][0]['reader']} (expected {expect[name]})")
        check(rj_g["inputs"][0]["reader"] == "gdal", f"{name}: TILEWISE_TIFF_DIRECT=0 reads by GDAL")
        check(rj_d["inputs"][0]["tiles_classified"] == rj_g["inputs"][0]["tiles_classified"]
              and rj_d["inputs"][0]["tiles_nodata"] == rj_g["inputs"][0]["tiles_nodata"],
              f"{name}: the same tiles classified and skipped "
              f"({rj_d['inputs'][0]['tiles_classified']}, {rj_d['inputs'][0]['tiles_nodata']})")
        stem = os.path.splitext(os.path.basename(path))[0]
        for prod in ("class", "prob"):
            a = pixels(gdal, os.path.join(out_d, f"{stem}.{prod}.tif"))
            b = pixels(gdal, os.path.join(out_g, f"{stem}.{prod}.tif"))
            check(a.shape == b.shape and np.array_equal(a, b, equal_nan=True),
                  f"{name}: {prod} raster identical through both readers {a.shape}")
        if name == "masked":
            check(rj_d["inputs"][0]["tiles_nodata"] > 0, "masked: the mask made nodata tiles")
    shutil.rmtree(work)
    print("ok: libtiff and GDAL readers give identical class and prob rasters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
