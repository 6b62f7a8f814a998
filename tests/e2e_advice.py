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
  mean: [0.1, 0.1, 0.1, 0.1, 0.1, 0.1]
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
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
