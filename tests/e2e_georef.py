#!/usr/bin/python3
"""End to end on a real raster: tilewise run vs PyTorch and GDAL.

* Probabilities in scene.prob.tif equal PyTorch's (torchvision ResNet-18 with
  randomized batch-norm, 6 bands, 7 classes; same tiles, same normalization,
  padding = 0 after normalization): max abs difference <= 1e-4, same argmax.
* Georeferencing through GDAL: CRS identical, origin identical, pixel size =
  stride x input's, grid = ceil(size / stride).
* Overlap averaging (stride = tile / 2): every output cell equals the mean of
  the probabilities of the tiles covering it, taken from the tile table
  (scene.tiles.h5), and those equal PyTorch's.
* The class map is the argmax of the probabilities, nodata 255 nowhere here.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

TOL = 1e-4
FIX = os.environ.get("TW_FIXTURES")
SRC = os.environ.get("TW_SOURCE_DIR")
BIN = os.environ.get("TW_BIN")


def torch_probs(tiles):
    import torch
    import torchvision
    model = torchvision.models.resnet18(num_classes=7)
    model.conv1 = torch.nn.Conv2d(6, 64, 7, 2, 3, bias=False)
    model.load_state_dict(torch.load(os.path.join(FIX, "resnet18_6b_7c.pth")))
    model = model.double().eval()
    with torch.no_grad():
        out = model(torch.from_numpy(tiles).double())
        return torch.softmax(out, dim=1).numpy()


def run(workdir, name, tile, stride, extra=(), edge="pad", paths=None):
    wf = os.path.join(workdir, name + ".yaml")
    out = os.path.join(workdir, name)
    mean = [79.0, 67.5, 64.4, 60.0, 80.0, 60.0]
    std = [14.7, 16.4, 21.6, 15.0, 25.0, 20.0]
    paths = paths or [f"{SRC}/sample_data/L7_ETMs.tif"]
    with open(wf, "w") as f:
        f.write(f"""input:
  path: [{", ".join(paths)}]
model:
  weights: {FIX}/resnet18_6b_7c.safetensors
  mean: {mean}
  std: {std}
tiling:
  tile: {tile}
  stride: {stride}
  edge: {edge}
runtime:
  device: cpu
  memory: 1GiB
output:
  dir: {out}
  products: [class, prob, confidence, tiles]
""")
    r = subprocess.run([BIN, "run", wf, "-q", *extra], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"tilewise run failed ({r.returncode}): {r.stderr}")
    return out, np.array(mean), np.array(std)


def main():
    if not (FIX and SRC and BIN):
        print("TW_FIXTURES/TW_SOURCE_DIR/TW_BIN not set: skipped")
        return 77
    from osgeo import gdal
    import h5py
    gdal.UseExceptions()
    src = gdal.Open(os.path.join(SRC, "sample_data", "L7_ETMs.tif"))
    img = src.ReadAsArray().astype(np.float64)  # (6, H, W)
    H, W = img.shape[1:]
    gt_in = src.GetGeoTransform()
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
            print("FAIL:", what)

    with tempfile.TemporaryDirectory() as tmp:
        for tile, stride in [(64, 64), (64, 32)]:
            out, mean, std = run(tmp, f"t{tile}s{stride}", tile, stride)
            k = tile // stride
            gw, gh = math.ceil(W / stride), math.ceil(H / stride)
            cls = gdal.Open(os.path.join(out, "L7_ETMs.class.tif"))
            prob = gdal.Open(os.path.join(out, "L7_ETMs.prob.tif"))
            conf = gdal.Open(os.path.join(out, "L7_ETMs.conf.tif"))
            for ds in (cls, prob, conf):
                check(ds.RasterXSize == gw and ds.RasterYSize == gh,
                      f"{ds.GetDescription()}: size {ds.RasterXSize}x{ds.RasterYSize} != {gw}x{gh}")
                check(ds.GetProjection() == src.GetProjection(), f"{ds.GetDescription()}: CRS differs")
                gt = ds.GetGeoTransform()
                check(gt[0] == gt_in[0] and gt[3] == gt_in[3], f"{ds.GetDescription()}: origin {gt[:4]}")
                check(abs(gt[1] - gt_in[1] * stride) < 1e-9 and abs(gt[5] - gt_in[5] * stride) < 1e-9,
                      f"{ds.GetDescription()}: pixel size {gt[1]},{gt[5]}")
            P = prob.ReadAsArray().astype(np.float64)  # (7, gh, gw)
            C = cls.ReadAsArray()
            check(P.shape == (7, gh, gw), f"prob shape {P.shape}")
            check(bool((C == P.argmax(axis=0)).all()), "class map != argmax of prob")
            check(bool((C != 255).all()), "unexpected nodata in class map")
            check(np.abs(conf.ReadAsArray() - P.max(axis=0)).max() < 1e-6, "conf != max prob")

            # PyTorch on the same tiles (pad: outside pixels are 0 after normalization).
            ny = math.ceil((H - tile) / stride) + 1
            nx = math.ceil((W - tile) / stride) + 1
            norm = (img - mean[:, None, None]) / std[:, None, None]
            padded = np.zeros((6, (ny - 1) * stride + tile, (nx - 1) * stride + tile))
            padded[:, :H, :W] = norm
            tiles = np.stack([padded[:, ty * stride:ty * stride + tile, tx * stride:tx * stride + tile]
                              for ty in range(ny) for tx in range(nx)])
            ref = torch_probs(tiles).reshape(ny, nx, 7)

            # tile table: origins and probabilities per tile
            with h5py.File(os.path.join(out, "L7_ETMs.tiles.h5"), "r") as h:
                org = h["origin"][:]
                tp = h["probabilities"][:]
                check(len(org) == ny * nx, f"tile table has {len(org)} tiles, expected {ny * nx}")
                tab = np.zeros((ny, nx, 7))
                for (r, c), p in zip(org, tp):
                    tab[r // stride, c // stride] = p
                d = np.abs(tab - ref).max()
                print(f"tile {tile} stride {stride}: tile table vs PyTorch max abs diff {d:.2e}")
                check(d <= TOL, f"tile table vs PyTorch {d}")
                check(bool((tab.argmax(-1) == ref.argmax(-1)).all()), "tile argmax differs from PyTorch")

            # expected cell values: mean over covering tiles (by construction)
            exp = np.zeros((gh, gw, 7))
            cnt = np.zeros((gh, gw, 1))
            for ty in range(ny):
                for tx in range(nx):
                    r1, c1 = min(ty + k, gh), min(tx + k, gw)
                    exp[ty:r1, tx:c1] += ref[ty, tx]
                    cnt[ty:r1, tx:c1] += 1
            exp /= cnt
            d = np.abs(P.transpose(1, 2, 0) - exp).max()
            print(f"tile {tile} stride {stride}: prob.tif vs averaged PyTorch max abs diff {d:.2e}")
            check(d <= TOL, f"prob.tif vs PyTorch average {d}")
            agree = (P.argmax(0) == exp.argmax(-1)).mean()
            check(agree == 1.0, f"argmax agreement {agree}")

            with open(os.path.join(out, "run.json")) as f:
                rep = json.load(f)
            check(rep["status"] == "ok", "run.json status")
            check(rep["inputs"][0]["tiles_classified"] == ny * nx, "run.json tiles_classified")

        # Edge modes, stride = tile = 64 on 349 x 352: five aligned tiles per axis
        # cover 0..319; `shift` adds a tile flush with the edge (x or y = size - 64)
        # feeding the last cell; `skip` leaves the last row/column of cells nodata.
        norm = (img - mean[:, None, None]) / std[:, None, None]
        for edge in ("shift", "skip"):
            out, _, _ = run(tmp, "edge_" + edge, 64, 64, edge=edge)
            P = gdal.Open(os.path.join(out, "L7_ETMs.prob.tif")).ReadAsArray().astype(np.float64)
            C = gdal.Open(os.path.join(out, "L7_ETMs.class.tif")).ReadAsArray()
            pos_x = [0, 64, 128, 192, 256] + ([W - 64] if edge == "shift" else [])
            pos_y = [0, 64, 128, 192, 256] + ([H - 64] if edge == "shift" else [])
            tiles = np.stack([norm[:, y:y + 64, x:x + 64] for y in pos_y for x in pos_x])
            ref = torch_probs(tiles).reshape(len(pos_y), len(pos_x), 7)
            if edge == "shift":
                d = np.abs(P.transpose(1, 2, 0) - ref).max()
                check(P.shape == (7, 6, 6) and d <= TOL, f"edge shift vs PyTorch: {d:.2e}")
            else:
                d = np.abs(P.transpose(1, 2, 0)[:5, :5] - ref).max()
                check(d <= TOL, f"edge skip vs PyTorch: {d:.2e}")
                check(bool((C[5, :] == 255).all() and (C[:, 5] == 255).all()) and
                      bool((P[:, 5, :] == -1).all()), "edge skip: last row/column nodata")
            print(f"edge {edge}: max abs diff vs PyTorch {d:.2e}")

        # A list of inputs: the model loads once, each raster gets its own outputs.
        twin = os.path.join(tmp, "twin.tif")
        gdal.Translate(twin, os.path.join(SRC, "sample_data", "L7_ETMs.tif"))
        out, _, _ = run(tmp, "multi", 64, 64, paths=[os.path.join(SRC, "sample_data", "L7_ETMs.tif"), twin])
        a = gdal.Open(os.path.join(out, "L7_ETMs.prob.tif")).ReadAsArray()
        b = gdal.Open(os.path.join(out, "twin.prob.tif")).ReadAsArray()
        with open(os.path.join(out, "run.json")) as f:
            rep = json.load(f)
        check(len(rep["inputs"]) == 2 and np.array_equal(a, b), "list of inputs: one output set each")

    print("e2e_georef:", "FAILED: " + "; ".join(failures) if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
