#!/usr/bin/python3
"""Segmentation on the CPU: tilewise against the PyTorch loop and ONNX Runtime, in one run
(issue 36, "Speed").

    bench/seg_vs_peers.py [--bin build/tilewise] [--tile 256] [--size 2048x1024]
                          [--only unet_resnet34|deeplabv3_resnet50] [--repeat 2]

For U-Net-ResNet34 (segmentation_models_pytorch's layout, written out as
tests/e2e_seg_parity.py does: SMP is not packaged) and torchvision's
DeepLabV3-ResNet50, random weights (fixed seeds), 4 bands, 5 classes, the same
raster (sample_data/L7_ETMs.tif's bands 1-4 upsampled to --size, a tiled
GeoTIFF) and tiles of --tile px placed every --tile px (no overlap: the same
work for every runner) go through:

* the PyTorch loop users write: a torch Dataset reading one rasterio window per
  tile, a DataLoader (batch 4), the module under inference_mode with 2
  threads, softmax and argmax per pixel, the class raster written at the end:
  end-to-end tiles/s;
* ONNX Runtime (bench/peers/ort_model.js: onnxruntime-node, CPU provider, 2
  intra-op threads, graph optimisation all), the model alone on random
  tensors, batch 4: tiles/s (the peer's upper bound: no reading, no output);
* tilewise run (runtime.device cpu, runtime.threads 2, products [class],
  batch auto): end-to-end tiles/s from run.json.

Each is run --repeat times; the best is kept (the machine may be shared: say so
with the figures). Prints the table and tilewise / loop, tilewise / ORT. The
issue's goal: >= 1.5x the loop and >= 1.1x ORT.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
PEERS = os.path.join(REPO, "bench", "peers")
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "tools"))
BANDS, CLASSES = 4, 5

LOOP = r'''
import json, sys, time
t0 = time.perf_counter()
import numpy as np, rasterio, torch
from rasterio.windows import Window
torch.set_num_threads(2)
model = torch.load(sys.argv[2], weights_only=False).eval()
T = int(sys.argv[4])

class Tiles(torch.utils.data.Dataset):
    def __init__(self):
        with rasterio.open(sys.argv[1]) as ds:
            self.rows, self.cols = ds.height // T, ds.width // T
        self.ds = None
    def __len__(self):
        return self.rows * self.cols
    def __getitem__(self, i):
        if self.ds is None:
            self.ds = rasterio.open(sys.argv[1])
        r, c = divmod(i, self.cols)
        a = self.ds.read(window=Window(c * T, r * T, T, T)).astype(np.float32)
        return torch.from_numpy((a - 100.0) / 50.0), i

t1 = time.perf_counter()
data = Tiles()
out = np.zeros((data.rows * T, data.cols * T), np.uint8)
with torch.inference_mode():
    for x, idx in torch.utils.data.DataLoader(data, batch_size=4, num_workers=0):
        y = model(x)
        y = y["out"] if isinstance(y, dict) else y
        cls = torch.softmax(y, dim=1).argmax(dim=1).numpy().astype(np.uint8)
        for k, i in enumerate(idx.tolist()):
            r, c = divmod(i, data.cols)
            out[r * T:(r + 1) * T, c * T:(c + 1) * T] = cls[k]
with rasterio.open(sys.argv[1]) as src:
    prof = src.profile
prof.update(count=1, dtype="uint8", compress="deflate")
with rasterio.open(sys.argv[3], "w", **prof) as dst:
    dst.write(out, 1)
s = time.perf_counter() - t1
print(json.dumps({"tiles": len(data), "seconds": s, "tiles_per_s": len(data) / s}))
'''


def build(name):
    import torch
    import e2e_seg_parity as sp
    torch.manual_seed(36)
    if name == "unet_resnet34":
        m = sp.UnetResNet34(BANDS, CLASSES)
    else:
        import torchvision.models.segmentation as seg
        m = seg.deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=CLASSES,
                                   aux_loss=False)
        m.backbone.conv1 = torch.nn.Conv2d(BANDS, 64, 7, 2, 3, bias=False)
    return m.eval()


class Plain(__import__("torch").nn.Module):
    """The module's logits alone (torchvision's segmentation models return a dict)."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        y = self.m(x)
        return y["out"] if isinstance(y, dict) else y


def best(fn, repeat):
    runs = [fn() for _ in range(repeat)]
    return max(runs, key=lambda r: r["tiles_per_s"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "tilewise"))
    ap.add_argument("--tile", type=int, default=256)
    ap.add_argument("--size", default="2048x1024")
    ap.add_argument("--only", default="")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    import torch
    import safetensors_io
    from osgeo import gdal
    gdal.UseExceptions()
    if not os.path.isdir(os.path.join(PEERS, "node_modules")):
        subprocess.run(["npm", "install", "--ignore-scripts", "--no-audit", "--no-fund"],
                       cwd=PEERS, check=True)
    W, H = (int(v) for v in a.size.split("x"))
    T = a.tile
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
                if l.startswith("model name")), "?")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        raster = os.path.join(tmp, "in.tif")
        gdal.Translate(raster, os.path.join(REPO, "sample_data", "L7_ETMs.tif"), width=W, height=H,
                       bandList=[1, 2, 3, 4], creationOptions=["TILED=YES", "COMPRESS=DEFLATE"])
        for name in ("unet_resnet34", "deeplabv3_resnet50"):
            if a.only and name != a.only:
                continue
            m = build(name)
            st = os.path.join(tmp, name + ".safetensors")
            sd = {k: v.detach().float().numpy() for k, v in m.state_dict().items()
                  if not k.endswith("num_batches_tracked")}
            safetensors_io.save(st, sd, "F32")
            pt = os.path.join(tmp, name + ".pt")
            torch.save(m, pt)
            onnx = os.path.join(tmp, name + ".onnx")
            torch.onnx.export(Plain(m), torch.zeros(1, BANDS, T, T), onnx, opset_version=17,
                              input_names=["input"], output_names=["out"],
                              dynamic_axes={"input": {0: "batch"}, "out": {0: "batch"}})
            loop_py = os.path.join(tmp, "loop.py")
            open(loop_py, "w").write(LOOP)

            def loop():
                r = subprocess.run(["/usr/bin/python3", loop_py, raster, pt,
                                    os.path.join(tmp, "loop.tif"), str(T)],
                                   capture_output=True, text=True, check=True)
                return json.loads(r.stdout.strip().splitlines()[-1])

            def ort():
                r = subprocess.run(["node", os.path.join(PEERS, "ort_model.js"), onnx, "--batch",
                                    "4", "--tile", str(T), "--bands", str(BANDS), "--threads",
                                    "2", "--warmup", "1", "--runs", "4"],
                                   capture_output=True, text=True, check=True)
                return json.loads(r.stdout.strip().splitlines()[-1])

            def tw():
                out = os.path.join(tmp, "tw_" + name)
                wf = os.path.join(tmp, "flow.yaml")
                open(wf, "w").write(
                    f"input: {{path: {raster}}}\n"
                    f"model: {{weights: {st}, mean: [100, 100, 100, 100], std: [50, 50, 50, 50]}}\n"
                    f"tiling: {{tile: {T}, stride: {T}, edge: skip}}\n"
                    f"runtime: {{device: cpu, threads: 2, memory: 4GiB}}\n"
                    f"output: {{dir: {out}, products: [class]}}\n")
                subprocess.run([a.bin, "run", wf, "-q", "--restart"], check=True,
                               capture_output=True)
                r = json.load(open(os.path.join(out, "run.json")))
                s = r["inputs"][0]["seconds"] if r.get("inputs") else r["seconds"]
                return {"tiles": r["tiles_classified"], "seconds": s,
                        "tiles_per_s": r["tiles_classified"] / s}

            t, l, o = best(tw, a.repeat), best(loop, a.repeat), best(ort, a.repeat)
            rows.append((name, t, l, o))
            print(f"{name}: tilewise {t['tiles_per_s']:.2f}, loop {l['tiles_per_s']:.2f}, "
                  f"ORT {o['tiles_per_s']:.2f} tiles/s", flush=True)
    print(f"\nCPU: {cpu}, {os.cpu_count()} cores; {W} x {H} px, tile {T} (stride {T}), 4 bands, "
          f"5 classes, random weights; best of {a.repeat}")
    print("| model | tilewise tiles/s | PyTorch loop | ORT (model only) | tilewise / loop | "
          "tilewise / ORT |")
    print("|---|---|---|---|---|---|")
    for name, t, l, o in rows:
        print(f"| {name} | {t['tiles_per_s']:.2f} | {l['tiles_per_s']:.2f} | "
              f"{o['tiles_per_s']:.2f} | {t['tiles_per_s'] / l['tiles_per_s']:.2f}x | "
              f"{t['tiles_per_s'] / o['tiles_per_s']:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
