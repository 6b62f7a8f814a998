#!/usr/bin/python3
"""End to end: the segmentation networks' CPU forward (issue 36, model/segnet.c and
model/seg_cpu.c) against PyTorch, through tests/seg_forward (built for the tests).

Three modules with random weights (fixed seeds; batch-norm weights, biases and
running statistics drawn away from 1 and 0 so that the fold matters; the last
conv rescaled so that the logits spread over a few units across the tile and
the softmax is not flat), conv1 taking 4 bands, 5 classes, exported to
safetensors without metadata (the tensor names say what each is):

* torchvision fcn_resnet50 (aux_loss=True: aux_classifier.* must be read and
  ignored), a 100 px tile (no multiple of 8: the bilinear resize to the tile
  from a 13 px map);
* torchvision deeplabv3_resnet50, a 100 px tile, a 256 px one (the ASPP's
  wide rates on a 32 px map: model/seg_cpu.c's centre-tap and zero-padded
  copies), then a batch of 3 tiles of
  64 px whose every tile must equal its batch-1 run bit for bit (seg_forward
  runs each alone after the batch and compares);
* a U-Net with a ResNet-34 encoder written here in segmentation_models_pytorch's
  layout (encoder.* = torchvision resnet34 without fc; decoder.blocks.N.conv1/
  conv2 = Conv2dReLU: conv3x3 without bias, BN, ReLU; nearest x2, [upsampled,
  skip] concatenated; segmentation_head.0 conv3x3 with bias), a 128 px tile;
  and one on a ResNet-18 with decoder widths 24, 20, 12, 8, 8 (64 px): maps of
  channels no multiple of 16 are copied into their concatenation, not written
  in place (model/seg_cpu.c).

Tolerance (the issue's): |p - p_torch| <= 1e-4 on every probability (fp32 CPU
in PyTorch, softmax over classes). Also: a foreign key is refused naming it
(one outside the layout's modules, one inside them that the layout never
reads), and an arch that disagrees with the tensors names both.

The tile: 4-band pixels of /work/shared/data/rasters/naip_m_4709963_se_14_1_
20190904.tif (NAIP RGBN), each band standardised over the window; skipped
(77) when the shared data is absent. About 15 s on 2 cores.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

from e2eutil import BIN, SRC, check, randomize_bn

TOL = 1e-4
CLASSES = 5
NAIP = "naip_m_4709963_se_14_1_20190904.tif"


def raster_path():
    for base in (os.path.join(SRC or "", "..", "shared", "data"), "/work/shared/data"):
        p = os.path.join(base, "rasters", NAIP)
        if os.path.exists(p):
            return p
    return None


def read_tiles(path, tile, n):
    """n tiles of tile px, 4 bands, from the top-left of path (one row of them),
    each band standardised over the whole window."""
    from osgeo import gdal
    gdal.UseExceptions()
    ds = gdal.Open(path)
    a = ds.ReadAsArray(64, 64, tile * n, tile).astype(np.float64)
    a = (a - a.mean(axis=(1, 2), keepdims=True)) / (a.std(axis=(1, 2), keepdims=True) + 1e-6)
    return np.stack([a[:, :, i * tile:(i + 1) * tile] for i in range(n)]).astype(np.float32)


def spread_logits(model, last, x):
    """Rescale conv `last` (the logits' conv) so that each class's logits have
    mean 0 and the lot a spread of 3 over tile x (resizing is linear)."""
    import torch
    with torch.no_grad():
        out = model(torch.from_numpy(x))
        out = out["out"] if isinstance(out, dict) else out
        m = out.mean(dim=(0, 2, 3))
        sd = float((out - m[None, :, None, None]).pow(2).mean().sqrt()) + 1e-12
        a = 3.0 / sd
        last.weight.data *= a
        last.bias.data = a * (last.bias.data - m)


class ConvBNReLU(__import__("torch").nn.Sequential):
    def __init__(self, cin, cout):
        import torch.nn as nn
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True))


class DecoderBlock(__import__("torch").nn.Module):
    def __init__(self, cin, skip, cout):
        super().__init__()
        self.conv1 = ConvBNReLU(cin + skip, cout)
        self.conv2 = ConvBNReLU(cout, cout)


class UnetResNet34(__import__("torch").nn.Module):
    """segmentation_models_pytorch's Unet(encoder_name="resnet34") state_dict
    layout and forward, written out (SMP is not installed here)."""

    def __init__(self, bands, classes, decoder=(256, 128, 64, 32, 16), depth=34):
        import torch.nn as nn
        import torchvision
        super().__init__()
        enc = getattr(torchvision.models, f"resnet{depth}")()
        enc.conv1 = nn.Conv2d(bands, 64, 7, 2, 3, bias=False)
        del enc.fc
        del enc.avgpool
        self.encoder = enc
        head = [512] + list(decoder[:-1])
        skips = [256, 128, 64, 64, 0]
        self.decoder = nn.Module()
        self.decoder.blocks = nn.ModuleList(
            [DecoderBlock(i, s, o) for i, s, o in zip(head, skips, decoder)])
        self.segmentation_head = nn.Sequential(nn.Conv2d(decoder[-1], classes, 3, padding=1),
                                               nn.Identity(), nn.Identity())

    def forward(self, x):
        import torch
        import torch.nn.functional as F
        e = self.encoder
        s = e.relu(e.bn1(e.conv1(x)))
        l1 = e.layer1(e.maxpool(s))
        l2 = e.layer2(l1)
        l3 = e.layer3(l2)
        x = e.layer4(l3)
        for blk, skip in zip(self.decoder.blocks, [l3, l2, l1, s, None]):
            x = F.interpolate(x, scale_factor=2, mode="nearest")
            if skip is not None:
                x = torch.cat([x, skip], dim=1)
            x = blk.conv2(blk.conv1(x))
        return self.segmentation_head(x)


def make(name, seed, x):
    import torch
    import torchvision.models.segmentation as seg
    torch.manual_seed(seed)
    if name == "unet":
        m = UnetResNet34(4, CLASSES)
        last = m.segmentation_head[0]
    elif name == "unet18_narrow":
        m = UnetResNet34(4, CLASSES, decoder=(24, 20, 12, 8, 8), depth=18)
        last = m.segmentation_head[0]
    else:
        ctor = seg.fcn_resnet50 if name == "fcn" else seg.deeplabv3_resnet50
        m = ctor(weights=None, weights_backbone=None, num_classes=CLASSES, aux_loss=name == "fcn")
        m.backbone.conv1 = torch.nn.Conv2d(4, 64, 7, 2, 3, bias=False)
        last = m.classifier[4]
    randomize_bn(m, seed)
    m = m.eval()
    spread_logits(m, last, x)
    return m


def torch_probs(m, x):
    import torch
    with torch.no_grad():
        out = m(torch.from_numpy(x))
        out = out["out"] if isinstance(out, dict) else out
        return torch.softmax(out, dim=1).numpy()


def export(m, path, extra=None):
    sys.path.insert(0, os.path.join(SRC, "tools"))
    import safetensors_io
    sd = {k: v.detach().float().numpy() for k, v in m.state_dict().items()
          if not k.endswith("num_batches_tracked")}
    if extra:
        sd.update(extra)
    safetensors_io.save(path, sd, "F32")


def seg_forward(tmp, model, x, arch=None):
    n, _, tile, _ = x.shape
    inp = os.path.join(tmp, "in.raw")
    outp = os.path.join(tmp, "out.raw")
    x.astype("<f4").tofile(inp)
    if os.path.exists(outp):
        os.remove(outp)
    exe = os.path.join(os.path.dirname(BIN), "seg_forward")
    cmd = [exe, model, str(tile), str(n), inp, outp] + ([arch] if arch else [])
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return r, None
    return r, np.fromfile(outp, dtype="<f4").reshape(n, CLASSES, tile, tile)


def main():
    if not (SRC and BIN):
        print("TW_SOURCE_DIR/TW_BIN not set: skipped")
        return 77
    path = raster_path()
    if path is None:
        print(f"shared data absent ({NAIP}): skipped")
        return 77
    import torch
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        for name, tile, seed, arch in (("unet", 128, 1, "unet_resnet34"),
                                       ("deeplabv3", 100, 2, "deeplabv3_resnet50"),
                                       ("fcn", 100, 3, "fcn_resnet50"),
                                       ("unet18_narrow", 64, 4, "unet_resnet18")):
            x = read_tiles(path, tile, 1)
            m = make(name, seed, x)
            model = os.path.join(tmp, name + ".safetensors")
            export(m, model)
            want = torch_probs(m, x)
            r, got = seg_forward(tmp, model, x)
            check(got is not None, f"{name}: seg_forward ran ({r.stderr.strip()})")
            check(r.stdout.split()[0] == arch, f"{name}: detected as {r.stdout.split()[0]}")
            diff = float(np.abs(got - want).max())
            print(f"{name}: {tile} px, max |p - p_torch| = {diff:.2e}, "
                  f"argmax agreement {np.mean(got.argmax(1) == want.argmax(1)):.4f}, "
                  f"max p median {np.median(want.max(1)):.3f}; arena/total bytes "
                  f"{' '.join(r.stdout.split()[3:])}")
            check(diff <= TOL, f"{name}: max |p - p_torch| = {diff:.3g} <= {TOL}", True)

            if name == "deeplabv3":
                xb = read_tiles(path, 64, 3)
                rb, batch = seg_forward(tmp, model, xb)
                check(batch is not None, f"batch of 3: {rb.stderr.strip()}")
                check(rb.stdout.split()[5] == "same",
                      "deeplabv3: each tile of a batch of 3 has its batch-1 bits", True)
                want_b = torch_probs(m, xb)
                d = float(np.abs(batch - want_b).max())
                check(d <= TOL, f"deeplabv3: 64 px batch of 3, max diff {d:.3g} <= {TOL}", True)
                # 256 px: a 32 px map, where rate 36 is its centre tap (a 1x1 conv) and
                # rates 12 and 24 read a zero-padded copy (oneDNN's JIT refuses their padding)
                xl = read_tiles(path, 256, 1)
                rl, big = seg_forward(tmp, model, xl)
                check(big is not None, f"deeplabv3 at 256 px: {rl.stderr.strip()}")
                d = float(np.abs(big - torch_probs(m, xl)).max())
                check(d <= TOL, f"deeplabv3: 256 px, max diff {d:.3g} <= {TOL}", True)
                r, _ = seg_forward(tmp, model, x, "fcn_resnet50")
                check(r.returncode == 1 and "deeplabv3_resnet50" in r.stderr
                      and "fcn_resnet50" in r.stderr,
                      f"model.arch fcn_resnet50 on DeepLab weights refused naming both "
                      f"({r.stderr.strip()})", True)
            if name == "unet":
                r, _ = seg_forward(tmp, model, read_tiles(path, 80, 1))
                check(r.returncode == 1 and "multiple of 32" in r.stderr,
                      f"U-Net on an 80 px tile refused ({r.stderr.strip()})", True)
                for key in ("decoder.center.0.0.weight", "encoder.layer1.0.conv9.weight"):
                    bad = os.path.join(tmp, "foreign.safetensors")
                    export(m, bad, {key: np.zeros((64, 64, 1, 1), np.float32)})
                    r, _ = seg_forward(tmp, bad, x)
                    check(r.returncode == 1 and f"'{key}'" in r.stderr and "foreign" in r.stderr,
                          f"foreign key {key} refused naming it ({r.stderr.strip()})", True)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
