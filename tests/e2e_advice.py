#!/usr/bin/python3
"""run gives validate's advice before the first tile (issue 29.1).

A 6-band uint16 "reflectance" raster whose bands span 0..2000 to 0..8000,
with a workflow that forgets input.scale (the model's mean is 0.1, std 0.05):
* validate warns for every band, with ONE scale hint for the raster (before,
  each band got its own order of magnitude: 1e-05 for one, 0.0001 for the
  next);
* run -q exits 0 but prints the same warnings on stderr, and run.json lists
  them under "warnings" (code "values"); before, run was silent and wrote a
  garbage class map;
* run --strict exits 2 before the first tile: nothing in output.dir, and the
  report (--report) says why, with the warnings;
* with the right input.scale there is no warning, and --strict runs.

The scale hint is computed (issue 40.2), not guessed from mid-ranges:
* Landsat 8-like uint16 bands with means ~9,000 and a model with mean 0.9 /
  std 0.1: the hint is 0.0001 (it said 1e-05 before, from
  the mid-range of bands with a few saturated pixels), and input.scale 1e-05
  is warned (validate accepted it before: its range stayed within +-8);
* a uint8 raster with a scale-1e-4 model whose normalized values fall about
  -4 to -6: warned, with the hint 0.001 (before: "6 of 6 bands within a
  plausible range", no warning);
* bands that need different scales get a hint each, not one that suits none.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

from e2eutil import BIN, FIX, check, gdal_or_skip

MIDS = [4000, 1000, 2000, 3000, 1500, 2500]


def main():
    gdal = gdal_or_skip()
    if not gdal:
        return 77
    from osgeo import osr
    with tempfile.TemporaryDirectory() as tmp:
        raster = f"{tmp}/refl.tif"
        ds = gdal.GetDriverByName("GTiff").Create(raster, 128, 128, 6, gdal.GDT_UInt16)
        ds.SetGeoTransform((500000, 10, 0, 4000000, 0, -10))
        srs = osr.SpatialReference()
        srs.ImportFromEPSG(32633)
        ds.SetProjection(srs.ExportToWkt())
        rng = np.random.default_rng(5)
        for b, mid in enumerate(MIDS):
            ds.GetRasterBand(b + 1).WriteArray(
                rng.integers(0, 2 * mid, size=(128, 128)).astype(np.uint16))
        ds = None

        def workflow(path, out, scale=None):
            with open(path, "w") as f:
                f.write(f"""input:
  path: {raster}
{f'  scale: {scale}' if scale else ''}
model:
  weights: {FIX}/resnet18_6b_7c.safetensors
  mean: {[mid * 1e-4 for mid in MIDS]}
  std: [0.05, 0.05, 0.05, 0.05, 0.05, 0.05]
tiling:
  tile: 64
runtime:
  device: cpu
output:
  dir: {out}
  products: [class]
""")

        wf = f"{tmp}/w.yaml"
        out = f"{tmp}/out"
        workflow(wf, out)
        r = subprocess.run([BIN, "validate", wf], capture_output=True, text=True)
        warns = [ln for ln in r.stdout.splitlines() if ln.startswith("warning")]
        hints = set(re.findall(r"is input.scale (\S+) meant", r.stdout))
        check(r.returncode == 0 and len(warns) == 6, f"validate: 6 band warnings ({r.stdout})")
        check(hints == {"0.0001"}, f"one scale hint for the raster, 0.0001: {hints}", True)

        r = subprocess.run([BIN, "run", wf, "-q"], capture_output=True, text=True)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        check(r.returncode == 0 and len(lines) == 6 and all("warning" in ln for ln in lines),
              f"run -q exits 0 and prints the 6 warnings ({r.returncode}: {r.stderr})", True)
        with open(f"{out}/run.json") as f:
            rep = json.load(f)
        codes = [w["code"] for w in rep["warnings"]]
        check(codes == ["values"] * 6, f"run.json lists the warnings: {codes}", True)

        out2 = f"{tmp}/strict"
        r = subprocess.run([BIN, "run", wf, "-q", "--strict", "--set", f"output.dir={out2}",
                            "--report", f"{tmp}/strict.json"], capture_output=True, text=True)
        check(r.returncode == 2 and "--strict: 6 warnings before the first tile" in r.stderr,
              f"--strict: exit 2 before the first tile ({r.returncode}: {r.stderr[-300:]})", True)
        check(not os.path.exists(out2), "--strict: nothing written in output.dir", True)
        with open(f"{tmp}/strict.json") as f:
            failed = json.load(f)
        check(failed["exit_code"] == 2 and failed["tiles_classified"] == 0 and
              len(failed["warnings"]) == 6, "the report: exit 2, 0 tiles, the warnings", True)

        out3 = f"{tmp}/scaled"
        workflow(wf, out3, scale=0.0001)
        r = subprocess.run([BIN, "run", wf, "-q", "--strict"], capture_output=True, text=True)
        with open(f"{out3}/run.json") as f:
            rep = json.load(f)
        check(r.returncode == 0 and r.stderr.strip() == "" and rep["warnings"] == [],
              f"with input.scale 0.0001: no warning, --strict runs ({r.stderr})", True)
        scale_cases(gdal, tmp, srs)
    print("ok")
    return 0


def scale_cases(gdal, tmp, srs):
    def raster(path, arrays, gtype):
        ds = gdal.GetDriverByName("GTiff").Create(path, 128, 128, len(arrays), gtype)
        ds.SetGeoTransform((500000, 30, 0, 4000000, 0, -30))
        ds.SetProjection(srs.ExportToWkt())
        for b, a in enumerate(arrays):
            ds.GetRasterBand(b + 1).WriteArray(a)
        ds = None

    rng = np.random.default_rng(7)
    l8 = f"{tmp}/l8.tif"
    bands = [rng.integers(6000, 12000, size=(128, 128)).astype(np.uint16) for _ in range(6)]
    for a in bands:  # a few saturated pixels, as over clouds: the mid-range is ~36,000
        a[rng.random((128, 128)) < 0.002] = 65535
    raster(l8, bands, gdal.GDT_UInt16)
    u8 = f"{tmp}/u8.tif"
    raster(u8, [rng.integers(0, 200, size=(128, 128)).astype(np.uint8) for _ in range(6)],
           gdal.GDT_Byte)

    def validate(path, mean, std, scale=None, cmd="validate"):
        wf = f"{tmp}/s.yaml"
        with open(wf, "w") as f:
            f.write(f"""input:
  path: {path}
{f'  scale: {scale}' if scale else ''}
model:
  weights: {FIX}/resnet18_6b_7c.safetensors
  mean: {mean}
  std: {std}
tiling:
  tile: 64
runtime:
  device: cpu
output:
  dir: {tmp}/s_out
  products: [class]
""")
        args = [BIN, cmd, wf] + (["-q", "--set", f"output.dir={tmp}/s_{cmd}_{scale}"]
                                 if cmd == "run" else [])
        r = subprocess.run(args, capture_output=True, text=True)
        text = r.stdout if cmd == "validate" else r.stderr
        warns = [ln for ln in text.splitlines()
                 if ln.startswith("warning" if cmd == "validate" else "tilewise: warning")]
        return r, warns, set(re.findall(r"is input.scale (\S+) meant", text))

    m9, s1 = [0.9] * 6, [0.1] * 6
    r, warns, hints = validate(l8, m9, s1)
    check(r.returncode == 0 and len(warns) == 6 and hints == {"0.0001"},
          f"uint16 means ~9,000, model mean 0.9: 6 warnings, hint 0.0001 ({hints}: {r.stdout})",
          True)
    r, warns, hints = validate(l8, m9, s1, scale=1e-05)
    check(len(warns) == 6 and all("a mean outside +-3" in w for w in warns) and
          hints == {"0.0001"}, f"input.scale 1e-05: warned, hint 0.0001 ({r.stdout})", True)
    r, warns, hints = validate(l8, m9, s1, scale=1e-05, cmd="run")
    check(r.returncode == 0 and len(warns) == 6 and hints == {"0.0001"},
          f"run: the same warnings and hint ({r.returncode}: {r.stderr[-600:]})", True)
    r, warns, hints = validate(l8, m9, s1, scale=0.0001)
    check(r.returncode == 0 and warns == [] and "advice    0 warnings" in r.stdout,
          f"input.scale 0.0001: no warning ({r.stdout})", True)

    r, warns, hints = validate(u8, [0.11] * 6, [0.02] * 6, scale=0.0001)
    check(len(warns) == 6 and all("a mean outside +-3" in w for w in warns) and
          hints == {"0.001"}, f"uint8 raster, scale-1e-4 model: warned, hint 0.001 ({r.stdout})",
          True)

    r, warns, hints = validate(l8, [0.9] * 3 + [0.09] * 3, s1, scale=1)
    alone = re.findall(r"band (\d): .*this band alone would need input.scale (\S+),", r.stdout)
    check(len(warns) == 6 and not hints and
          alone == [("1", "0.0001"), ("2", "0.0001"), ("3", "0.0001"), ("4", "1e-05"),
                    ("5", "1e-05"), ("6", "1e-05")],
          f"bands that disagree: a hint per band ({alone}: {r.stdout})", True)


if __name__ == "__main__":
    sys.exit(main())
