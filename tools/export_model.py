#!/usr/bin/python3
"""Export a PyTorch ResNet or segmentation checkpoint to the tilewise HDF5 bundle.

    export_model.py CHECKPOINT -o OUT.h5 [--arch resnet18] [--bands 1,2,3]
                    [--scale S] [--mean m1,m2,..] [--std s1,s2,..]
                    [--classes a,b,c] [--tile 64] [--stride 32]

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

Segmentation checkpoints (issue 36): torchvision's fcn_resnet50/101 and
deeplabv3_resnet50/101 state_dicts (backbone.*, classifier.*; aux_classifier.*,
which tilewise ignores, is left out), and a U-Net with a ResNet-18/34/50/101
encoder in segmentation_models_pytorch's layout (encoder.*,
decoder.blocks.N.conv1/conv2.{0,1}.*, segmentation_head.0.*), as saved or
inside a Lightning/TorchGeo checkpoint ('state_dict', keys under 'model.' or
another of 'module.', 'model.', 'net.'; tensors outside it, such as a loss's
class weights, are left out). The arch (fcn_resnet50, deeplabv3_resnet101,
unet_resnet34, ...) comes from the tensors; --arch, when given, must agree.
A U-Net's --tile must be a multiple of 32. A segmentation bundle records a
default stride: --stride, else tile/2 (tiles overlapping by half, blended).
A tensor name outside the layout is refused, naming the first.

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


_BN = r"(weight|bias|running_mean|running_var)"
# a ResNet without its fc: the encoder of every segmentation layout
_BODY = (r"(conv1\.weight|bn1\.%s|layer[1-4]\.\d+\.(conv[1-3]\.weight|bn[1-3]\.%s|"
         r"downsample\.0\.weight|downsample\.1\.%s))" % (_BN, _BN, _BN))
# Every tensor name of each segmentation layout (model/segnet.c reads these).
_SEG_KEY = {
    "fcn": re.compile(r"^(backbone\.%s|classifier\.(0\.weight|1\.%s|4\.(weight|bias))|"
                      r"aux_classifier\.(0\.weight|1\.%s|4\.(weight|bias)))$" % (_BODY, _BN, _BN)),
    "deeplabv3": re.compile(
        r"^(backbone\.%s|classifier\.(0\.convs\.[0-3]\.0\.weight|0\.convs\.[0-3]\.1\.%s|"
        r"0\.convs\.4\.1\.weight|0\.convs\.4\.2\.%s|0\.project\.0\.weight|0\.project\.1\.%s|"
        r"1\.weight|2\.%s|4\.(weight|bias))|"
        r"aux_classifier\.(0\.weight|1\.%s|4\.(weight|bias)))$" % ((_BODY,) + (_BN,) * 5)),
    "unet": re.compile(r"^(encoder\.%s|decoder\.blocks\.\d+\.conv[12]\.0\.weight|"
                       r"decoder\.blocks\.\d+\.conv[12]\.1\.%s|segmentation_head\.0\.(weight|bias))$"
                       % (_BODY, _BN)),
}
_SEG_LAYOUT = {
    "fcn": "torchvision fcn_resnet (backbone.*, classifier.0/1/4, aux_classifier.*)",
    "deeplabv3": "torchvision deeplabv3_resnet (backbone.*, classifier.0.convs/project, "
                 "classifier.1/2/4, aux_classifier.*)",
    "unet": "segmentation_models_pytorch Unet (encoder.*, decoder.blocks.N.conv1/conv2.{0,1}, "
            "segmentation_head.0)",
}
# what the encoder may be, per layout (model/segnet.h)
_SEG_DEPTHS = {"fcn": ("resnet50", "resnet101"), "deeplabv3": ("resnet50", "resnet101"),
               "unet": ("resnet18", "resnet34", "resnet50", "resnet101")}
SEG_ARCHS = sorted(f"{k}_{d}" for k, ds in _SEG_DEPTHS.items() for d in ds)
# prefixes a segmentation model's own names may sit under (its 'backbone.' and
# 'encoder.' are part of its layout)
SEG_PREFIXES = ("module.", "model.", "net.")


def seg_kind(sd):
    """'fcn', 'deeplabv3' or 'unet' when sd (prefix stripped) holds a
    segmentation model's stem and head, else None (a ResNet classifier)."""
    if "backbone.conv1.weight" in sd:
        if any(k.startswith("classifier.0.convs.") for k in sd):
            return "deeplabv3"
        if "classifier.4.weight" in sd:
            return "fcn"
    if "encoder.conv1.weight" in sd and any(k.startswith("decoder.blocks.") for k in sd):
        return "unet"
    return None


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
    seg = _strip_seg(sd)
    if seg is not None:
        return seg
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


def _strip_seg(sd):
    """A segmentation model's tensors from sd, its prefix stripped, tensors
    outside the prefix and aux_classifier.* left out; None when sd holds no
    segmentation model. Refuses a name inside the prefix that the layout does
    not have (ExportError naming the first)."""
    chain = r"(%s)*" % "|".join(re.escape(x) for x in SEG_PREFIXES)
    cands = []
    for k in sd:
        for root in ("backbone.conv1.weight", "encoder.conv1.weight"):
            p = k[:-len(root)]
            if k.endswith(root) and re.fullmatch(chain, p):
                inner = {n[len(p):]: None for n in sd if n.startswith(p)}
                if seg_kind(inner):
                    cands.append(p)
    if not cands:
        return None
    prefix = min(cands, key=lambda p: (len(p), p))
    inside = {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}
    kind = seg_kind(inside)
    for k in inside:
        if not _SEG_KEY[kind].match(k):
            raise ExportError(
                f"tensor '{prefix}{k}' is not part of a {_SEG_LAYOUT[kind]} (the first unexpected "
                f"key{', under prefix ' + repr(prefix) if prefix else ''})")
    outside = [k for k in sd if not k.startswith(prefix)]
    if prefix:
        _say(f"prefix '{prefix}' stripped from {len(inside)} tensors")
    if outside:
        _say(f"{len(outside)} tensors outside '{prefix}' left out (not the model), e.g. "
             f"'{outside[0]}'")
    aux = [k for k in inside if k.startswith("aux_classifier.")]
    if aux:
        _say(f"{len(aux)} aux_classifier tensors left out (a training head tilewise ignores)")
    return {k: v for k, v in inside.items() if not k.startswith("aux_classifier.")}


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
                "stride": int(a["stride"]) if "stride" in a else None,
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


def _seg_facts(sd, kind, arch):
    """(arch, bands, classes) of a segmentation model's tensors (layout
    checked by _strip_seg), or raise ExportError."""
    pre = "encoder." if kind == "unet" else "backbone."
    body = {k[len(pre):]: v for k, v in sd.items() if k.startswith(pre)}
    depth = infer_arch(body)
    if depth not in _SEG_DEPTHS[kind]:
        raise ExportError(f"a {kind} on a {depth} encoder is not one tilewise builds (encoders: "
                          + ", ".join(_SEG_DEPTHS[kind]) + ")")
    inferred = f"{kind}_{depth}"
    if arch is None:
        _say(f"arch {inferred} inferred from the tensors")
    elif arch != inferred:
        raise ExportError(f"--arch {arch} but the weights are a {inferred}")
    last = "segmentation_head.0.weight" if kind == "unet" else "classifier.4.weight"
    if last not in sd:
        raise ExportError(f"no tensor '{last}': the {kind}'s last convolution (the classes)")
    return inferred, int(sd[pre + "conv1.weight"].shape[1]), int(sd[last].shape[0])


def _resnet_facts(sd, arch, classes):
    """(arch, bands, classes or 0 when headless) of a ResNet's tensors."""
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
    if headless:
        feat = max(int(a.shape[0]) for k, a in sd.items() if k.startswith("layer4.")
                   and k.endswith(".weight") and a.ndim == 4)
        _say(f"no head (fc): a headless backbone of {feat} features; tilewise runs it with "
             "output.products: [embedding_raster]")
        if classes is not None:
            raise ExportError("--classes given but the checkpoint has no head (fc)")
    n_cls = 0 if headless else int(sd["fc.weight"].shape[0])
    return arch, int(sd["conv1.weight"].shape[1]), n_cls


def _check_tiling(kind, tile, stride):
    """The stride a bundle records (None: none) after checking tile and stride."""
    if tile is not None and tile < 32:
        raise ExportError(f"--tile {tile}: a ResNet needs at least 32 pixels")
    if kind == "unet" and tile is not None and tile % 32:
        raise ExportError(f"--tile {tile}: a U-Net's tile must be a multiple of 32 (its encoder "
                          "halves the tile five times and the decoder doubles it back)")
    if stride is not None:
        if stride < 1:
            raise ExportError(f"--stride {stride} must be at least 1")
        if tile is None:
            raise ExportError("--stride needs --tile (the stride is a default for that tile)")
        if stride > tile:
            raise ExportError(f"--stride {stride} is larger than --tile {tile} (gaps)")
        if kind is None and tile % stride:
            raise ExportError(f"--stride {stride} does not divide --tile {tile} (a classifier's "
                              "output cells are stride pixels)")
    elif kind is not None and tile is not None:
        stride = tile // 2
        _say(f"default stride {stride} (tile/2: tiles overlap by half and are blended)")
    return stride


def export(sd, out, arch=None, bands=None, scale=1.0, mean=None, std=None,
           classes=None, tile=None, source=None, stride=None):
    """Validate sd (name -> array) and the metadata, then write the bundle to out.
    sd is a ResNet's tensors (torchvision names) or a segmentation model's
    (what strip_layout returns: backbone./classifier. or encoder./decoder.)."""
    import h5py
    kind = seg_kind(sd)
    if kind is not None:
        sd = {k: v for k, v in sd.items() if not k.startswith("aux_classifier.")}
        bad = next((k for k in sd if not _SEG_KEY[kind].match(k)), None)
        if bad is not None:
            raise ExportError(f"tensor '{bad}' is not part of a {_SEG_LAYOUT[kind]}"
                              " (the first unexpected key)")
        arch, n_in, n_cls = _seg_facts(sd, kind, arch)
        headless = False
    else:
        arch, n_in, n_cls = _resnet_facts(sd, arch, classes)
        headless = n_cls == 0
    if bands is None:
        bands = list(range(1, n_in + 1))
    if len(bands) != n_in:
        stem = "conv1.weight" if kind is None else (
            "encoder" if kind == "unet" else "backbone") + ".conv1.weight"
        raise ExportError(f"--bands lists {len(bands)} bands but {stem} takes {n_in}")
    if any(b < 1 for b in bands):
        raise ExportError("--bands are 1-based")
    for what, v in (("mean", mean), ("std", std)):
        if v is not None and len(v) != n_in:
            raise ExportError(f"--{what} has {len(v)} values but the model takes {n_in} bands")
    if std is not None and any(s <= 0 for s in std):
        raise ExportError("--std values must be > 0")
    if classes is not None and not headless and len(classes) != n_cls:
        head = "fc.weight" if kind is None else (
            "segmentation_head.0.weight" if kind == "unet" else "classifier.4.weight")
        raise ExportError(f"--classes names {len(classes)} classes but {head} has {n_cls}")
    stride = _check_tiling(kind, tile, stride)
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
        if kind is None:
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
        if stride is not None:
            f.attrs["stride"] = np.int32(stride)
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
        "wide_resnet101_2"] + SEG_ARCHS)
    ap.add_argument("--bands", help="1-based band numbers, comma separated")
    ap.add_argument("--scale", type=float, help="default 1.0 (a bundle's own)")
    ap.add_argument("--mean")
    ap.add_argument("--std")
    ap.add_argument("--classes", help="class names, comma separated")
    ap.add_argument("--tile", type=int)
    ap.add_argument("--stride", type=int,
                    help="the default tiling.stride; a segmentation model's is tile/2 unless given")
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
                   old["source"], a.stride or (old["stride"] if not a.tile else None))
        else:
            sd = load_state_dict(a.checkpoint, a.trust_pickle)
            export(sd, a.output, a.arch, bands, 1.0 if a.scale is None else a.scale, mean, std,
                   classes, a.tile, a.checkpoint, a.stride)
    except (ExportError, OSError, ValueError, KeyError) as e:
        print(f"export_model.py: {a.checkpoint}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
