#!/usr/bin/python3
"""Train the small demo models shipped as sample_data/demo_resnet18.h5,
sample_data/demo_resnet50.h5 and sample_data/demo_unet_resnet18.h5.

A ResNet-18 with torchvision's tensor names and block layout (BasicBlock,
[2, 2, 2, 2]) but a quarter of the width (16/32/64/128 channels) and 6 input
bands, or (--arch resnet50) a ResNet-50 (Bottleneck, [3, 4, 6, 3]) at an
eighth of the width (8/16/32/64 inner channels, 256 out), trained for about a minute on the CPU on 64x64 tiles of
sample_data/L7_ETMs.tif. The labels are NOT ground truth: each pixel gets a
class from simple spectral rules (NDWI for water, NDVI for vegetation) and a
tile gets its pixels' majority class. The model therefore learns to imitate
those rules; it exists so that the pipeline can be demonstrated and tested
end to end on a real raster, not to map land cover.

--arch unet_resnet18 trains a U-Net for per-pixel maps (issue 36) in
segmentation_models_pytorch's layout (encoder.* = the narrow ResNet-18 above
without its fc; decoder.blocks.N.conv1/conv2 = conv3x3 + BN + ReLU after a
nearest x2 upsampling and the skip's concatenation; segmentation_head.0 a
conv3x3 with bias), decoder widths UNET_DECODER, trained per pixel on the
same rule labels (each pixel its own class, no tile majority) on crops
outside the same held-out rows: 300 steps of 16 crops alternating 32 and
64 px, loss weights 1/sqrt(class frequency), about 5 CPU minutes. It prints
the per-pixel agreement with the rule labels on the held-out rows beside
the tile classifier's (sample_data/demo_resnet18.h5: each tile's class
given to its pixels), both on the same 64 px tiles of those rows.

    make_demo_model.py [--arch resnet18|resnet50|unet_resnet18] [-o sample_data/demo_ARCH.h5]
                       [--steps N]

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
# The U-Net's decoder widths: SMP's default (256, 128, 64, 32, 16) at a
# quarter for the first three, 16 for the last two (a 4- or 8-channel map
# before the head would starve the per-pixel classes).
UNET_DECODER = (64, 32, 16, 16, 16)
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


def build_unet(torch, torchvision):
    """The narrow ResNet-18 as a U-Net encoder, in SMP's state_dict layout."""
    nn = torch.nn
    enc = build_model(torch, torchvision, "resnet18")
    del enc.fc
    del enc.avgpool

    def conv_bn_relu(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    class Block(nn.Module):
        def __init__(self, cin, skip, cout):
            super().__init__()
            self.conv1 = conv_bn_relu(cin + skip, cout)
            self.conv2 = conv_bn_relu(cout, cout)

    class Unet(nn.Module):
        def __init__(self):
            super().__init__()
            w = WIDTHS["resnet18"]
            self.encoder = enc
            self.decoder = nn.Module()
            heads = [w[3]] + list(UNET_DECODER[:-1])
            skips = [w[2], w[1], w[0], w[0], 0]
            self.decoder.blocks = nn.ModuleList(
                [Block(i, s, o) for i, s, o in zip(heads, skips, UNET_DECODER)])
            self.segmentation_head = nn.Sequential(
                nn.Conv2d(UNET_DECODER[-1], len(CLASSES), 3, padding=1))

        def forward(self, x):
            e = self.encoder
            s = e.relu(e.bn1(e.conv1(x)))
            l1 = e.layer1(e.maxpool(s))
            l2 = e.layer2(l1)
            l3 = e.layer3(l2)
            x = e.layer4(l3)
            for blk, skip in zip(self.decoder.blocks, [l3, l2, l1, s, None]):
                x = torch.nn.functional.interpolate(x, scale_factor=2, mode="nearest")
                if skip is not None:
                    x = torch.cat([x, skip], dim=1)
                x = blk.conv2(blk.conv1(x))
            return self.segmentation_head(x)

    return Unet()


def heldout_tiles(w, size=TILE):
    """Left edges of the size px tiles that cover the held-out rows
    VAL_Y0..VAL_Y1 (one row of tiles): side by side, the last one shifted
    left to end at the raster's edge (tilewise's edge: shift)."""
    xs = list(range(0, w - size + 1, size))
    if xs[-1] + size < w:
        xs.append(w - size)
    return xs


def per_pixel_map(probs_of, norm, w, size=TILE):
    """Class per pixel of the held-out rows from probs_of(batch) ->
    [n, classes, size, size] (a tile classifier's [n, classes] is spread
    over its tile): each pixel takes the last tile covering it."""
    xs = heldout_tiles(w, size)
    batch = np.stack([norm[:, VAL_Y0:VAL_Y0 + size, x:x + size] for x in xs])
    p = probs_of(batch)
    out = np.zeros((size, w), dtype=np.int64)
    for x, pt in zip(xs, p):
        cls = pt.argmax(0)
        out[:, x:x + size] = cls if cls.ndim == 2 else int(cls)
    return out


def train_unet(args, torch, torchvision, img, norm, pix, mean, std, rng):
    """The per-pixel U-Net (--arch unet_resnet18): train, compare with the
    tile classifier on the held-out rows, write the bundle."""
    import h5py
    _, h, w = img.shape
    T = TILE
    origins = {}
    for size in TRAIN_TILES:
        rows = [y for y in range(0, h - size + 1, 2) if y + size <= VAL_Y0 or y >= VAL_Y1]
        origins[size] = [(x, y) for y in rows for x in range(0, w - size + 1, 2)]
    counts = np.bincount(np.concatenate(
        [pix[:VAL_Y0].ravel(), pix[VAL_Y1:].ravel()]), minlength=len(CLASSES))
    # 1/sqrt(frequency): the rare classes (water, sparse vegetation) count,
    # without the noise of full inverse-frequency weights
    weight = 1.0 / np.sqrt(counts / counts.sum())
    weight = weight / weight.mean()
    print(f"{len(origins[T])} {T}x{T} training crops; training pixels per class",
          dict(zip(CLASSES, counts.tolist())), "loss weights", np.round(weight, 2).tolist())
    model = build_unet(torch, torchvision)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=args.steps)
    lossf = torch.nn.CrossEntropyLoss(weight=torch.tensor(weight, dtype=torch.float32))
    t0 = time.time()
    model.train()
    for step in range(args.steps):
        size = TRAIN_TILES[step % len(TRAIN_TILES)]  # 32 px steps are 4x cheaper
        xs, ys = [], []
        for _ in range(args.batch):
            x, y = origins[size][rng.integers(len(origins[size]))]
            t = norm[:, y:y + size, x:x + size]
            lab = pix[y:y + size, x:x + size]
            k = int(rng.integers(4))  # rotations and flips, applied to labels alike
            t, lab = np.rot90(t, k=k, axes=(1, 2)), np.rot90(lab, k=k)
            if rng.integers(2):
                t, lab = t[:, :, ::-1], lab[:, ::-1]
            xs.append(np.ascontiguousarray(t))
            ys.append(np.ascontiguousarray(lab))
        loss = lossf(model(torch.from_numpy(np.stack(xs))), torch.from_numpy(np.stack(ys)))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.3f} ({time.time() - t0:.0f} s)")
    model.eval()

    truth = pix[VAL_Y0:VAL_Y0 + T]
    with torch.no_grad():
        seg = per_pixel_map(lambda b: model(torch.from_numpy(b)).numpy(), norm, w)
    # the tile classifier, as committed, normalised with its own mean/std
    clf = build_model(torch, torchvision, "resnet18")
    with h5py.File(os.path.join(REPO, "sample_data", "demo_resnet18.h5"), "r") as f:
        sd = {k: torch.from_numpy(v[()]) for k, v in f["tensors"].items()}
        cmean = np.asarray(f.attrs["mean"], np.float64)
        cstd = np.asarray(f.attrs["std"], np.float64)
    clf.load_state_dict(sd, strict=False)
    clf.eval()
    cnorm = ((img - cmean[:, None, None]) / cstd[:, None, None]).astype(np.float32)
    with torch.no_grad():
        tiles = per_pixel_map(lambda b: clf(torch.from_numpy(b)).numpy(), cnorm, w)
    n = truth.size
    print(f"held-out rows {VAL_Y0}..{VAL_Y1 - 1}, {len(heldout_tiles(w))} tiles of {T} px, "
          f"{n} pixels (rule labels per class "
          f"{np.bincount(truth.ravel(), minlength=len(CLASSES)).tolist()}):")
    for name, m in (("U-Net-ResNet18, per pixel", seg), ("ResNet-18 tile classifier", tiles)):
        per = [float((m[truth == c] == c).mean()) if (truth == c).any() else float("nan")
               for c in range(len(CLASSES))]
        print(f"  {name}: per-pixel agreement with the rule labels {float((m == truth).mean()):.3f}"
              f" (per class {', '.join(f'{CLASSES[c]} {per[c]:.2f}' for c in range(len(CLASSES)))})")

    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()
          if not k.endswith("num_batches_tracked")}
    export_model.export(sd, args.output, arch="unet_resnet18", bands=list(range(1, BANDS + 1)),
                        scale=1.0, mean=mean.tolist(), std=std.tolist(), classes=CLASSES,
                        tile=TILE, source="make_demo_model.py")
    print(f"wrote {args.output} ({os.path.getsize(args.output)} bytes)")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", choices=sorted(WIDTHS) + ["unet_resnet18"], default="resnet18")
    ap.add_argument("-o", "--output", help="default sample_data/demo_ARCH.h5")
    ap.add_argument("--steps", type=int, help="default 200 (a U-Net: 300)")
    ap.add_argument("--batch", type=int, help="default 32 (a U-Net: 16 crops)")
    args = ap.parse_args()
    unet = args.arch == "unet_resnet18"
    if args.steps is None:
        args.steps = 300 if unet else 200
    if args.batch is None:
        args.batch = 16 if unet else 32
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
    if args.arch == "unet_resnet18":
        return train_unet(args, torch, torchvision, img, norm, pix, mean, std, rng)

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
