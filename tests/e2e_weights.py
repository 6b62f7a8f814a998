#!/usr/bin/python3
"""Weights are checked (issue 27), end to end through the CLI.

* NaN in fc.weight (every probability NaN, a map of class 0, exit 0 before)
  and in an inner convolution: `tilewise run` and `tilewise info` exit 3
  with one line naming the file and the tensor with its index, and leave
  no finished product.
* An HDF5 bundle written by tools/export_model.py carries tensors_sha256:
  `tilewise info` says "verified" (and info --json "checksum"); with 4 KiB
  of its data bytes flipped (exit 0 with another map before) the run exits
  3 naming the bundle and "checksum". A bundle from before the checksum
  still runs; info says "absent".
* runtime.precision int8 on a Float32 raster holding +3e38, -3e38 and Inf
  pixels (SIGSEGV, exit 139, before): exit 0, finite probabilities, and
  the class map of fp32 on every cell whose tile holds no huge pixel. Exit
  0 rather than an error because a +-3e38 pixel is a valid float: fp32
  classifies that raster (its tiles with a huge pixel saturate), and int8
  must give the same map up to its own rounding, not refuse what fp32
  takes. Such tiles are left out of int8's calibration sample
  (model/calib.h): left in, every other tile quantized to zero.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from e2eutil import BIN, FIX, MEAN, SRC, STD, check, finished_products, gdal_or_skip

EXIT_MODEL = 3


def run(args, timeout=300):
    r = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout)
    check(r.returncode >= 0, f"{' '.join(args[:2])}: killed by signal {-r.returncode}")
    return r


def workflow(tmp, name, weights, raster, precision="fp32", mean_std=True):
    wf, out = os.path.join(tmp, name + ".yaml"), os.path.join(tmp, name)
    norm = f"\n  mean: {MEAN}\n  std: {STD}" if mean_std else ""
    with open(wf, "w") as f:
        f.write(f"""input:
  path: {raster}
model:
  weights: {weights}{norm}
tiling:
  tile: 64
runtime:
  device: cpu
  memory: 1GiB
  precision: {precision}
output:
  dir: {out}
  products: [class, prob]
""")
    return wf, out


def one_line_error(r, *needles):
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    check(len(lines) == 1, f"one line on stderr, got {lines}")
    for n in needles:
        check(n in lines[0], f"'{n}' in: {lines[0]}")
    return lines[0]


def nan_weights(tmp, l7):
    import safetensors_io
    sd, _ = safetensors_io.load(f"{FIX}/resnet18_6b_7c.safetensors")
    for tensor, index, value, shown in (("fc.weight", (3, 17), np.nan, "fc.weight[3, 17] is NaN"),
                                        ("layer3.1.conv2.weight", (7, 100, 2, 0), np.inf,
                                         "layer3.1.conv2.weight[7, 100, 2, 0] is +Inf")):
        bad = {k: v.copy() for k, v in sd.items()}
        bad[tensor][index] = value
        path = os.path.join(tmp, f"bad_{tensor}.safetensors")
        safetensors_io.save(path, bad, "F32")
        wf, out = workflow(tmp, "nan_" + tensor, path, l7)
        r = run(["run", wf, "-q"])
        check(r.returncode == EXIT_MODEL, f"{tensor}: run exit {r.returncode}, expected 3")
        line = one_line_error(r, path, shown)
        check(not finished_products(out), f"{tensor}: no finished product")
        r = run(["info", path])
        check(r.returncode == EXIT_MODEL, f"{tensor}: info exit {r.returncode}")
        check(shown in r.stderr, f"{tensor}: info names the tensor")
        print(f"ok   {tensor} {value}: exit 3, {line}")
        # the exporter refuses them too, naming the same index
        r = subprocess.run([sys.executable, os.path.join(SRC, "tools", "export_model.py"), path,
                            "-o", os.path.join(tmp, "bad.h5")], capture_output=True, text=True)
        check(r.returncode == 1 and shown.split(" is ")[0] in r.stderr
              and not os.path.exists(os.path.join(tmp, "bad.h5")),
              f"export_model.py refuses {tensor}: {r.returncode} {r.stderr.strip()}")


def bundle_checksum(tmp, l7):
    import h5py
    import export_model
    import safetensors_io
    sd, _ = safetensors_io.load(f"{FIX}/resnet18_6b_7c.safetensors")
    good = os.path.join(tmp, "good.h5")
    export_model.export(sd, good, arch="resnet18", bands=[1, 2, 3, 4, 5, 6], mean=MEAN, std=STD,
                        tile=64)
    r = run(["info", good])
    check(r.returncode == 0 and "checksum:   verified" in r.stdout, f"info: {r.stdout}{r.stderr}")
    r = run(["info", "--json", good])
    check(r.returncode == 0 and json.loads(r.stdout)["checksum"] == "verified", "info --json")
    wf, out = workflow(tmp, "good", good, l7, mean_std=False)
    r = run(["run", wf, "-q"])
    check(r.returncode == 0, f"verified bundle runs: exit {r.returncode} {r.stderr}")
    check("checksum" not in r.stderr, "no checksum notice for a verified bundle")
    print("ok   exported bundle: checksum verified, runs")

    # 4 KiB of one tensor's data flipped after export
    with h5py.File(good, "r") as f:
        ds = f["tensors/layer4.0.conv2.weight"]
        off, size = ds.id.get_offset(), ds.id.get_storage_size()
    check(size > 8192, "a tensor of more than 8 KiB to damage")
    flipped = os.path.join(tmp, "flipped.h5")
    shutil.copy(good, flipped)
    with open(flipped, "r+b") as f:
        f.seek(off + 4096)
        b = f.read(4096)
        f.seek(off + 4096)
        f.write(bytes(x ^ 0xA5 for x in b))
    wf, out = workflow(tmp, "flipped", flipped, l7, mean_std=False)
    r = run(["run", wf, "-q"])
    check(r.returncode == EXIT_MODEL, f"flipped bundle: exit {r.returncode}, expected 3")
    line = one_line_error(r, flipped, "checksum")
    check(not finished_products(out), "flipped bundle: no finished product")
    print(f"ok   flipped bundle: exit 3, {line}")

    # a bundle from before the checksum: runs, info says so
    old = os.path.join(tmp, "old.h5")
    shutil.copy(good, old)
    with h5py.File(old, "r+") as f:
        del f.attrs["tensors_sha256"]
    r = run(["info", old])
    check(r.returncode == 0 and "checksum:   absent" in r.stdout, f"old bundle info: {r.stdout}")
    wf, out = workflow(tmp, "old", old, l7, mean_std=False)
    r = run(["run", wf, "-q"])
    check(r.returncode == 0, f"old bundle runs: exit {r.returncode} {r.stderr}")
    print("ok   bundle without a checksum: runs, info says absent")


def huge_pixels_int8(gdal, tmp, l7):
    src = gdal.Open(l7)
    a = src.ReadAsArray().astype(np.float32)  # (6, 352, 349)
    a[:, 10:20, 10:20] = 3e38                 # cell (0, 0)
    a[:, 100:110, 200:210] = -3e38            # cell (1, 3)
    a[:, 300:305, 50:55] = np.inf             # cell (4, 0): not finite, so nodata-filled
    huge_cells = {(0, 0), (1, 3), (4, 0)}
    raster = os.path.join(tmp, "huge.tif")
    ds = gdal.GetDriverByName("GTiff").Create(raster, a.shape[2], a.shape[1], 6,
                                              gdal.GDT_Float32)
    ds.SetGeoTransform(src.GetGeoTransform())
    ds.SetProjection(src.GetProjection())
    for i in range(6):
        ds.GetRasterBand(i + 1).WriteArray(a[i])
    ds = None
    maps = {}
    for precision in ("fp32", "int8"):
        wf, out = workflow(tmp, "huge_" + precision, f"{FIX}/resnet18_6b_7c.safetensors", raster,
                           precision)
        r = run(["run", wf, "-q"])
        check(r.returncode == 0, f"{precision} on +-3e38: exit {r.returncode} {r.stderr[-300:]}")
        with open(os.path.join(out, "run.json")) as f:
            check(json.load(f)["status"] == "ok", f"{precision}: run.json status ok")
        prob = gdal.Open(os.path.join(out, "huge.prob.tif")).ReadAsArray()
        check(np.isfinite(prob).all(), f"{precision}: every probability finite")
        maps[precision] = gdal.Open(os.path.join(out, "huge.class.tif")).ReadAsArray()
    h, w = maps["fp32"].shape
    cells = [(i, j) for i in range(h) for j in range(w) if (i, j) not in huge_cells]
    same = sum(maps["fp32"][c] == maps["int8"][c] for c in cells)
    # int8 vs fp32 on this fixture: every one of the 33 ordinary cells agreed
    # when measured; a calibration stretched by the huge tiles agreed on 1.
    check(same >= 0.9 * len(cells), f"int8 = fp32 on {same} of {len(cells)} ordinary cells")
    print(f"ok   int8 on +-3e38/Inf pixels: exit 0, finite, class map = fp32 on {same} of "
          f"{len(cells)} ordinary cells")


def main():
    gdal = gdal_or_skip()
    if gdal is None:
        return 77
    sys.path.insert(0, os.path.join(SRC, "tools"))
    l7 = f"{SRC}/sample_data/L7_ETMs.tif"
    with tempfile.TemporaryDirectory() as tmp:
        nan_weights(tmp, l7)
        bundle_checksum(tmp, l7)
        huge_pixels_int8(gdal, tmp, l7)
    return 0


if __name__ == "__main__":
    sys.exit(main())
