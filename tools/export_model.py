#!/usr/bin/python3
"""Export a PyTorch ResNet checkpoint to the tilewise HDF5 bundle.

    export_model.py CHECKPOINT -o OUT.h5 [--arch resnet18] [--bands 1,2,3]
                    [--scale S] [--mean m1,m2,..] [--std s1,s2,..]
                    [--classes a,b,c] [--tile 64]

CHECKPOINT is a .pth/.pt/.ckpt file (a state_dict, a dict holding one under
'state_dict' (Lightning, TorchGeo), 'model' or 'model_state_dict', or a whole
nn.Module with --trust-pickle), a .safetensors file, or a
tilewise bundle (.h5): its tensors are copied (as float32, values unchanged), its metadata
kept unless an option overrides it - the way to add the checksum to a bundle
written before there was one. The
bundle layout is the one documented in io/modelfile/model_file.h: every tensor under
/tensors/<name> as float32 (BN running statistics kept, num_batches_tracked
dropped), the metadata as root attributes, so that a run needs no retyping,
and tensors_sha256, the checksum tilewise verifies at load (tensors_checksum).
A tensor holding NaN or Inf is refused, as tilewise would refuse it.

Checkpoints as users have them (timm, TorchGeo, Lightning): the ResNet's
tensors may sit under a prefix ('module.', 'model.', 'backbone.',
'encoder.', 'net.', or a chain of them such as 'model.backbone.'); the
prefix is stripped and tensors outside it (projection heads, momentum
encoders, losses) are left out, each step said on stdout. Without 'fc' the
model is a headless backbone: tilewise runs it with embedding_raster (and
embeddings) only.
Any other tensor name is refused, naming the first one that is not part of
a torchvision/timm ResNet.

Pickles: .pth/.pt/.ckpt are read by torch.load with a restricted unpickler
that builds tensors and plain containers (dicts, lists, numbers, strings)
only and refuses any other class or function a pickle names, so a
checkpoint cannot run code while it is read (torch 1.13's weights_only=True
does the same but refuses floats, which Lightning checkpoints hold). One that holds other Python
objects (a whole nn.Module, Lightning's hyper-parameters of custom classes)
is refused naming what it holds; --trust-pickle reads it with the full
unpickler, which runs whatever code the file names: only for files whose
source you trust.
"""
import argparse
import hashlib
import os
import re
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
    """The bundle's tensors_sha256 (io/modelfile/model_file.h): tensors is name -> array
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


# Prefixes wrapping a ResNet's tensors in the checkpoints of DataParallel
# ('module.'), Lightning tasks ('model.'), TorchGeo/SSL ('backbone.',
# 'encoder.') and others ('net.'); chains of them are stripped too.
PREFIXES = ("module.", "model.", "backbone.", "encoder.", "net.")
WRAPPERS = ("state_dict", "model", "model_state_dict")

# Every tensor name of a torchvision/timm ResNet (num_batches_tracked aside).
_RESNET_KEY = re.compile(
    r"^(conv1\.weight|bn1\.(weight|bias|running_mean|running_var)|fc\.(weight|bias)|"
    r"layer[1-4]\.\d+\.(conv[1-3]\.weight|bn[1-3]\.(weight|bias|running_mean|running_var)|"
    r"downsample\.0\.weight|downsample\.1\.(weight|bias|running_mean|running_var)))$")


def _say(msg):
    print(f"export_model.py: {msg}")


def _restricted_pickle():
    """A pickle module for torch.load whose Unpickler builds tensors, storages
    and plain containers only: any other global a pickle names (a class, a
    function: the way a pickle runs code) is refused, naming it. torch 1.13's
    own weights_only unpickler does the same but stops at floats (opcode
    'G'), which every Lightning checkpoint holds (learning rates)."""
    import pickle
    import types

    allowed = {("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2"),
               ("torch._utils", "_rebuild_parameter"), ("torch", "Size"),
               ("torch._utils", "_rebuild_parameter_with_state"), ("builtins", "set"),
               ("builtins", "frozenset"), ("torch", "device")}

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) in allowed or (module == "torch" and name.endswith("Storage")):
                return super().find_class(module, name)
            raise pickle.UnpicklingError(f"it names {module}.{name}")

    mod = types.ModuleType("tilewise_restricted_pickle")
    mod.__dict__.update({k: v for k, v in pickle.__dict__.items() if not k.startswith("__")})
    mod.Unpickler = Unpickler
    mod.load = lambda f, **kw: Unpickler(f, **kw).load()
    return mod


def _torch_load(path, trust_pickle):
    import torch
    import torch.serialization as ser
    if trust_pickle:
        _say(f"{path}: read with the full unpickler (--trust-pickle): it may have run code")
        return torch.load(path, map_location="cpu")
    # torch 1.13's torch.load drops a pickle_module argument unless
    # weights_only (it sets pickle_module = pickle): the module its
    # serialization code names is swapped for the restricted one instead.
    saved = ser.pickle
    ser.pickle = _restricted_pickle()
    try:
        return torch.load(path, map_location="cpu")
    except Exception as e:  # UnpicklingError from ours, RuntimeError from torch
        why = str(e).strip().splitlines()
        why = why[-1] if why else type(e).__name__
        raise ExportError(
            "it holds Python objects beyond tensors and plain containers, which only the full "
            f"unpickler reads, and that runs code the file names ({why}); if you trust the "
            "file's source, run again with --trust-pickle")
    finally:
        ser.pickle = saved


def strip_layout(sd, path="checkpoint"):
    """name -> tensor of a ResNet from a checkpoint's tensors: strips a known
    prefix, leaves out tensors outside it, refuses unknown names (ExportError
    naming the first). Says what it did on stdout."""
    sd = {k: v for k, v in sd.items() if not k.endswith("num_batches_tracked")}
    prefix = ""
    if "conv1.weight" not in sd:
        # the longest chain of known prefixes under which a ResNet stem lies
        cands = [k[:-len("conv1.weight")] for k in sd if k.endswith("conv1.weight")]
        cands = [p for p in cands
                 if p and re.fullmatch(r"(%s)+" % "|".join(re.escape(x) for x in PREFIXES), p)]
        if cands:
            prefix = min(cands, key=lambda p: (len(p), p))
    inside = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    outside = [k for k in sd if not k.startswith(prefix)]
    for k in sd:
        if k.startswith(prefix) and not _RESNET_KEY.match(k[len(prefix):]):
            raise ExportError(
                f"tensor '{k}' is not part of a torchvision/timm ResNet (the first unexpected "
                f"key{', under prefix ' + repr(prefix) if prefix else ''}); known layouts: "
                "torchvision/timm names (conv1, bn1, layer1..4, fc), optionally under "
                + ", ".join(f"'{p}'" for p in PREFIXES))
    if "conv1.weight" not in inside:
        first = next(iter(sd), None)
        raise ExportError("no ResNet stem ('conv1.weight', under no prefix or one of "
                          + ", ".join(f"'{p}'" for p in PREFIXES) + ")"
                          + (f"; the first key is '{first}'" if first else ": no tensors"))
    if prefix:
        _say(f"prefix '{prefix}' stripped from {len(inside)} tensors")
    if outside:
        _say(f"{len(outside)} tensors outside '{prefix}' left out (not the ResNet), e.g. "
             f"'{outside[0]}'")
    return inside


def load_state_dict(path, trust_pickle=False):
    """name -> numpy array from a .pth/.pt/.ckpt or .safetensors checkpoint."""
    if path.endswith(".safetensors"):
        tensors, _ = safetensors_io.load(path)
        sd = tensors
    else:
        import torch
        obj = _torch_load(path, trust_pickle)
        if isinstance(obj, torch.nn.Module):
            obj = obj.state_dict()
        if isinstance(obj, dict):
            for key in WRAPPERS:
                if key in obj and isinstance(obj[key], (dict, torch.nn.Module)):
                    obj = obj[key]
                    if isinstance(obj, torch.nn.Module):
                        obj = obj.state_dict()
                    _say(f"tensors taken from the checkpoint's '{key}'")
                    break
        if not isinstance(obj, dict):
            raise ExportError("not a state_dict, a checkpoint dict or an nn.Module")
        sd = {k: v for k, v in obj.items() if hasattr(v, "detach")}
    sd = strip_layout(sd, path)
    return {k: _as_numpy(v) for k, v in sd.items()}


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
    if "conv1.weight" not in sd:
        raise ExportError("checkpoint has no 'conv1.weight': not a torchvision-layout ResNet")
    if ("fc.weight" in sd) != ("fc.bias" in sd):
        raise ExportError("checkpoint has 'fc.weight' or 'fc.bias' but not both")
    headless = "fc.weight" not in sd
    inferred = infer_arch(sd)
    if arch is None:
        arch = inferred
        _say(f"arch {arch} inferred from the tensors")
    elif arch != inferred:
        raise ExportError(f"--arch {arch} but the weights are a {inferred}")
    n_in = int(sd["conv1.weight"].shape[1])
    n_cls = 0 if headless else int(sd["fc.weight"].shape[0])
    if headless:
        feat = max(int(a.shape[0]) for k, a in sd.items() if k.startswith("layer4.")
                   and k.endswith(".weight") and a.ndim == 4)
        _say(f"no head (fc): a headless backbone of {feat} features; tilewise runs it with "
             "output.products: [embedding_raster]")
        if classes is not None:
            raise ExportError("--classes given but the checkpoint has no head (fc)")
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
    if classes is not None and not headless and len(classes) != n_cls:
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
    ap.add_argument("--trust-pickle", action="store_true",
                    help="read a checkpoint that holds Python objects with the full unpickler "
                         "(runs code the file names: trusted files only)")
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
            sd = load_state_dict(a.checkpoint, a.trust_pickle)
            export(sd, a.output, a.arch, bands, 1.0 if a.scale is None else a.scale, mean, std,
                   classes, a.tile, a.checkpoint)
    except (ExportError, OSError, ValueError, KeyError) as e:
        print(f"export_model.py: {a.checkpoint}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
