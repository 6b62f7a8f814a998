#!/usr/bin/python3
"""output.name: inputs with the same file name in different folders.

* Two inputs named L7_ETMs.tif (folders a/ and b/) without output.name: exit
  2 before any tile, the message naming both and pointing to output.name.
* With output.name "{parent}_{stem}": a_L7_ETMs.* and b_L7_ETMs.*, each equal
  pixel for pixel to a single run of that raster; "{stem}_{index}" gives
  L7_ETMs_1.* and L7_ETMs_2.*; run.json names the template.
* Two shards + merge under the template: the same files and pixels.
* A template that makes no file name ('/' in it) is refused naming the key.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from e2eutil import BIN, SRC, check, gdal_or_skip, write_workflow


def run(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600)


def pixels(gdal, path):
    ds = gdal.Open(path)
    return ds.ReadAsArray() if ds else None


def main():
    gdal = gdal_or_skip()
    if not gdal:
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        src = f"{SRC}/sample_data/L7_ETMs.tif"
        for d in ("a", "b"):
            os.makedirs(f"{tmp}/{d}")
        shutil.copy(src, f"{tmp}/a/L7_ETMs.tif")
        # b holds other pixels (flipped), so that a mix-up would show
        ds = gdal.Open(src)
        drv = gdal.GetDriverByName("GTiff")
        flipped = drv.CreateCopy(f"{tmp}/b/L7_ETMs.tif", ds)
        for i in range(flipped.RasterCount):
            band = flipped.GetRasterBand(i + 1)
            band.WriteArray(np.ascontiguousarray(band.ReadAsArray()[::-1, ::-1]))
        flipped = None
        ds = None
        paths = [f"{tmp}/a/L7_ETMs.tif", f"{tmp}/b/L7_ETMs.tif"]

        refs = {}
        for d in ("a", "b"):
            wf = f"{tmp}/{d}.yaml"
            write_workflow(wf, f"{tmp}/ref_{d}", paths[0 if d == "a" else 1])
            r = run("run", wf, "-q")
            check(r.returncode == 0, f"reference run {d}: {r.stderr}")
            refs[d] = pixels(gdal, f"{tmp}/ref_{d}/L7_ETMs.class.tif")

        wf = f"{tmp}/both.yaml"
        write_workflow(wf, f"{tmp}/clash", paths)
        r = run("run", wf, "-q")
        check(r.returncode == 2 and "would write the same outputs" in r.stderr
              and "output.name" in r.stderr and "{parent}_{stem}" in r.stderr,
              f"same names: exit 2 pointing to output.name ({r.returncode} {r.stderr.strip()})",
              True)

        out = f"{tmp}/named"
        r = run("run", wf, "-q", "--set", f"output.dir={out}", "--set",
                'output.name="{parent}_{stem}"')
        check(r.returncode == 0, f"with {{parent}}_{{stem}}: {r.stderr}")
        for d in ("a", "b"):
            got = pixels(gdal, f"{out}/{d}_L7_ETMs.class.tif")
            check(got is not None and np.array_equal(got, refs[d]),
                  f"{d}_L7_ETMs.class.tif equals the single run of {d}/L7_ETMs.tif", True)
        with open(f"{out}/run.json") as f:
            rep = json.load(f)
        check(rep["config"]["output"]["name"] == "{parent}_{stem}", "run.json names the template")

        out = f"{tmp}/indexed"
        r = run("run", wf, "-q", "--set", f"output.dir={out}", "--set",
                'output.name="{stem}_{index}"')
        check(r.returncode == 0 and os.path.exists(f"{out}/L7_ETMs_1.class.tif")
              and os.path.exists(f"{out}/L7_ETMs_2.class.tif"),
              f"{{stem}}_{{index}} names L7_ETMs_1 and L7_ETMs_2: {r.stderr}", True)

        out = f"{tmp}/shards"
        for i in (1, 2):
            r = run("run", wf, "-q", "--shard", f"{i}/2", "--set", f"output.dir={out}", "--set",
                    'output.name="{parent}_{stem}"')
            check(r.returncode == 0, f"shard {i}/2: {r.stderr}")
        r = run("merge", "-q", out)
        check(r.returncode == 0, f"merge: {r.stderr}")
        for d in ("a", "b"):
            got = pixels(gdal, f"{out}/{d}_L7_ETMs.class.tif")
            check(got is not None and np.array_equal(got, refs[d]),
                  f"merged shards: {d}_L7_ETMs.class.tif equals the single run", True)

        r = run("run", wf, "-q", "--set", 'output.name="{parent}/{stem}"')
        check(r.returncode == 2 and "output.name" in r.stderr and "holds a '/'" in r.stderr,
              f"a '/' in the name refused: {r.stderr.strip()}", True)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
