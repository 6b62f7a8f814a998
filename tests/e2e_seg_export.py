#!/usr/bin/python3
"""End to end: tools/export_model.py on segmentation checkpoints (issue 36,
item 1) and the demo U-Net (item 5), through tests/seg_forward (the C
forward) against PyTorch.

Each kind is built in PyTorch as tests/e2e_seg_parity.py builds it (random
weights, fixed seeds, batch norm drawn away from identity, logits spread),
conv1 taking 4 bands, 5 classes, and saved the way users have it:

* torchvision fcn_resnet50 with aux_loss (a .pth state_dict): the bundle
  leaves aux_classifier.* out, records arch fcn_resnet50 (detected), the
  given classes/mean/std/tile and the default stride tile/2;
* torchvision deeplabv3_resnet50 (.pth, --arch given and agreeing);
* a U-Net with a ResNet-34 encoder in SMP's layout (.pt), no --arch;
* a narrow U-Net-ResNet18 inside a Lightning/TorchGeo checkpoint
  ({'state_dict': {'model.' + name: ...}, 'epoch', 'lr', a loss's
  'criterion.weight' outside the model}): the prefix stripped, the loss
  left out; from a safetensors file too;
* fcn_resnet101 (export only: the arch detected from the blocks per stage).

Each bundle's probabilities from seg_forward against PyTorch's on one
64 px tile of sample_data/L7_ETMs.tif (bands 1-4, standardised):
|p - p_torch| <= 1e-4. Refusals, each with exit 1, no output file, and a
message naming what is wrong: a foreign key under the Lightning prefix
(named with its prefix), --arch disagreeing with the tensors (both named),
a U-Net tile that is no multiple of 32, a stride larger than the tile; and
the reader refuses a bundle whose stride exceeds its tile, naming 'stride'.

The demo bundle sample_data/demo_unet_resnet18.h5: loads as unet_resnet18
with its metadata (tile 64, stride 32, 4 classes, 6 bands), and its forward
matches PyTorch's (the network of tools/make_demo_model.py with the
bundle's tensors) on a 64 px tile of L7_ETMs.tif normalised with the
bundle's mean/std. About 20 s on 2 cores.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

from e2eutil import BIN, SRC, check

TOL = 1e-4
TILE = 64


def l7_tile(bands, x0=100, y0=100, mean=None, std=None):
    """A TILE px tile of L7_ETMs.tif, float32 [1, bands, T, T]: each band
    standardised over the tile, or with the given mean/std."""
    from osgeo import gdal
    gdal.UseExceptions()
    ds = gdal.Open(os.path.join(SRC, "sample_data", "L7_ETMs.tif"))
    a = ds.ReadAsArray(x0, y0, TILE, TILE)[:bands].astype(np.float64)
    if mean is None:
        a = (a - a.mean(axis=(1, 2), keepdims=True)) / (a.std(axis=(1, 2), keepdims=True) + 1e-6)
    else:
        a = (a - np.asarray(mean)[:, None, None]) / np.asarray(std)[:, None, None]
    return a[None].astype(np.float32)


def exporter(*args):
    exe = os.path.join(SRC, "tools", "export_model.py")
    return subprocess.run([sys.executable, exe] + [str(a) for a in args], capture_output=True,
                          text=True)


def forward(tmp, model, x):
    """(stdout fields, probabilities [n, classes, T, T]) from seg_forward; the
    probabilities are None (and the fields the stderr) on failure."""
    n, _, tile, _ = x.shape
    inp, outp = os.path.join(tmp, "in.raw"), os.path.join(tmp, "out.raw")
    x.astype("<f4").tofile(inp)
    exe = os.path.join(os.path.dirname(BIN), "seg_forward")
    r = subprocess.run([exe, model, str(tile), str(n), inp, outp], capture_output=True, text=True)
    if r.returncode != 0:
        return r.stderr.strip(), None
    f = r.stdout.split()
    if n == 0:
        return f, None
    return f, np.fromfile(outp, dtype="<f4").reshape(n, int(f[1]), tile, tile)


def attrs(path):
    import h5py
    with h5py.File(path, "r") as f:
        a = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f.attrs.items()}
        return a, sorted(f["tensors"].keys())


def parity(tmp, name, bundle, m, x, arch):
    from e2e_seg_parity import torch_probs
    f, got = forward(tmp, bundle, x)
    check(got is not None, f"{name}: seg_forward loads the bundle ({f})")
    check(f[0] == arch, f"{name}: seg_forward builds {f[0]}, expected {arch}")
    diff = float(np.abs(got - torch_probs(m, x)).max())
    check(diff <= TOL, f"{name}: exported bundle, max |p - p_torch| = {diff:.3g} <= {TOL}", True)


def refused(r, out, needles, what):
    ok = r.returncode == 1 and not os.path.exists(out) and all(n in r.stderr for n in needles)
    check(ok, f"{what} refused naming {needles} (rc {r.returncode}: {r.stderr.strip()})", True)


def test_kinds(tmp):
    import torch
    from e2e_seg_parity import make
    sys.path.insert(0, os.path.join(SRC, "tools"))
    import safetensors_io
    x = l7_tile(4)
    sd_of = {}
    for name, seed, arch, save in (("fcn", 3, "fcn_resnet50", "pth"),
                                   ("deeplabv3", 2, "deeplabv3_resnet50", "pth"),
                                   ("unet", 1, "unet_resnet34", "pt"),
                                   ("unet18_narrow", 4, "unet_resnet18", "ckpt")):
        m = make(name, seed, x)
        sd = m.state_dict()
        sd_of[name] = sd
        ckpt = os.path.join(tmp, f"{name}.{save}")
        if save == "ckpt":  # Lightning / TorchGeo: the task's model under 'model.'
            torch.save({"epoch": 3, "lr": 1e-3, "state_dict": dict(
                [("model." + k, v) for k, v in sd.items()]
                + [("criterion.weight", torch.ones(5))])}, ckpt)
        else:
            torch.save(sd, ckpt)
        out = os.path.join(tmp, f"{name}.h5")
        extra = ["--arch", arch] if name == "deeplabv3" else []
        r = exporter(ckpt, "-o", out, "--tile", TILE, "--classes", "a,b,c,d,e", "--mean",
                     "1,2,3,4", "--std", "5,6,7,8", *extra)
        check(r.returncode == 0, f"{name}: export ({r.stderr.strip()})")
        a, names = attrs(out)
        check(a["arch"] == arch and a["tile"] == TILE and a["stride"] == TILE // 2
              and list(a["bands"]) == [1, 2, 3, 4] and len(a["classes"]) == 5
              and "stem" not in a, f"{name}: bundle arch {a.get('arch')}, tile/stride "
              f"{a.get('tile')}/{a.get('stride')}, bands {list(a.get('bands', []))}, "
              f"{len(a.get('classes', []))} classes", True)
        if name == "fcn":
            check(f"arch {arch} inferred" in r.stdout and "aux_classifier" in r.stdout
                  and not any(n.startswith("aux_classifier.") for n in names),
                  f"fcn: arch inferred, aux_classifier left out ({r.stdout.strip()})", True)
        if save == "ckpt":
            check("prefix 'model.' stripped" in r.stdout and "criterion.weight" in r.stdout
                  and "criterion.weight" not in names,
                  f"{name}: Lightning prefix stripped, loss left out ({r.stdout.strip()})", True)
        parity(tmp, name, out, m, x, arch)

    # the same U-Net from safetensors, stride given
    st = os.path.join(tmp, "unet18.safetensors")
    safetensors_io.save(st, {k: v.float().numpy() for k, v in sd_of["unet18_narrow"].items()
                             if not k.endswith("num_batches_tracked")}, "F32")
    out = os.path.join(tmp, "unet18_st.h5")
    r = exporter(st, "-o", out, "--tile", 96, "--stride", 80)
    a, _ = attrs(out) if r.returncode == 0 else ({}, [])
    check(r.returncode == 0 and a.get("arch") == "unet_resnet18" and a.get("stride") == 80,
          f"safetensors U-Net exported with stride 80 ({r.stderr.strip()} {a.get('arch')} "
          f"{a.get('stride')})", True)

    # refusals: nothing written, the message names the culprit
    lt = os.path.join(tmp, "foreign.ckpt")
    sd = {"model." + k: v for k, v in sd_of["unet18_narrow"].items()}
    sd["model.decoder.center.0.0.weight"] = torch.zeros(8, 8, 3, 3)
    torch.save({"state_dict": sd}, lt)
    bad = os.path.join(tmp, "bad.h5")
    refused(exporter(lt, "-o", bad), bad, ["'model.decoder.center.0.0.weight'", "Unet"],
            "a foreign key under the Lightning prefix")
    refused(exporter(os.path.join(tmp, "deeplabv3.pth"), "-o", bad, "--arch", "fcn_resnet50"),
            bad, ["fcn_resnet50", "deeplabv3_resnet50"], "--arch disagreeing with the tensors")
    refused(exporter(os.path.join(tmp, "unet.pt"), "-o", bad, "--tile", 80), bad,
            ["--tile 80", "multiple of 32"], "a U-Net tile of 80")
    refused(exporter(os.path.join(tmp, "fcn.pth"), "-o", bad, "--tile", 64, "--stride", 65), bad,
            ["--stride 65", "--tile 64"], "a stride larger than the tile")

    # the reader: a bundle whose stride exceeds its tile
    import h5py
    with h5py.File(out, "a") as f:
        f.attrs["stride"] = np.int32(200)
    f, got = forward(tmp, out, x)
    check(got is None and "'stride' = 200" in f and "'tile' = 96" in f and "unet18_st.h5" in f,
          f"a bundle with stride 200 > tile 96 refused naming both ({f})", True)

    # depth from the blocks per stage: ResNet-101 under an FCN
    import torchvision.models.segmentation as seg
    torch.manual_seed(5)
    m = seg.fcn_resnet101(weights=None, weights_backbone=None, num_classes=3, aux_loss=False)
    ckpt = os.path.join(tmp, "fcn101.pth")
    torch.save(m.state_dict(), ckpt)
    out = os.path.join(tmp, "fcn101.h5")
    r = exporter(ckpt, "-o", out)
    check(r.returncode == 0 and attrs(out)[0]["arch"] == "fcn_resnet101",
          f"fcn_resnet101 detected ({r.stderr.strip()})", True)
    f, _ = forward(tmp, out, np.zeros((0, 3, TILE, TILE), np.float32))
    check(f[:3] == ["fcn_resnet101", "3", "3"], f"fcn_resnet101 bundle loads in C ({f})", True)


def test_demo(tmp):
    import torch
    sys.path.insert(0, os.path.join(SRC, "tools"))
    import make_demo_model as demo
    path = os.path.join(SRC, "sample_data", "demo_unet_resnet18.h5")
    a, names = attrs(path)
    check(a["arch"] == "unet_resnet18" and a["tile"] == 64 and a["stride"] == 32
          and list(a["bands"]) == [1, 2, 3, 4, 5, 6] and len(a["classes"]) == 4
          and len(a["tensors_sha256"]) == 64,
          f"demo bundle: arch {a.get('arch')}, tile/stride {a.get('tile')}/{a.get('stride')}, "
          f"bands {list(a.get('bands', []))}, classes {list(a.get('classes', []))}", True)
    m = demo.build_unet(torch, None)
    import h5py
    with h5py.File(path, "r") as f:
        sd = {k: torch.from_numpy(v[()]) for k, v in f["tensors"].items()}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    check(not unexpected and all(k.endswith("num_batches_tracked") for k in missing),
          f"the demo's tensors are make_demo_model's U-Net ({missing} {unexpected})")
    m.eval()
    x = l7_tile(6, x0=200, y0=140, mean=a["mean"], std=a["std"])
    with torch.no_grad():
        want = torch.softmax(m(torch.from_numpy(x)), dim=1).numpy()
    f, got = forward(tmp, path, x)
    check(got is not None and f[0] == "unet_resnet18", f"demo bundle runs in C ({f})")
    diff = float(np.abs(got - want).max())
    check(diff <= TOL, f"demo U-Net on an L7_ETMs.tif tile, max |p - p_torch| = {diff:.3g}", True)


def main():
    if not (SRC and BIN):
        print("TW_SOURCE_DIR/TW_BIN not set: skipped")
        return 77
    import torch
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        test_kinds(tmp)
        test_demo(tmp)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
