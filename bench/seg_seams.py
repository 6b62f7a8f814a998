#!/usr/bin/python3
"""Seams of blended segmentation tiles (issue 36, "What it must show", Seams).

A network gives a whole-image class map with PyTorch (one forward pass of the
whole raster) and then tilewise classifies the same raster tile by tile (tile
--tile, default 128, tiling.edge pad) for every tiling.blend (mean, linear,
cosine) x tiling.margin (0 and a quarter of the overlap) x two overlaps
(stride = tile/2 and 3*tile/4), plus one run without overlap (stride = tile)
for reference. Per configuration it reports:

* agree: the share of pixels whose tilewise class equals the whole-image one;
* edge/int: the disagreement rate on pixels within 8 px of a tile edge (the
  edges of the tiles where the plan places them, those on the raster's own
  border left out) over the disagreement rate on the other pixels: 1 means
  no seam, larger means the errors gather at tile edges.

The networks:

* The demo U-Net, sample_data/demo_unet_resnet18.h5 (--demo-unet) when it
  exists (built by tools/make_demo_model.py --arch unet_resnet18 beside the
  bundle, which this imports), on the whole of its own raster,
  sample_data/L7_ETMs.tif (349 x 352, 6 bands). The bundle's mean/std are
  applied here and the result written as a Float32 raster, the weights
  exported as safetensors: tilewise reads the same numbers as PyTorch. The
  whole image is padded with zeros (in the normalised space) at the right to
  352 columns, a multiple of 32, and the map cropped back: the
  zeros tiling.edge pad feeds a tile past the raster's edge.
* On a 512 x 512 crop (--x0/--y0) of the NAIP raster in shared/data (RGBN,
  4 bands; 512 is a multiple of 32: no padding):
  - when the demo U-Net is absent (or --only unet), a U-Net-ResNet18 in
    segmentation_models_pytorch's layout (tests/e2e_seg_parity.py's
    UnetResNet34 with depth 18 and SMP's default decoder 256, 128, 64, 32,
    16), 4 classes, raw 0..255 pixels (the 1/255 scaling folded into
    conv1): --unet FILE.pt (a pickled module, e.g. the unet18.pt that --keep
    leaves), or trained here for --train-seconds (default 120) on
    the raster's per-pixel spectral-rule labels (tools/make_demo_model.py's
    rules in NAIP's band order), random 64 px crops, Adam;
  - a DeepLabV3-ResNet50 (torchvision's, 5 classes) with random weights,
    batch-norm statistics drawn away from 1/0 and the logits spread over ~3
    units (e2e_seg_parity's make()), each band standardised over the crop.
    Seams from receptive-field truncation exist for any weights: a tile sees
    zeros where the whole image has pixels, and the ASPP's image-pooling
    branch averages over the tile, not the image.

Not part of make test. Each network takes a few minutes on 2 shared cores.

usage: bench/seg_seams.py [--bin build/tilewise] [--tile 128] [--threads 2]
                          [--only demo|unet|deeplabv3] [--demo-unet FILE.h5]
                          [--unet FILE.pt] [--train-seconds 120] [--keep DIR]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, os.path.join(REPO, "tools"))
os.environ.setdefault("TW_SOURCE_DIR", REPO)
os.environ.setdefault("TW_BIN", os.path.join(REPO, "build", "tilewise"))

import e2e_blend_ref as br  # noqa: E402
import e2e_seg_parity as sp  # noqa: E402

SIZE = 512
NEAR = 8          # px from a tile edge that count as "at the edge"
RULE_CLASSES = 4  # water, dense vegetation, sparse vegetation, bare/built


def crop(path, out, x0, y0):
    """The SIZE x SIZE window at (x0, y0), 4 bands, without a nodata value."""
    from osgeo import gdal
    gdal.UseExceptions()
    gdal.Translate(out, path, srcWin=[x0, y0, SIZE, SIZE], noData="none",
                   creationOptions=["TILED=YES", "BLOCKXSIZE=128", "BLOCKYSIZE=128"])
    return gdal.Open(out).ReadAsArray().astype(np.float32)


def rule_labels(img):
    """tools/make_demo_model.py's pixel rules on NAIP's R, G, B, NIR."""
    r, g, _, nir = img.astype(np.float64)
    ndvi = (nir - r) / (nir + r + 1e-9)
    ndwi = (g - nir) / (g + nir + 1e-9)
    cls = np.full(ndvi.shape, 3, dtype=np.int64)
    cls[ndvi > 0.10] = 2
    cls[ndvi > 0.30] = 1
    cls[ndwi > 0.30] = 0
    return cls


def train_unet(img, seconds, seed=0):
    """A U-Net-ResNet18 trained on img's rule labels; conv1 takes raw pixels."""
    import torch
    torch.manual_seed(seed)
    rng = np.random.RandomState(seed)
    m = sp.UnetResNet34(4, RULE_CLASSES, depth=18)
    x = torch.from_numpy(img / 255.0).float()
    y = torch.from_numpy(rule_labels(img))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    m.train()
    t0, step, T, B = time.time(), 0, 64, 16
    _, h, w = img.shape
    while time.time() - t0 < seconds:
        ys, xs = rng.randint(0, h - T, B), rng.randint(0, w - T, B)
        xb = torch.stack([x[:, a:a + T, b:b + T] for a, b in zip(ys, xs)])
        yb = torch.stack([y[a:a + T, b:b + T] for a, b in zip(ys, xs)])
        if step % 2:
            xb, yb = xb.flip(3), yb.flip(2)
        loss = torch.nn.functional.cross_entropy(m(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
    m.eval()
    with torch.no_grad():
        m.encoder.conv1.weight /= 255.0
    print(f"U-Net trained {step} steps of {B} x {T} px in {seconds} s, last loss {loss.item():.3f}",
          flush=True)
    return m


def whole_map(m, img, multiple):
    """argmax of one forward pass over the whole crop (zero-padded to `multiple`)."""
    import torch
    _, h, w = img.shape
    H, W = -(-h // multiple) * multiple, -(-w // multiple) * multiple
    pad = np.zeros((1, img.shape[0], H, W), np.float32)
    pad[0, :, :h, :w] = img
    with torch.no_grad():
        out = m(torch.from_numpy(pad))
        out = out["out"] if isinstance(out, dict) else out
    return out[0, :, :h, :w].argmax(0).numpy()


def near_edges(size, tile, stride):
    """Rows (or columns) within NEAR px of an edge of a tile the plan places
    (tiling.edge pad), edges on the raster's border left out."""
    pos = br.positions(size, tile, stride, "pad")
    edges = sorted({e for p in pos for e in (p, p + tile) if 0 < e < size})
    c = np.arange(size) + 0.5
    near = np.zeros(size, bool)
    for e in edges:
        near |= np.abs(c - e) < NEAR
    return near


def edge_mask(h, w, tile, stride):
    return near_edges(h, tile, stride)[:, None] | near_edges(w, tile, stride)[None, :]


def run_tilewise(a, tmp, raster, model, arch, stride, blend, margin):
    from osgeo import gdal
    out = os.path.join(tmp, f"out_{arch}_{stride}_{blend}_{margin}")
    wf = os.path.join(tmp, "w.yaml")
    with open(wf, "w") as f:
        f.write(f"""input: {{path: {raster}}}
model: {{weights: {model}, arch: {arch}}}
tiling: {{tile: {a.tile}, stride: {stride}, edge: pad, blend: {blend}, margin: {margin}}}
runtime: {{threads: {a.threads}}}
output: {{dir: {out}, products: [class]}}
""")
    r = subprocess.run([a.bin, "run", wf], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"tilewise failed ({r.returncode}): {r.stderr.strip()}")
    name = os.path.splitext(os.path.basename(raster))[0]
    return gdal.Open(os.path.join(out, name + ".class.tif")).ReadAsArray()


def measure(a, tmp, raster, model, arch, whole, label):
    T = a.tile
    rows = []
    configs = [(T, "mean", 0)]
    for stride in (T // 2, 3 * T // 4):
        for blend in ("mean", "linear", "cosine"):
            for margin in (0, (T - stride) // 4):
                configs.append((stride, blend, margin))
    for stride, blend, margin in configs:
        got = run_tilewise(a, tmp, raster, model, arch, stride, blend, margin)
        near = edge_mask(whole.shape[0], whole.shape[1], T, stride)
        bad = got != whole
        de, di = bad[near].mean(), bad[~near].mean()
        ratio = de / di if di > 0 else float("inf")
        rows.append((label, T, stride, T - stride, blend, margin, 1 - bad.mean(), de, di, ratio))
        print(f"| {label} | {T} | {stride} | {T - stride} | {blend} | {margin} | "
              f"{1 - bad.mean():.4f} | {de:.4f} | {di:.4f} | {ratio:.2f} |", flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "tilewise"))
    ap.add_argument("--tile", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--x0", type=int, default=300)
    ap.add_argument("--y0", type=int, default=150)
    ap.add_argument("--demo-unet", default=os.path.join(REPO, "sample_data",
                                                        "demo_unet_resnet18.h5"),
                    help="the demo U-Net bundle, measured on L7_ETMs.tif beside it")
    ap.add_argument("--unet", help="a pickled torch U-Net-ResNet18 (4 bands, raw pixels)")
    ap.add_argument("--train-seconds", type=int, default=120)
    ap.add_argument("--keep", help="keep the models and outputs in this directory")
    ap.add_argument("--only", choices=("demo", "unet", "deeplabv3"), help="measure one network "
                    "(default: the demo U-Net if its bundle exists, else the U-Net, and the "
                    "DeepLabV3)")
    a = ap.parse_args()
    demo = os.path.exists(a.demo_unet)
    todo = [a.only] if a.only else ["demo" if demo else "unet", "deeplabv3"]
    if "demo" in todo and not demo:
        sys.exit(f"{a.demo_unet}: no such bundle")
    import torch
    torch.set_num_threads(a.threads)
    tmp = a.keep or tempfile.mkdtemp(prefix="seg_seams_")
    os.makedirs(tmp, exist_ok=True)
    print(f"tile {a.tile}; tilewise {a.bin}, runtime.threads {a.threads}; {', '.join(todo)}")
    print("| model | tile | stride | overlap | blend | margin | agree | dis. edge | "
          "dis. interior | edge/int |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    rows = []
    if "demo" in todo:
        rows += demo_rows(a, tmp)
    if "unet" in todo or "deeplabv3" in todo:
        path = sp.raster_path()
        if path is None:
            sys.exit("shared data absent (the NAIP raster)")
        raster = os.path.join(tmp, "in.tif")
        img = crop(path, raster, a.x0, a.y0)
        print(f"raster: {os.path.basename(path)} window {a.x0},{a.y0} {SIZE}x{SIZE}")
        if "unet" in todo:
            rows += unet_rows(a, tmp, path, raster, img)
        if "deeplabv3" in todo:
            rows += deeplab_rows(a, tmp, raster, img)
    summary(a, rows)
    if not a.keep:
        import shutil
        shutil.rmtree(tmp)
    return 0


def unet_rows(a, tmp, path, raster, img):
    import torch
    if a.unet:
        unet = torch.load(a.unet, weights_only=False).eval()
    else:
        from osgeo import gdal
        full = gdal.Open(path).ReadAsArray().astype(np.float32)
        unet = train_unet(full, a.train_seconds)
        torch.save(unet, os.path.join(tmp, "unet18.pt"))
    rules = rule_labels(img)
    uw = whole_map(unet, img, 32)
    print(f"U-Net whole-image map: agreement with the rule labels {np.mean(uw == rules):.3f}, "
          f"class shares {np.bincount(uw.ravel(), minlength=RULE_CLASSES) / uw.size}", flush=True)
    um = os.path.join(tmp, "unet18.safetensors")
    sp.export(unet, um)
    return measure(a, tmp, raster, um, "unet_resnet18", uw, "U-Net-ResNet18")


def write_float(path, arr, like):
    """arr (bands, rows, columns) as a Float32 GeoTIFF on like's grid, no nodata."""
    from osgeo import gdal
    ds = gdal.GetDriverByName("GTiff").Create(path, arr.shape[2], arr.shape[1], arr.shape[0],
                                              gdal.GDT_Float32)
    ds.SetGeoTransform(like.GetGeoTransform())
    ds.SetProjection(like.GetProjection())
    for b in range(arr.shape[0]):
        ds.GetRasterBand(b + 1).WriteArray(arr[b])
    ds = None
    return path


def demo_rows(a, tmp):
    """The demo U-Net (tools/make_demo_model.py --arch unet_resnet18) on the
    whole of its raster, sample_data/L7_ETMs.tif (352 rows x 349 columns, 6
    bands): the bundle's normalisation applied here and written as a Float32
    raster, the weights as safetensors (tilewise then reads the same numbers as
    PyTorch; a tile past the raster's edge and the whole image's padding to 352
    columns are zeros in the normalised space alike)."""
    import importlib.util

    import h5py
    import torch
    import torchvision
    from osgeo import gdal
    gdal.UseExceptions()
    here = os.path.dirname(os.path.abspath(a.demo_unet))
    spec = importlib.util.spec_from_file_location(
        "make_demo_model", os.path.join(here, "..", "tools", "make_demo_model.py"))
    mdm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mdm)
    m = mdm.build_unet(torch, torchvision)
    with h5py.File(a.demo_unet, "r") as f:
        sd = {k: torch.from_numpy(v[()]) for k, v in f["tensors"].items()}
        mean = np.asarray(f.attrs["mean"], np.float64)
        std = np.asarray(f.attrs["std"], np.float64)
    m.load_state_dict(sd, strict=False)
    m.eval()
    src = gdal.Open(os.path.join(here, "L7_ETMs.tif"))
    img = src.ReadAsArray().astype(np.float64)
    norm = ((img - mean[:, None, None]) / std[:, None, None]).astype(np.float32)
    raster = write_float(os.path.join(tmp, "l7norm.tif"), norm, src)
    whole = whole_map(m, norm, 32)
    rules = mdm.pixel_classes(img)
    print(f"demo U-Net whole-image map ({norm.shape[2]} x {norm.shape[1]}): agreement with the "
          f"rule labels {np.mean(whole == rules):.3f}", flush=True)
    model = os.path.join(tmp, "demo_unet.safetensors")
    sp.export(m, model)
    return measure(a, tmp, raster, model, "unet_resnet18", whole, "demo U-Net-ResNet18")


def deeplab_rows(a, tmp, raster, img):
    from osgeo import gdal
    # each band standardised over the crop (as e2e_seg_parity feeds it): raw
    # 0..255 pixels through random batch-norm statistics let the image-pooling
    # branch drown the rest (agreement ~0.2 even without tiles' seams)
    std = ((img - img.mean(axis=(1, 2), keepdims=True))
           / (img.std(axis=(1, 2), keepdims=True) + 1e-6)).astype(np.float32)
    raster = write_float(os.path.join(tmp, "std.tif"), std, gdal.Open(raster))
    dl = sp.make("deeplabv3", 2, std[None, :, :a.tile, :a.tile].copy())
    dw = whole_map(dl, std, 1)
    print(f"DeepLabV3 whole-image map: class shares "
          f"{np.bincount(dw.ravel(), minlength=sp.CLASSES) / dw.size}", flush=True)
    dm = os.path.join(tmp, "deeplabv3.safetensors")
    sp.export(dl, dm)
    return measure(a, tmp, raster, dm, "deeplabv3_resnet50", dw, "DeepLabV3-ResNet50")


def summary(a, rows):
    print("\nmean over the models, per stride and blend (margin 0 / quarter of the overlap):")
    for stride in (a.tile // 2, 3 * a.tile // 4):
        for blend in ("mean", "linear", "cosine"):
            for q in (0, 1):
                sel = [r for r in rows if r[2] == stride and r[4] == blend
                       and (r[5] > 0) == bool(q)]
                print(f"  stride {stride} {blend:6s} margin {sel[0][5]:2d}: agree "
                      f"{np.mean([r[6] for r in sel]):.4f}, edge/int "
                      f"{np.mean([r[9] for r in sel]):.2f}")


if __name__ == "__main__":
    sys.exit(main())
