#!/usr/bin/python3
"""The PyTorch loop users write to classify a raster tile by tile.

    torch_loop.py RASTER WEIGHTS.safetensors OUT.tif --arch resnet18 --tile 64
                  --mean m1,..,m6 --std s1,..,s6 [--batch 64] [--workers 0]
                  [--threads 2]

A torch Dataset opens the raster with rasterio (once per worker process) and
reads one rasterio.windows.Window per tile; it normalizes (x - mean) / std;
a DataLoader batches; a torchvision ResNet runs under torch.inference_mode();
softmax + argmax give the class of each tile; at the end the class grid is
written with rasterio as a GeoTIFF whose pixel is one tile (the same grid as
tilewise's class product with stride = tile). Tiles that would run past the
right or bottom edge are left out (the benchmark rasters are whole multiples
of the tile).

Prints one JSON line: tiles, seconds (from opening the raster to the output
written: the end-to-end figure), tiles_per_s, and setup_s (imports and model
construction before that). Peak RSS is measured by the caller (wait4).
"""
import argparse
import json
import os
import sys
import time

T_START = time.perf_counter()

import numpy as np  # noqa: E402
import rasterio  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402
from rasterio.windows import Window  # noqa: E402

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tools"))
import safetensors_io  # noqa: E402


class TileDataset(torch.utils.data.Dataset):
    """One item per tile: (normalized float32 tensor BANDS x T x T, tile index)."""

    def __init__(self, path, tile, mean, std):
        self.path = path
        self.tile = tile
        with rasterio.open(path) as ds:
            self.rows = ds.height // tile
            self.cols = ds.width // tile
        self.mean = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)
        self.ds = None  # opened lazily: a rasterio handle cannot cross a fork

    def __len__(self):
        return self.rows * self.cols

    def __getitem__(self, i):
        if self.ds is None:
            self.ds = rasterio.open(self.path)
        r, c = divmod(i, self.cols)
        arr = self.ds.read(window=Window(c * self.tile, r * self.tile, self.tile, self.tile))
        x = torch.from_numpy(arr.astype(np.float32))
        return (x - self.mean) / self.std, i


def build_model(arch, weights):
    tensors, _ = safetensors_io.load(weights)
    sd = {k: torch.from_numpy(np.array(v)) for k, v in tensors.items()}
    bands = sd["conv1.weight"].shape[1]
    classes = sd["fc.weight"].shape[0]
    small = arch.endswith("_small")  # export_onnx.py's small stem: 3x3 s1 conv1, no max pool
    model = getattr(torchvision.models, arch[:-6] if small else arch)(weights=None,
                                                                      num_classes=classes)
    if small:
        model.conv1 = torch.nn.Conv2d(bands, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = torch.nn.Identity()
    else:
        model.conv1 = torch.nn.Conv2d(bands, 64, kernel_size=7, stride=2, padding=3, bias=False)
    res = model.load_state_dict(sd, strict=False)
    # only num_batches_tracked may be missing: export_onnx.py does not store it
    missing = [k for k in res.missing_keys if not k.endswith("num_batches_tracked")]
    if missing or res.unexpected_keys:
        raise SystemExit(f"{weights}: not a {arch} state_dict (missing {missing[:3]}, "
                         f"unexpected {res.unexpected_keys[:3]})")
    return model.eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("raster")
    ap.add_argument("weights")
    ap.add_argument("out")
    ap.add_argument("--arch", required=True)
    ap.add_argument("--tile", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mean", required=True)
    ap.add_argument("--std", required=True)
    a = ap.parse_args()
    mean = [float(v) for v in a.mean.split(",")]
    std = [float(v) for v in a.std.split(",")]

    torch.set_num_threads(a.threads)
    model = build_model(a.arch, a.weights)
    setup_s = time.perf_counter() - T_START

    t0 = time.perf_counter()
    data = TileDataset(a.raster, a.tile, mean, std)
    loader = torch.utils.data.DataLoader(data, batch_size=a.batch, shuffle=False,
                                         num_workers=a.workers)
    classes = np.full(len(data), 255, dtype=np.uint8)
    with torch.inference_mode():
        for x, idx in loader:
            prob = torch.softmax(model(x), dim=1)
            classes[idx.numpy()] = prob.argmax(dim=1).numpy().astype(np.uint8)

    with rasterio.open(a.raster) as src:
        profile = dict(driver="GTiff", width=data.cols, height=data.rows, count=1,
                       dtype="uint8", nodata=255, crs=src.crs, compress="deflate",
                       transform=src.transform * src.transform.scale(a.tile, a.tile))
    with rasterio.open(a.out, "w", **profile) as dst:
        dst.write(classes.reshape(data.rows, data.cols), 1)
    seconds = time.perf_counter() - t0

    print(json.dumps({"tiles": len(data), "seconds": seconds,
                      "tiles_per_s": len(data) / seconds, "setup_s": setup_s,
                      "batch": a.batch, "workers": a.workers, "threads": a.threads,
                      "torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
