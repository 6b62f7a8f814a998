#!/usr/bin/python3
"""End to end: the torchvision ResNet family (issue 31, item 2) against PyTorch.

Three torchvision modules with random weights (fixed seeds; batch-norm
weights, biases and running statistics drawn away from 1 and 0 so that the
fold matters; fc scaled so that the logits spread over a few units and the
softmax is not flat) are exported to safetensors and run by `tilewise run`
on a real raster, output.products [tiles]; every tile's probabilities are
compared with the module's own (eval mode, fp32 convolutions, its fc and
softmax in float64, on the same pixels normalized the same way):

* ResNeXt-50 32x4d (torchvision.models.resnext50_32x4d; grouped 3x3 convs,
  32 groups of 4..32 channels): no metadata, the shapes say what it is;
* Wide ResNet-50-2 (wide_resnet50_2; bottlenecks twice as wide), with
  metadata arch = wide_resnet50_2;
* ResNet-18 with the small stem (conv1 replaced by 3x3 stride 1 padding 1,
  the max pool by nn.Identity) on 32-px tiles, with model.stem: small in the
  workflow.

Tolerances (the issue's): |p - p_torch| <= 1e-4 on every probability, the
same argmax on 100 % of the tiles. Also: `tilewise info --json` names the
family, groups, base width and stem; model.stem: standard on the small-stem
weights is exit 3 naming both, before any product exists; tools/export_model.py
writes the family's arch name and the stem into the bundle.

The raster: a 192 x 192 window without nodata of
/work/shared/data/rasters/RGB.byte.tif (Landsat 7, 3 bands); where that is
absent (a fresh clone), bands 1-3 of sample_data/L7_ETMs.tif (also Landsat 7,
committed). 9 tiles of 64 px, 36 of 32 px: seconds per model.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from e2eutil import BIN, SRC, check, gdal_or_skip, randomize_bn

EXIT_MODEL = 3
TOL = 1e-4
SHARED = os.path.join(SRC or "", "..", "shared", "data", "rasters", "RGB.byte.tif")
SHARED_ABS = "/work/shared/data/rasters/RGB.byte.tif"
MEAN = [60.0, 70.0, 80.0]
STD = [40.0, 35.0, 45.0]


def pick_raster(gdal, tmp):
    """A real 192 x 192 x 3 Byte window without nodata, written to tmp."""
    src = next((p for p in (SHARED, SHARED_ABS) if os.path.exists(p)), None)
    if src is None:
        src = os.path.join(SRC, "sample_data", "L7_ETMs.tif")
        print(f"shared data absent: using {src}")
    ds = gdal.Open(src)
    a = ds.ReadAsArray()[:3]
    size = 192
    for y in range(0, a.shape[1] - size, 32):
        for x in range(0, a.shape[2] - size, 32):
            if (a[:, y:y + size, x:x + size] != 0).all():
                out = os.path.join(tmp, "window.tif")
                gdal.Translate(out, ds, srcWin=[x, y, size, size], bandList=[1, 2, 3])
                print(f"raster: {src} window x={x} y={y} {size}x{size}")
                return out, a[:, y:y + size, x:x + size].astype(np.float64)
    sys.exit("FAIL: no window without nodata in " + src)


def make(name, seed, tiles):
    """A torchvision module of the family, randomized, fc scaled on tiles."""
    import torch
    import torchvision
    torch.manual_seed(seed)
    if name == "resnet18_small":
        m = torchvision.models.resnet18(num_classes=5)
        m.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        m.maxpool = torch.nn.Identity()
    else:
        m = getattr(torchvision.models, name)(num_classes=5)
    randomize_bn(m, seed)
    m = m.eval()
    with torch.no_grad():
        body = torch.nn.Sequential(*list(m.children())[:-1])
        feat = body(torch.from_numpy(tiles).float()).flatten(1).double()
        # logits that spread over a few units from tile to tile: fc reads
        # the features' deviations from their mean over these tiles (a
        # random net's features share a large common part, which alone
        # would give every tile one class), scaled to unit spread
        dev = feat - feat.mean(0, keepdim=True)
        sd = float(dev.pow(2).mean().sqrt()) + 1e-12
        w = torch.randn(5, feat.shape[1], dtype=torch.float64) * (3.0 / (sd * feat.shape[1] ** 0.5))
        m.fc.weight.data = w.float()
        m.fc.bias.data = -(w @ feat.mean(0)).float()
    # PyTorch's probabilities: its pooled features, its fc (in double)
    logits = feat @ m.fc.weight.data.double().T + m.fc.bias.data.double()
    return m, torch.softmax(logits, 1).numpy()


def tiles_of(pix, tile):
    n = pix.shape[1] // tile
    x = (pix - np.array(MEAN)[:, None, None]) / np.array(STD)[:, None, None]
    out, origin = [], []
    for r in range(n):
        for c in range(n):
            out.append(x[:, r * tile:(r + 1) * tile, c * tile:(c + 1) * tile])
            origin.append((r * tile, c * tile))
    return np.stack(out), origin


def export(model, path, metadata=None):
    sys.path.insert(0, os.path.join(SRC, "tools"))
    import safetensors_io
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()
          if not k.endswith("num_batches_tracked")}
    safetensors_io.save(path, sd, "F32", metadata)


def run(tmp, name, weights, raster, tile, extra=""):
    out = os.path.join(tmp, name)
    wf = os.path.join(tmp, name + ".yaml")
    with open(wf, "w") as f:
        f.write(f"""input:
  path: {raster}
model:
  weights: {weights}
  mean: {MEAN}
  std: {STD}{extra}
tiling:
  tile: {tile}
runtime:
  device: cpu
  memory: 2GiB
output:
  dir: {out}
  products: [tiles]
""")
    r = subprocess.run([BIN, "run", wf, "--progress=none"], capture_output=True, text=True,
                       timeout=600)
    return r, out


def parity(tmp, gdal, raster, pix, name, tile, metadata=None, extra="", want=None):
    import h5py
    x, origin = tiles_of(pix, tile)
    model, ref = make(name, 31, x)
    weights = os.path.join(tmp, name + ".safetensors")
    export(model, weights, metadata)
    info = subprocess.run([BIN, "info", "--json", weights], capture_output=True, text=True)
    check(info.returncode == 0, f"{name}: info exit {info.returncode}: {info.stderr}")
    j = json.loads(info.stdout)
    got = {k: j.get(k) for k in want}
    check(got == want, f"{name}: info says {got}, expected {want}", say_ok=True)

    if name != "wide_resnet50_2":  # (its 270 MB once is enough)
        # tools/export_model.py names the family and the stem in the bundle
        h5 = weights[:-len(".safetensors")] + ".h5"
        e = subprocess.run([sys.executable, os.path.join(SRC, "tools", "export_model.py"), weights,
                            "-o", h5], capture_output=True, text=True)
        check(e.returncode == 0, f"{name}: export_model.py: {e.stderr[-500:]}")
        with h5py.File(h5, "r") as f:
            attrs = {k: f.attrs[k].decode() for k in ("arch", "stem")}
        check(attrs == {"arch": want["arch"], "stem": want["stem"]},
              f"{name}: the bundle's arch and stem {attrs}", say_ok=True)
        bi = json.loads(subprocess.run([BIN, "info", "--json", h5], capture_output=True,
                                       text=True).stdout)
        check({k: bi.get(k) for k in want} == want, f"{name}: info of the bundle {bi}")
        os.remove(h5)
    r, out = run(tmp, name, weights, raster, tile, extra)
    check(r.returncode == 0, f"{name}: run exit {r.returncode}: {r.stderr[-2000:]}")
    with h5py.File(os.path.join(out, "window.tiles.h5"), "r") as h:
        org = [tuple(o) for o in h["origin"][...].tolist()]
        prob = h["probabilities"][...].astype(np.float64)
    check(sorted(org) == sorted(origin), f"{name}: {len(org)} tiles, expected {len(origin)}")
    idx = [origin.index(o) for o in org]
    ref = ref[idx]
    d = float(np.abs(prob - ref).max())
    agree = float(np.mean(prob.argmax(1) == ref.argmax(1)))
    classes = np.bincount(ref.argmax(1), minlength=5).tolist()
    check(d <= TOL, f"{name}: max |p - p_torch| = {d:.3g} over {len(org)} tiles (<= {TOL})",
          say_ok=True)
    check(agree == 1.0, f"{name}: same argmax on {agree:.0%} of the tiles (classes {classes})",
          say_ok=True)
    check(sum(c > 0 for c in classes) >= 2, f"{name}: two classes at least ({classes})")
    with open(os.path.join(out, "run.json")) as f:
        rj = json.load(f)
    return weights, rj


def main():
    gdal = gdal_or_skip()
    if gdal is None:
        return 77
    try:
        import torch  # noqa: F401
        import torchvision  # noqa: F401
    except ImportError:
        print("PyTorch/torchvision not installed: skipped")
        return 77
    tmp = tempfile.mkdtemp(prefix="tw_family_")
    try:
        raster, pix = pick_raster(gdal, tmp)
        parity(tmp, gdal, raster, pix, "resnext50_32x4d", 64,
               want={"arch": "resnext50_32x4d", "family": "resnext", "groups": 32,
                     "base_width": 4, "stem": "standard"})
        parity(tmp, gdal, raster, pix, "wide_resnet50_2", 64,
               metadata={"arch": "wide_resnet50_2"},
               want={"arch": "wide_resnet50_2", "family": "wide_resnet", "groups": 1,
                     "base_width": 128, "stem": "standard"})
        weights, rj = parity(tmp, gdal, raster, pix, "resnet18_small", 32,
                             extra="\n  stem: small",
                             want={"arch": "resnet18", "family": "resnet", "groups": 1,
                                   "base_width": 64, "stem": "small"})
        stem = rj["config"]["model"].get("stem")
        check(stem == "small", f"run.json config model.stem is {stem!r}", say_ok=True)

        # a declared stem that disagrees: exit 3 naming both, nothing written
        r, out = run(tmp, "stem_mismatch", weights, raster, 32, "\n  stem: standard")
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        check(r.returncode == EXIT_MODEL, f"model.stem standard on a small stem: exit "
              f"{r.returncode} (expected {EXIT_MODEL}): {r.stderr[-500:]}")
        check(len(lines) == 1 and "conv1 is 3x3 stride 1, a small stem" in lines[0]
              and "model.stem says standard" in lines[0], f"one line naming both: {lines}",
              say_ok=True)
        check(not os.path.exists(os.path.join(out, "window.tiles.h5")), "no product written")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("e2e_family: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
