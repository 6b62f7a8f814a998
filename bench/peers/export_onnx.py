#!/usr/bin/python3
"""Make the benchmark's models: one torchvision ResNet, three files.

    export_onnx.py --arch resnet18 --out-dir DIR [--bands 6] [--classes 8] [--seed 0]
                   [--tiles 32,64,224] [--opset 13]

The network is torchvision's ResNet (or ResNeXt, Wide ResNet: resnext50_32x4d,
wide_resnet50_2, ...) with conv1 replaced by
Conv2d(BANDS, 64, 7, 2, 3, bias=False) and an fc layer of CLASSES outputs;
ARCH_small (resnet18_small, ...) is ARCH with the small stem: conv1
Conv2d(BANDS, 64, 3, 1, 1, bias=False) and no max pool (nn.Identity),
randomly initialised from a fixed seed and put in eval mode (no training: the
benchmark measures speed, and every runtime gets exactly the same weights).

Writes, in DIR:
  ARCH.safetensors  the state_dict (F32, num_batches_tracked dropped), read by
                    tilewise and by bench/peers/torch_loop.py
  ARCH.onnx         torch.onnx.export of the same module, dynamic batch axis,
                    for ONNX Runtime (bench/peers/ort_model.js)
  ARCH.json         convolution FLOPs per tile for each size in --tiles,
                    counted by forward hooks on every Conv2d (downsample
                    convolutions included): 2 * Cin/groups * Cout * kh * kw * Hout * Wout

Outputs that already exist are kept (delete DIR to rebuild them).
"""
import argparse
import json
import os
import sys

import torch
import torchvision

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tools"))
import safetensors_io  # noqa: E402


def build_model(arch, bands, classes, seed):
    """torchvision ResNet `arch` for `bands` input bands and `classes` outputs, eval mode."""
    torch.manual_seed(seed)
    small = arch.endswith("_small")
    model = getattr(torchvision.models, arch[:-6] if small else arch)(weights=None,
                                                                      num_classes=classes)
    if small:
        model.conv1 = torch.nn.Conv2d(bands, 64, kernel_size=3, stride=1, padding=1, bias=False)
        model.maxpool = torch.nn.Identity()
    else:
        model.conv1 = torch.nn.Conv2d(bands, 64, kernel_size=7, stride=2, padding=3, bias=False)
    torch.nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model.eval()


def conv_flops(model, bands, tile):
    """Sum over every Conv2d of 2 * Cin/groups * Cout * kh * kw * Hout * Wout for one tile."""
    total = [0]

    def hook(mod, _inp, out):
        kh, kw = mod.kernel_size
        total[0] += 2 * (mod.in_channels // mod.groups) * mod.out_channels * kh * kw \
            * out.shape[2] * out.shape[3]

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, torch.nn.Conv2d)]
    with torch.inference_mode():
        model(torch.zeros(1, bands, tile, tile))
    for h in handles:
        h.remove()
    return total[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", required=True,
                    choices=["resnet18", "resnet34", "resnet50", "resnext50_32x4d",
                             "resnext101_32x8d", "wide_resnet50_2", "resnet18_small",
                             "resnet50_small"])
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--bands", type=int, default=6)
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiles", default="32,64,224")
    ap.add_argument("--opset", type=int, default=13)
    a = ap.parse_args()

    os.makedirs(a.out_dir, exist_ok=True)
    base = os.path.join(a.out_dir, a.arch)
    st_path, onnx_path, meta_path = base + ".safetensors", base + ".onnx", base + ".json"
    if all(os.path.exists(p) for p in (st_path, onnx_path, meta_path)):
        return 0

    model = build_model(a.arch, a.bands, a.classes, a.seed)
    small = a.arch.endswith("_small")
    sd = {k: v for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}
    safetensors_io.save(st_path + ".part", sd, dtype="F32",
                        metadata={"arch": a.arch[:-6] if small else a.arch,
                                  "stem": "small" if small else "standard", "seed": a.seed})
    os.replace(st_path + ".part", st_path)

    dummy = torch.zeros(2, a.bands, 64, 64)
    # H and W are dynamic too, so one file serves 64- and 224-pixel tiles
    torch.onnx.export(model, dummy, onnx_path + ".part", opset_version=a.opset,
                      input_names=["input"], output_names=["logits"],
                      dynamic_axes={"input": {0: "batch", 2: "height", 3: "width"},
                                    "logits": {0: "batch"}},
                      do_constant_folding=True)
    os.replace(onnx_path + ".part", onnx_path)

    meta = {"arch": a.arch, "bands": a.bands, "classes": a.classes, "seed": a.seed,
            "opset": a.opset, "torch": torch.__version__,
            "conv_flops_per_tile": {str(t): conv_flops(model, a.bands, int(t))
                                    for t in a.tiles.split(",")}}
    with open(meta_path + ".part", "w") as f:
        json.dump(meta, f, indent=1)
    os.replace(meta_path + ".part", meta_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
