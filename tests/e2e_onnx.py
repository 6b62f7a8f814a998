#!/usr/bin/python3
"""ONNX ResNets as model.weights (issue 31), end to end through the CLI.

* ResNet-50 exported by torch.onnx.export (opset 17, batch norm folded by
  the exporter; fc scaled so that its probabilities are not all 0 and 1): on
  a 180 x 192 window of sample_data/L7_ETMs.tif (Landsat 7, 6 bands) its probabilities
  equal those of the same weights as safetensors (<= 1e-5) and PyTorch's in
  float64 (<= 1e-4, every argmax the same); its pooled features too (<= 1e-5
  and 1e-4 of the largest).
* ResNet-18 exported with opset 11 and 17, with and without constant
  folding (BN folded or kept as nodes), with external data, and rewritten
  as other converters write it: each <= 1e-4 of PyTorch, same argmax.
* Deepness's metadata (class names, standardization_mean/std after x/255,
  tiles_size) fills what a workflow leaves out; the workflow's keys win.
* A real Sentinel-2 raster from ../shared/data (skipped when absent): the
  opset-17 ResNet-18 against PyTorch on a 256 x 256 window.
* `tilewise info` shows what was recognised; MobileNetV2 is refused naming
  its first foreign node, a truncated file naming the file: exit 3, one
  line, no finished product.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

from e2eutil import BIN, FIX, MEAN, SRC, STD, check, finished_products, gdal_or_skip

TOL_TORCH = 1e-4
TOL_FORMATS = 1e-5
EXIT_MODEL = 3
TILE = 64


def torch_model(arch, n_classes, seed):
    sys.path.insert(0, os.path.join(SRC, "tests", "fixtures"))
    from fx_models import make_model
    from fx_onnx import r50_model
    return r50_model() if arch == "resnet50" else make_model(arch, n_classes, seed)


def torch_features(model, tiles):
    """The pooled features (tilewise's embeddings) in float64."""
    import copy
    import torch
    m = copy.deepcopy(model).double()
    with torch.no_grad():
        x = torch.from_numpy(tiles).double()
        h = m.maxpool(m.relu(m.bn1(m.conv1(x))))
        h = m.layer4(m.layer3(m.layer2(m.layer1(h))))
        return torch.flatten(m.avgpool(h), 1).numpy()


def torch_probs(model, tiles, double=True):
    import copy
    import torch
    m = copy.deepcopy(model)
    m = m.double() if double else m.float()
    x = torch.from_numpy(tiles)
    x = x.double() if double else x.float()
    with torch.no_grad():
        return torch.softmax(m(x), dim=1).numpy().astype(np.float64)


def tiles_of(img, mean, std, scale=1.0):
    """Tiles of TILE with stride TILE, padded with 0 after normalization
    (edge: pad), in raster order: (ny * nx, bands, TILE, TILE), ny, nx."""
    b, h, w = img.shape
    ny, nx = math.ceil(h / TILE), math.ceil(w / TILE)
    norm = (img * scale - np.array(mean)[:, None, None]) / np.array(std)[:, None, None]
    padded = np.zeros((b, ny * TILE, nx * TILE))
    padded[:, :h, :w] = norm
    t = [padded[:, y * TILE:(y + 1) * TILE, x * TILE:(x + 1) * TILE]
         for y in range(ny) for x in range(nx)]
    return np.stack(t), ny, nx


def run(tmp, name, weights, raster, norm=True, extra_model="", input_extra="",
        products="[class, prob]"):
    wf, out = os.path.join(tmp, name + ".yaml"), os.path.join(tmp, name)
    model_norm = f"\n  mean: {MEAN}\n  std: {STD}" if norm else ""
    with open(wf, "w") as f:
        f.write(f"""input:
  path: {raster}{input_extra}
model:
  weights: {weights}{model_norm}{extra_model}
tiling:
  tile: {TILE}
runtime:
  device: cpu
  memory: 1GiB
output:
  dir: {out}
  products: {products}
""")
    r = subprocess.run([BIN, "run", wf, "-q"], capture_output=True, text=True, timeout=600)
    return r, out


def probs_of(gdal, out, stem):
    ds = gdal.Open(os.path.join(out, stem + ".prob.tif"))
    p = ds.ReadAsArray().astype(np.float64)  # (K, gh, gw)
    names = [ds.GetRasterBand(i + 1).GetDescription() for i in range(ds.RasterCount)]
    return np.moveaxis(p, 0, -1).reshape(-1, p.shape[0]), names


def compare(what, got, ref, tol):
    d = float(np.abs(got - ref).max())
    same = bool((got.argmax(-1) == ref.argmax(-1)).all())
    check(d <= tol and same, f"{what}: max |diff| {d:.2e} (tolerance {tol:g}), argmax same: {same}",
          say_ok=True)


def main():
    gdal = gdal_or_skip()
    if gdal is None:
        return 77
    raster = os.path.join(SRC, "sample_data", "L7_ETMs.tif")
    fx = lambda n: os.path.join(FIX, n)  # noqa: E731

    with tempfile.TemporaryDirectory() as tmp:
        # everything on a 192 x 192 window of the raster (9 tiles: seconds), with its edge
        # tiles padded (192 is not a multiple of 64 from its origin 70)
        win = os.path.join(tmp, "L7_window.vrt")
        gdal.Translate(win, raster, srcWin=[70, 64, 180, 192], format="VRT")
        img = gdal.Open(win).ReadAsArray().astype(np.float64)
        tiles, _, _ = tiles_of(img, MEAN, STD)
        wtiles = tiles
        both = "[class, prob, embeddings]"
        r, out_onnx = run(tmp, "r50_onnx", fx("onnx_r50_o17.onnx"), win, products=both)
        check(r.returncode == 0, f"run ResNet-50 ONNX: exit {r.returncode}: {r.stderr}")
        r, out_st = run(tmp, "r50_st", fx("onnx_r50.safetensors"), win, products=both)
        check(r.returncode == 0, f"run ResNet-50 safetensors: exit {r.returncode}: {r.stderr}")
        p_onnx, _ = probs_of(gdal, out_onnx, "L7_window")
        p_st, _ = probs_of(gdal, out_st, "L7_window")
        compare("ResNet-50 ONNX (opset 17) vs its safetensors", p_onnx, p_st, TOL_FORMATS)
        m50 = torch_model("resnet50", 5, 50)
        ref50 = torch_probs(m50, wtiles)
        check(ref50.max() < 0.999, f"ResNet-50 probabilities not saturated (max {ref50.max():.3f})")
        compare("ResNet-50 ONNX vs PyTorch float64", p_onnx, ref50, TOL_TORCH)
        # the pooled features, where no softmax hides a difference
        import h5py
        emb = {}
        for k, o in [("onnx", out_onnx), ("st", out_st)]:
            with h5py.File(os.path.join(o, "L7_window.tiles.h5"), "r") as h:
                order = np.lexsort((h["origin"][:, 1], h["origin"][:, 0]))
                emb[k] = h["embeddings"][:].astype(np.float64)[order]
        fref = torch_features(m50, wtiles)
        scale = np.abs(fref).max()
        d_fmt = np.abs(emb["onnx"] - emb["st"]).max() / scale
        d_ref = np.abs(emb["onnx"] - fref).max() / scale
        check(d_fmt <= TOL_FORMATS and d_ref <= TOL_TORCH,
              f"ResNet-50 pooled features: ONNX vs safetensors {d_fmt:.2e}, vs PyTorch {d_ref:.2e} "
              f"(of the largest, {scale:.3g})", say_ok=True)

        # ResNet-18 in every export
        r18 = torch_model("resnet18", 7, 18)
        ref18 = torch_probs(r18, tiles)
        for name, what in [("onnx_r18_o11_fold.onnx", "opset 11, BN folded by the exporter"),
                           ("onnx_r18_o17_bn.onnx", "opset 17, BN nodes, no constant folding"),
                           ("onnx_r18_o11_bn.onnx", "opset 11, BN nodes"),
                           ("onnx_r18_ext.onnx", "opset 17, external data"),
                           ("onnx_r18_other.onnx",
                            "ReduceMean/Reshape/MatMul+Add/Softmax, opset 18")]:
            # the workflow's mean/std (and scale) win over Deepness's metadata
            extra = "\n  scale: 1.0" if "other" in name else ""
            r, out = run(tmp, name[:-5], fx(name), win, input_extra=extra)
            check(r.returncode == 0, f"run {name}: exit {r.returncode}: {r.stderr}")
            p, _ = probs_of(gdal, out, "L7_window")
            compare(f"ResNet-18 {what} vs PyTorch float64", p, ref18, TOL_TORCH)

        # Deepness's metadata where the workflow says nothing: x / 255, then its mean/std;
        # its class names on the bands
        r, out = run(tmp, "deepness", fx("onnx_r18_other.onnx"), win, norm=False)
        check(r.returncode == 0, f"run with Deepness metadata: exit {r.returncode}: {r.stderr}")
        p, names = probs_of(gdal, out, "L7_window")
        dmean = [0.31, 0.26, 0.25, 0.24, 0.31, 0.24]
        dstd = [0.058, 0.064, 0.085, 0.059, 0.098, 0.078]
        dtiles, _, _ = tiles_of(img, dmean, dstd, scale=1.0 / 255.0)
        compare("Deepness standardization (x/255 - mean)/std vs PyTorch", p,
                torch_probs(r18, dtiles), TOL_TORCH)
        check(names == ["water", "forest", "field", "urban", "bare", "cloud", "shadow"],
              f"class names from Deepness's class_names: {names}", say_ok=True)

        # a real Sentinel-2 window from ../shared/data
        s2 = None
        rasters = os.path.join(os.environ.get("TW_SHARED_DATA", ""), "rasters")
        if os.path.isdir(rasters):
            s2 = next((os.path.join(rasters, f) for f in sorted(os.listdir(rasters))
                       if f.startswith("s2_L1C_18SVG") and f.endswith(".tif")), None)
        if s2:
            win = os.path.join(tmp, "s2_window.vrt")
            gdal.Translate(win, s2, srcWin=[300, 300, 256, 256], format="VRT")
            simg = gdal.Open(win).ReadAsArray().astype(np.float64)
            smean = list(simg.reshape(6, -1).mean(axis=1))
            sstd = list(simg.reshape(6, -1).std(axis=1))
            extra = f"\n  mean: {smean}\n  std: {sstd}"
            r, out = run(tmp, "s2", fx("onnx_r18_o17_bn.onnx"), win, norm=False, extra_model=extra)
            check(r.returncode == 0, f"run on Sentinel-2: exit {r.returncode}: {r.stderr}")
            p, _ = probs_of(gdal, out, "s2_window")
            stiles, _, _ = tiles_of(simg, smean, sstd)
            compare("ResNet-18 ONNX on a Sentinel-2 L1C window (UInt16) vs PyTorch", p,
                    torch_probs(r18, stiles), TOL_TORCH)
        else:
            print("skip Sentinel-2 window: ../shared/data absent")

        # info
        r = subprocess.run([BIN, "info", fx("onnx_r18_other.onnx")], capture_output=True, text=True)
        check(r.returncode == 0, f"info: exit {r.returncode}: {r.stderr}")
        for want in ["ONNX (IR 8, opset 18, from some-converter 2.0)", "resnet18 (basic blocks",
                     "head ReduceMean, Reshape, MatMul, Add, Softmax",
                     "class_names, standardization_mean, standardization_std, tiles_size",
                     "water, forest, field", "resolution: 3000 cm/px"]:
            check(want in r.stdout, f"info shows '{want}'", say_ok=True)
        r = subprocess.run([BIN, "info", "--json", fx("onnx_r18_ext.onnx")], capture_output=True,
                           text=True)
        j = json.loads(r.stdout)
        check(j["arch"] == "resnet18" and j["onnx"]["opset"] == 17
              and j["onnx"]["external_tensors"] == 42 and j["onnx"]["producer"] == "pytorch 1.13.0",
              f"info --json: {j['arch']}, onnx {j['onnx']}", say_ok=True)

        # the family from a graph: torchvision's ResNeXt-50 32x4d exported here (grouped 3x3s
        # in the bottlenecks), on the window's tiles against PyTorch in float64
        import torch
        import torchvision
        torch.manual_seed(3)
        rx = torchvision.models.resnext50_32x4d(num_classes=5)
        rx.conv1 = torch.nn.Conv2d(len(MEAN), 64, 7, 2, 3, bias=False)
        for mod in rx.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 1.5)
        with torch.no_grad():
            rx.fc.weight.mul_(0.01)  # probabilities away from 0 and 1
        rx.eval()
        rx_path = os.path.join(tmp, "resnext50.onnx")
        torch.onnx.export(rx, torch.zeros(1, len(MEAN), TILE, TILE), rx_path, opset_version=17,
                          input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "n"}})
        r, out_rx = run(tmp, "rx_onnx", rx_path, os.path.join(tmp, "L7_window.vrt"))
        check(r.returncode == 0, f"run ResNeXt-50 ONNX: exit {r.returncode}: {r.stderr}")
        p_rx, _ = probs_of(gdal, out_rx, "L7_window")
        compare("ResNeXt-50 32x4d ONNX vs PyTorch float64", p_rx, torch_probs(rx, wtiles),
                TOL_TORCH)

        # refusals: exit 3, one line naming the node or the file, no finished product
        for name, want in [("onnx_mobilenet_v2.onnx",
                            "node '/features/features.0/features.0.2/Clip' (Clip) is not part of "
                            "a ResNet"),
                           ("onnx_bad_truncated.onnx", "not an ONNX model (truncated or corrupt")]:
            r, out = run(tmp, "bad_" + name[:-5], fx(name), win)
            lines = [x for x in r.stderr.splitlines() if x.strip()]
            check(r.returncode == EXIT_MODEL and want in r.stderr and name in r.stderr
                  and len(lines) == 1,
                  f"{name}: exit {r.returncode} (expected {EXIT_MODEL}), {r.stderr.strip()}",
                  say_ok=True)
            check(not os.path.isdir(out) or finished_products(out) == [],
                  f"{name}: no finished product")
    return 0


if __name__ == "__main__":
    sys.exit(main())
