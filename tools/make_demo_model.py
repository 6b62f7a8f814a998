#!/usr/bin/python3
"""Train the small demo models shipped as sample_data/demo_resnet18.h5 and
sample_data/demo_resnet50.h5.

A ResNet-18 with torchvision's tensor names and block layout (BasicBlock,
[2, 2, 2, 2]) but a quarter of the width (16/32/64/128 channels) and 6 input
bands, or (--arch resnet50) a ResNet-50 (Bottleneck, [3, 4, 6, 3]) at an
eighth of the width (8/16/32/64 inner channels, 256 out), trained for about a minute on the CPU on 64x64 tiles of
sample_data/L7_ETMs.tif. The labels are NOT ground truth: each pixel gets a
class from simple spectral rules (NDWI for water, NDVI for vegetation) and a
tile gets its pixels' majority class. The model therefore learns to imitate
those rules; it exists so that the pipeline can be demonstrated and tested
end to end on a real raster, not to map land cover.

    make_demo_model.py [--arch resnet18|resnet50] [-o sample_data/demo_ARCH.h5] [--steps N]

Deterministic: fixed seeds, single-process data, torch.use_deterministic_algorithms.
"""
import argparse
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import export_model  # noqa: E402

CLASSES = ["water", "dense_vegetation", "sparse_vegetation", "bare_or_built"]
WIDTHS = {"resnet18": (16, 32, 64, 128), "resnet50": (8, 16, 32, 64)}
BLOCKS = {"resnet18": (2, 2, 2, 2), "resnet50": (3, 4, 6, 3)}
TILE = 64        # the tile size recorded in the bundle (inference)
# Training alternates 32x32 crops (3x cheaper per CPU step) with 64x64 ones
# (the inference size, whose majority labels are coarser).
TRAIN_TILES = (32, 64)
BANDS = 6
# A horizontal band of rows is held out: no training crop touches it. It
# crosses water, vegetation and bare land (see the class map in README.md).
VAL_Y0, VAL_Y1 = 128, 192


def pixel_classes(img):
    """Rule-derived class per pixel from the 6 ETM+ bands (B, G, R, NIR, SWIR1, SWIR2)."""
    b, g, r, nir, swir1, swir2 = img.astype(np.float64)
    eps = 1e-9
    ndvi = (nir - r) / (nir + r + eps)
    ndwi = (g - nir) / (g + nir + eps)  # McFeeters
    cls = np.full(ndvi.shape, 3, dtype=np.int64)  # bare soil, built-up, rock
    cls[ndvi > 0.10] = 2
    cls[ndvi > 0.30] = 1
    cls[ndwi > 0.30] = 0
    return cls


def tile_label(pix, x, y, size):
    counts = np.bincount(pix[y:y + size, x:x + size].ravel(), minlength=len(CLASSES))
    return int(np.argmax(counts))


def build_model(torch, torchvision, arch):
    """torchvision ResNet-18/50 structure at reduced width; state_dict names
    are identical to torchvision.models.resnet18's / resnet50's."""
    from torchvision.models.resnet import BasicBlock, Bottleneck
    nn = torch.nn
    block = BasicBlock if arch == "resnet18" else Bottleneck

    class NarrowResNet(nn.Module):
        def __init__(self):
            super().__init__()
            w = WIDTHS[arch]
            self.conv1 = nn.Conv2d(BANDS, w[0], 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(w[0])
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            inplanes = w[0]
            for i, (planes, n) in enumerate(zip(w, BLOCKS[arch])):
                stride = 1 if i == 0 else 2
                down = None
                out = planes * block.expansion
                if stride != 1 or inplanes != out:
                    down = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride, bias=False),
                                         nn.BatchNorm2d(out))
                blocks = [block(inplanes, planes, stride, down)]
                blocks += [block(out, planes) for _ in range(n - 1)]
                setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
                inplanes = out
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(inplanes, len(CLASSES))
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return NarrowResNet()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", choices=sorted(WIDTHS), default="resnet18")
    ap.add_argument("-o", "--output", help="default sample_data/demo_ARCH.h5")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    if not args.output:
        args.output = os.path.join(REPO, "sample_data", f"demo_{args.arch}.h5")

    import rasterio
    import torch
    import torchvision
    torch.set_num_threads(2)
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(0)

    with rasterio.open(os.path.join(REPO, "sample_data", "L7_ETMs.tif")) as ds:
        img = ds.read()
    _, h, w = img.shape
    mean = img.reshape(BANDS, -1).astype(np.float64).mean(axis=1)
    std = img.reshape(BANDS, -1).astype(np.float64).std(axis=1)
    norm = ((img - mean[:, None, None]) / std[:, None, None]).astype(np.float32)
    pix = pixel_classes(img)

    # Every tile origin in the training part, grouped by label so that each
    # batch is class-balanced (water and bare tiles are rarer).
    pools = {}
    for T in TRAIN_TILES:
        train = {c: [] for c in range(len(CLASSES))}
        rows = list(range(0, VAL_Y0 - T + 1, 2)) + list(range(VAL_Y1, h - T + 1, 2))
        for y in rows:
            for x in range(0, w - T + 1, 2):
                train[tile_label(pix, x, y, T)].append((x, y))
        pools[T] = (train, [c for c in train if train[c]])
        print(f"{T}x{T} training tiles per class:",
              {CLASSES[c]: len(v) for c, v in train.items()})

    model = build_model(torch, torchvision, args.arch)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=args.steps)
    lossf = torch.nn.CrossEntropyLoss()
    t0 = time.time()
    model.train()
    for step in range(args.steps):
        T = TRAIN_TILES[step % len(TRAIN_TILES)]
        train, present = pools[T]
        xs, ys = [], []
        for i in range(args.batch):
            c = present[i % len(present)]
            x, y = train[c][rng.integers(len(train[c]))]
            t = norm[:, y:y + T, x:x + T]
            # labels do not depend on orientation: flips and rotations are free data
            t = np.rot90(t, k=int(rng.integers(4)), axes=(1, 2))
            if rng.integers(2):
                t = t[:, :, ::-1]
            xs.append(np.ascontiguousarray(t))
            ys.append(c)
        xb = torch.from_numpy(np.stack(xs))
        yb = torch.tensor(ys)
        loss = lossf(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.3f} ({time.time() - t0:.0f} s)")

    model.eval()
    for size in TRAIN_TILES:
        val = [(x, y) for y in range(VAL_Y0, VAL_Y1 - size + 1, 8)
               for x in range(0, w - size + 1, 8)]
        with torch.no_grad():
            xv = torch.from_numpy(np.stack([norm[:, y:y + size, x:x + size] for x, y in val]))
            pred = model(xv).argmax(1).numpy()
        truth = np.array([tile_label(pix, x, y, size) for x, y in val])
        acc = float((pred == truth).mean())
        print(f"held-out {size}x{size} tiles: agreement with the rule labels {acc:.3f} "
              f"on {len(val)} tiles (label counts "
              f"{np.bincount(truth, minlength=len(CLASSES)).tolist()})")

    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()
          if not k.endswith("num_batches_tracked")}
    export_model.export(sd, args.output, arch=args.arch, bands=list(range(1, BANDS + 1)),
                        scale=1.0, mean=mean.tolist(), std=std.tolist(), classes=CLASSES,
                        tile=TILE, source="make_demo_model.py")
    print(f"wrote {args.output} ({os.path.getsize(args.output)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
