#!/usr/bin/python3
"""Export a PyTorch ResNet checkpoint to the tilewise HDF5 bundle.

    export_model.py CHECKPOINT -o OUT.h5 [--arch resnet18] [--bands 1,2,3]
                    [--scale S] [--mean m1,m2,..] [--std s1,s2,..]
                    [--classes a,b,c] [--tile 64]

CHECKPOINT is a .pth/.pt file (a state_dict, a dict holding one under
'state_dict' or 'model', or a whole nn.Module), a .safetensors file, or a
tilewise bundle (.h5): its tensors are copied (as float32, values unchanged), its metadata
kept unless an option overrides it - the way to add the checksum to a bundle
written before there was one. The
bundle layout is the one documented in io/model_file.h: every tensor under
/tensors/<name> as float32 (BN running statistics kept, num_batches_tracked
dropped), the metadata as root attributes, so that a run needs no retyping,
and tensors_sha256, the checksum tilewise verifies at load (tensors_checksum).
A tensor holding NaN or Inf is refused, as tilewise would refuse it.
"""
import argparse
import hashlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402

FORMAT = "tilewise-resnet"
FORMAT_VERSION = 1

# blocks per stage -> depth, for BasicBlock and Bottleneck ResNets
_DEPTHS = {
    (False, (2, 2, 2, 2)): "resnet18",
    (False, (3, 4, 6, 3)): "resnet34",
    (True, (3, 4, 6, 3)): "resnet50",
    (True, (3, 4, 23, 3)): "resnet101",
    (True, (3, 8, 36, 3)): "resnet152",
}


class ExportError(Exception):
    pass


def _dtype_name(dt):
    if dt.kind != "f":
        raise ExportError(f"dtype {dt} is not a float")
    return f"F{dt.itemsize * 8}"


def tensors_checksum(tensors):
    """The bundle's tensors_sha256 (io/model_file.h): tensors is name -> array
    as stored under /tensors (float datasets only). One line per tensor,
    "NAME<TAB>DTYPE<TAB>D0,D1,..<TAB>SHA-256 of its data as little-endian
    bytes<LF>", lines in ascending byte order of the UTF-8 names; the
    checksum is the SHA-256 of the lines, 64 lowercase hex digits."""
    lines = []
    for name in sorted(tensors, key=lambda k: k.encode("utf-8")):
        a = np.asarray(tensors[name])
        le = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
        digest = hashlib.sha256(le.tobytes()).hexdigest()
        shape = ",".join(str(d) for d in a.shape)
        lines.append(f"{name}\t{_dtype_name(a.dtype)}\t{shape}\t{digest}\n")
    return hashlib.sha256("".join(lines).encode("utf-8")).hexdigest()


def _as_numpy(v):
    if hasattr(v, "detach"):
        v = v.detach().cpu()
        if str(v.dtype) == "torch.bfloat16":
            v = v.float()
        return v.numpy()
    return np.asarray(v)


def load_state_dict(path):
    """name -> numpy array from a .pth/.pt or .safetensors checkpoint."""
    if path.endswith(".safetensors"):
        tensors, _ = safetensors_io.load(path)
        sd = tensors
    else:
        import torch
        obj = torch.load(path, map_location="cpu")
        if isinstance(obj, torch.nn.Module):
            obj = obj.state_dict()
        if isinstance(obj, dict):
            for key in ("state_dict", "model"):
                if key in obj and isinstance(obj[key], (dict, torch.nn.Module)):
                    obj = obj[key]
                    if isinstance(obj, torch.nn.Module):
                        obj = obj.state_dict()
                    break
        if not isinstance(obj, dict):
            raise ExportError(f"{path}: not a state_dict, a checkpoint dict or an nn.Module")
        sd = {k: v for k, v in obj.items() if hasattr(v, "detach")}
    # DataParallel / DDP checkpoints prefix every key with "module."
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return {k: _as_numpy(v) for k, v in sd.items() if not k.endswith("num_batches_tracked")}


def is_bundle(path):
    with open(path, "rb") as f:
        return f.read(8) == b"\x89HDF\r\n\x1a\n"


def load_bundle(path):
    """(name -> array exactly as stored, metadata keyword arguments of export)
    from a tilewise bundle."""
    import h5py
    with h5py.File(path, "r") as f:
        if f.attrs.get("format") not in (b"tilewise-resnet", "tilewise-resnet"):
            raise ExportError(f"{path}: not a tilewise bundle (no format 'tilewise-resnet')")
        sd = {k: v[()] for k, v in f["tensors"].items() if v.dtype.kind == "f"}
        a = f.attrs

        def text(v):
            return v.decode("utf-8") if isinstance(v, bytes) else str(v)

        meta = {"arch": text(a["arch"]) if "arch" in a else None,
                "bands": [int(b) for b in a["bands"]] if "bands" in a else None,
                "scale": float(a["scale"]) if "scale" in a else 1.0,
                "mean": list(np.asarray(a["mean"], dtype=np.float32)) if "mean" in a else None,
                "std": list(np.asarray(a["std"], dtype=np.float32)) if "std" in a else None,
                "classes": [text(c) for c in a["classes"]] if "classes" in a else None,
                "tile": int(a["tile"]) if "tile" in a else None,
                "source": text(a["source"]) if "source" in a else path}
    return sd, meta


def infer_arch(sd):
    """resnetNN from the state_dict keys, or raise ExportError."""
    bottleneck = any(k.endswith(".conv3.weight") for k in sd)
    blocks = []
    for stage in range(1, 5):
        idx = {int(k.split(".")[1]) for k in sd if k.startswith(f"layer{stage}.")}
        blocks.append(len(idx))
    arch = _DEPTHS.get((bottleneck, tuple(blocks)))
    if arch is None:
        kind = "Bottleneck" if bottleneck else "BasicBlock"
        raise ExportError(f"cannot infer the ResNet depth: {kind} with blocks {blocks}")
    # the family (model/resnet.h): conv2 [width, width/groups, 3, 3]
    c2 = sd.get("layer1.0.conv2.weight")
    if bottleneck and c2 is not None and len(c2.shape) == 4 and c2.shape[1] > 0:
        width = int(sd["layer1.0.conv1.weight"].shape[0])
        groups = max(width // int(c2.shape[1]), 1)
        base = width // groups
        if groups > 1:
            return f"resnext{arch[6:]}_{groups}x{base}d"
        if base > 64 and base % 64 == 0:
            return f"wide_resnet{arch[6:]}_{base // 64}"
    return arch


def _floats(text, what):
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ExportError(f"--{what}: expected comma-separated numbers, got '{text}'")


def export(sd, out, arch=None, bands=None, scale=1.0, mean=None, std=None,
           classes=None, tile=None, source=None):
    """Validate sd (name -> array) and the metadata, then write the bundle to out."""
    import h5py
    for req in ("conv1.weight", "fc.weight", "fc.bias"):
        if req not in sd:
            raise ExportError(f"checkpoint has no '{req}': not a torchvision-layout ResNet")
    inferred = infer_arch(sd)
    if arch is None:
        arch = inferred
    elif arch != inferred:
        raise ExportError(f"--arch {arch} but the weights are a {inferred}")
    n_in = int(sd["conv1.weight"].shape[1])
    n_cls = int(sd["fc.weight"].shape[0])
    if bands is None:
        bands = list(range(1, n_in + 1))
    if len(bands) != n_in:
        raise ExportError(f"--bands lists {len(bands)} bands but conv1.weight takes {n_in}")
    if any(b < 1 for b in bands):
        raise ExportError("--bands are 1-based")
    for what, v in (("mean", mean), ("std", std)):
        if v is not None and len(v) != n_in:
            raise ExportError(f"--{what} has {len(v)} values but the model takes {n_in} bands")
    if std is not None and any(s <= 0 for s in std):
        raise ExportError("--std values must be > 0")
    if classes is not None and len(classes) != n_cls:
        raise ExportError(f"--classes names {len(classes)} classes but fc.weight has {n_cls}")
    if tile is not None and tile < 32:
        raise ExportError(f"--tile {tile}: a ResNet needs at least 32 pixels")
    stored = {name: np.ascontiguousarray(a, dtype=np.float32) for name, a in sd.items()}
    for name, a in stored.items():
        bad = np.flatnonzero(~np.isfinite(a))
        if bad.size:
            idx = ", ".join(str(int(i)) for i in np.unravel_index(bad[0], a.shape))
            raise ExportError(f"tensor {name}[{idx}] is {a.flat[bad[0]]}: non-finite weights "
                              "cannot be exported (tilewise refuses them)")

    tmp = out + ".tmp"
    with h5py.File(tmp, "w") as f:
        f.attrs["format"] = np.bytes_(FORMAT)
        f.attrs["format_version"] = np.int32(FORMAT_VERSION)
        f.attrs["arch"] = np.bytes_(arch)
        # conv1 3x3: the small stem (stride 1, no max pool; model.stem)
        k = sd["conv1.weight"].shape
        f.attrs["stem"] = np.bytes_("small" if len(k) == 4 and k[2] == 3 else "standard")
        f.attrs["bands"] = np.asarray(bands, dtype=np.int32)
        f.attrs["scale"] = np.float64(scale)
        if mean is not None:
            f.attrs["mean"] = np.asarray(mean, dtype=np.float32)
        if std is not None:
            f.attrs["std"] = np.asarray(std, dtype=np.float32)
        if classes is not None:
            width = max(len(c.encode("utf-8")) for c in classes) + 1
            f.attrs["classes"] = np.array([c.encode("utf-8") for c in classes], dtype=f"S{width}")
        if tile is not None:
            f.attrs["tile"] = np.int32(tile)
        if source:
            f.attrs["source"] = np.bytes_(os.path.basename(source))
        f.attrs["tensors_sha256"] = np.bytes_(tensors_checksum(stored))
        g = f.create_group("tensors")
        for name, a in stored.items():
            g.create_dataset(name, data=a)
    os.replace(tmp, out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--arch", choices=sorted(set(_DEPTHS.values())) + [
        "resnext50_32x4d", "resnext101_32x8d", "resnext101_64x4d", "wide_resnet50_2",
        "wide_resnet101_2"])
    ap.add_argument("--bands", help="1-based band numbers, comma separated")
    ap.add_argument("--scale", type=float, help="default 1.0 (a bundle's own)")
    ap.add_argument("--mean")
    ap.add_argument("--std")
    ap.add_argument("--classes", help="class names, comma separated")
    ap.add_argument("--tile", type=int)
    a = ap.parse_args(argv)
    try:
        bands = None
        if a.bands:
            try:
                bands = [int(x) for x in a.bands.split(",") if x.strip()]
            except ValueError:
                raise ExportError(f"--bands: expected comma-separated integers, got '{a.bands}'")
        mean = _floats(a.mean, "mean") if a.mean else None
        std = _floats(a.std, "std") if a.std else None
        classes = [c.strip() for c in a.classes.split(",")] if a.classes else None
        if is_bundle(a.checkpoint):
            sd, old = load_bundle(a.checkpoint)
            export(sd, a.output, a.arch or old["arch"], bands or old["bands"],
                   a.scale if a.scale is not None else old["scale"], mean or old["mean"],
                   std or old["std"], classes or old["classes"], a.tile or old["tile"],
                   old["source"])
        else:
            sd = load_state_dict(a.checkpoint)
            export(sd, a.output, a.arch, bands, 1.0 if a.scale is None else a.scale, mean, std,
                   classes, a.tile, a.checkpoint)
    except (ExportError, OSError, ValueError, KeyError) as e:
        print(f"export_model.py: {a.checkpoint}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
