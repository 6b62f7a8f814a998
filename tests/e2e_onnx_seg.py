#!/usr/bin/python3
"""End to end: ONNX exports of the segmentation networks (issue 36; io/modelfile/
onnx_seg.c) load as the same nets model/segnet.c builds from a state_dict, and
run through tests/seg_forward against PyTorch.

The modules are e2e_seg_parity's (the same seeds, so the same weights: 4-band
conv1, 5 classes, batch norms drawn away from identity, logits spread), each
exported with torch.onnx.export (opset 17, Debian's torch; batch norm folded
into the convolutions by the exporter):

* torchvision deeplabv3_resnet50, 64 px (sizes fixed at export: the tile is
  the graph's); the same with dynamic H, W (the sizes computed from Shape /
  Gather / Unsqueeze / Concat / Cast, read at 100 px) and a Softmax appended;
* torchvision fcn_resnet50 (aux_loss=True): the export of its 'out' alone, and
  of 'out' and 'aux' both at opset 13 (the aux head is read and ignored);
* the U-Net-ResNet34 of e2e_seg_parity in SMP's layout (nearest x2 Resize with
  constant scales, Concat of [upsampled, skip]), 64 px; and its narrow
  U-Net-ResNet18 exported at opset 11, 64 px;
* the DeepLabV3 export with its ASPP pooling edited into ReduceMean over H, W.
Each must be detected as its arch and give PyTorch's probabilities within
1e-4. The tile comes from a real raster (the NAIP scene of e2e_seg_parity,
each band standardised over the window) when /work/shared/data is present,
else from a seeded synthetic 4-band field (smooth gradients plus noise); the
test prints which.

Hand-edited graphs are refused (exit 1 from seg_forward, the message naming the
node): an ASPP rate-24 conv with dilation 23, a backbone conv with the wrong
dilation, the final Resize made nearest, an ASPP Concat with two branches
swapped, an extra Relu between the logits and the Resize, an extra node off the
path, an extra reader of layer2's output, a foreign operator (Sigmoid), a
U-Net decoder Resize made linear, a U-Net Concat of [skip, upsampled], and
align_corners coordinates. Deepness's metadata keys (model_type Segmentor,
class_names as a Python dict, tiles_size, tiles_overlap, resolution,
standardization_mean/std) load with the graph; a tiles_overlap out of 0..99
and a tiles_size that is not the graph's fixed input are refused naming the key.
About 2-3 min on 2 idle cores (seven torch exports).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

from e2eutil import BIN, SRC, check
import e2e_seg_parity as sp

TOL = 1e-4


def tiles(tile, n=1):
    """n tiles (4 bands) from the real raster when present, else synthetic."""
    path = sp.raster_path()
    if path:
        return sp.read_tiles(path, tile, n), "real raster " + os.path.basename(path)
    rs = np.random.RandomState(7)
    yy, xx = np.mgrid[0:tile, 0:tile] / float(tile)
    out = []
    for _ in range(n):
        bands = [np.sin(3 * xx + b) + np.cos(2 * yy * (b + 1)) + 0.3 * rs.randn(tile, tile)
                 for b in range(4)]
        a = np.stack(bands)
        a = (a - a.mean(axis=(1, 2), keepdims=True)) / a.std(axis=(1, 2), keepdims=True)
        out.append(a)
    return np.stack(out).astype(np.float32), "synthetic 4-band field (shared data absent)"


class Out(__import__("torch").nn.Module):
    """A torchvision segmentation model's 'out' (optionally softmaxed), or
    with aux its 'out' and 'aux' both."""

    def __init__(self, m, softmax=False, aux=False):
        super().__init__()
        self.m = m
        self.softmax = softmax
        self.aux = aux

    def forward(self, x):
        import torch
        o = self.m(x)
        if self.aux:
            return o["out"], o["aux"]
        o = o["out"] if isinstance(o, dict) else o
        return torch.softmax(o, dim=1) if self.softmax else o


def export(m, x, path, dynamic=False, softmax=False, aux=False, opset=17):
    import torch
    kw = {}
    if dynamic:
        kw["dynamic_axes"] = {"input": {0: "n", 2: "h", 3: "w"}, "out": {0: "n", 2: "h", 3: "w"}}
    torch.onnx.export(Out(m, softmax, aux).eval(), torch.from_numpy(x), path, opset_version=opset,
                      input_names=["input"], output_names=["out"] + (["aux"] if aux else []),
                      **kw)
    m.eval()


def run(tmp, model, x):
    r, got = sp.seg_forward(tmp, model, x)
    return r, got


def edited(src, dst, edit):
    """src with edit(graph) applied, saved as dst; edit returns the name of
    the node the refusal must name."""
    import onnx
    m = onnx.load(src)
    name = edit(m.graph)
    onnx.save(m, dst)
    return name


def node_by(g, pred):
    return next(n for n in g.node if pred(n))


def attr(n, key):
    import onnx
    for a in n.attribute:
        if a.name == key:
            return onnx.helper.get_attribute_value(a)
    return None


def set_attr(n, key, value):
    import onnx
    for a in list(n.attribute):
        if a.name == key:
            n.attribute.remove(a)
    n.attribute.append(onnx.helper.make_attribute(key, value))


def conv_with_dilation(g, d):
    return node_by(g, lambda n: n.op_type == "Conv" and attr(n, "dilations") == [d, d])


def set_dilation(n, d):
    set_attr(n, "dilations", [d, d])
    set_attr(n, "pads", [d, d, d, d])


def final_resize(g):
    return [n for n in g.node if n.op_type == "Resize"][-1]


def swap_aspp(g):
    cat = node_by(g, lambda n: n.op_type == "Concat" and len(n.input) == 5)
    a, b = cat.input[1], cat.input[2]
    cat.input[1], cat.input[2] = b, a
    return cat.name


def relu_before_resize(g):
    import onnx
    rz = final_resize(g)
    src = rz.input[0]
    relu = onnx.helper.make_node("Relu", [src], ["extra_relu_out"], name="extra_relu")
    rz.input[0] = "extra_relu_out"
    idx = list(g.node).index(rz)
    g.node.insert(idx, relu)
    return "extra_relu"


def dangling_add(g):
    import onnx
    rz = final_resize(g)
    add = onnx.helper.make_node("Add", [rz.input[0], rz.input[0]], ["dangling"],
                                name="dangling_add")
    g.node.insert(list(g.node).index(rz), add)
    return "dangling_add"


def sigmoid_after(g):
    import onnx
    out = g.output[0].name
    last = node_by(g, lambda n: out in n.output)
    last.output[0] = "pre_sigmoid"
    g.node.append(onnx.helper.make_node("Sigmoid", ["pre_sigmoid"], [out], name="sigmoid_end"))
    return "sigmoid_end"


def to_reducemean(g):
    """The GlobalAveragePool made ReduceMean(axes [2, 3], keepdims 1)."""
    import onnx
    gap = node_by(g, lambda n: n.op_type == "GlobalAveragePool")
    rm = onnx.helper.make_node("ReduceMean", list(gap.input), list(gap.output), name=gap.name,
                               axes=[2, 3], keepdims=1)
    g.node.insert(list(g.node).index(gap), rm)
    g.node.remove(gap)
    return gap.name


def relu_on_layer2(g):
    """An extra Relu reading layer2's output (the last ReLU of layer2)."""
    import onnx
    n = [n for n in g.node if n.op_type == "Relu" and "layer2" in n.name][-1]
    g.node.insert(list(g.node).index(n) + 1,
                  onnx.helper.make_node("Relu", [n.output[0]], ["extra"], name="extra_relu2"))
    return "extra_relu2"


def add_metadata(path, dst, props):
    import onnx
    m = onnx.load(path)
    for k, v in props.items():
        e = m.metadata_props.add()
        e.key, e.value = k, v
    onnx.save(m, dst)


def refuse(tmp, model, x, node, what, words=()):
    r, _ = run(tmp, model, x)
    ok = r.returncode == 1 and f"'{node}'" in r.stderr and all(w in r.stderr for w in words)
    check(ok, f"{what}: refused naming node '{node}' ({r.stderr.strip()})", True)


def main():
    if not (SRC and BIN):
        print("TW_SOURCE_DIR/TW_BIN not set: skipped")
        return 77
    import torch
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        for name, tile, seed, arch, opset in (("deeplabv3", 64, 2, "deeplabv3_resnet50", 17),
                                              ("fcn", 64, 3, "fcn_resnet50", 17),
                                              ("unet", 64, 1, "unet_resnet34", 17),
                                              ("unet18_narrow", 64, 4, "unet_resnet18", 11)):
            x, src = tiles(tile)
            print(f"{name}: tile of {tile} px from the {src}, opset {opset}")
            m = sp.make(name, seed, x)
            path = os.path.join(tmp, name + ".onnx")
            export(m, x, path, opset=opset)
            want = sp.torch_probs(m, x)
            r, got = run(tmp, path, x)
            check(got is not None, f"{name}: seg_forward ran ({r.stderr.strip()})")
            check(r.stdout.split()[0] == arch, f"{name}: detected as {r.stdout.split()[0]}", True)
            diff = float(np.abs(got - want).max())
            check(diff <= TOL, f"{name} (ONNX): max |p - p_torch| = {diff:.3g} <= {TOL}", True)

            if name == "deeplabv3":
                # dynamic H, W and a Softmax: the sizes from Shape arithmetic, at 100 px
                dyn = os.path.join(tmp, "dl_dyn.onnx")
                export(m, x, dyn, dynamic=True, softmax=True)
                x100, _ = tiles(100)
                r, got = run(tmp, dyn, x100)
                check(got is not None, f"dynamic deeplabv3: ran ({r.stderr.strip()})")
                d = float(np.abs(got - sp.torch_probs(m, x100)).max())
                check(d <= TOL, f"deeplabv3 (dynamic, Softmax) at 100 px: {d:.3g} <= {TOL}", True)
                # the 64 px export at 100 px: model/segnet.c resizes to the tile it runs,
                # as the PyTorch module does (ONNX Runtime would keep the exported 64)
                r, got = run(tmp, path, x100)
                d = float(np.abs(got - sp.torch_probs(m, x100)).max()) if got is not None else 1
                check(d <= TOL, f"64 px export run at 100 px: the module's output, {d:.3g}", True)
                bad = os.path.join(tmp, "bad.onnx")
                for what, edit, words in (
                        ("ASPP rate 24 as 23",
                         lambda g: (lambda n: (set_dilation(n, 23), n.name)[1])(
                             conv_with_dilation(g, 24)), ("dilation 23", "rate 24")),
                        ("backbone layer4 conv2 dilation 2 for 4",
                         lambda g: (lambda n: (set_dilation(n, 2), n.name)[1])(
                             conv_with_dilation(g, 4)), ("dilation 2",)),
                        ("final Resize nearest",
                         lambda g: (lambda n: (set_attr(n, "mode", b"nearest"), n.name)[1])(
                             final_resize(g)), ("mode = 'nearest'",)),
                        ("align_corners",
                         lambda g: (lambda n: (set_attr(n, "coordinate_transformation_mode",
                                                        b"align_corners"), n.name)[1])(
                             final_resize(g)), ("align_corners",)),
                        ("ASPP branches swapped", swap_aspp, ("order",)),
                        ("extra Relu before the Resize", relu_before_resize, ()),
                        ("extra node off the path", dangling_add, ()),
                        ("extra Relu on layer2's output", relu_on_layer2, ("layer2.3",)),
                        ("foreign Sigmoid", sigmoid_after, ("not part of",))):
                    node = edited(path, bad, edit)
                    refuse(tmp, bad, x, node, what, words)
                # the pooling branch as ReduceMean over H, W (other converters write it so)
                rm = os.path.join(tmp, "dl_reducemean.onnx")
                edited(path, rm, to_reducemean)
                r, got = run(tmp, rm, x)
                d = float(np.abs(got - want).max()) if got is not None else 1
                check(d <= TOL, f"ASPP pooling as ReduceMean: {d:.3g} <= {TOL} "
                      f"({r.stderr.strip()})", True)
                # Deepness's metadata
                meta = os.path.join(tmp, "meta.onnx")
                props = {"model_type": '"Segmentor"',
                         "class_names": "{0: 'water', 1: 'forest', 2: 'field', 3: 'urban', "
                                        "4: 'bare'}",
                         "resolution": "60", "tiles_size": "64", "tiles_overlap": "25",
                         "standardization_mean": "[0.1, 0.2, 0.3, 0.4]",
                         "standardization_std": "[0.5, 0.5, 0.5, 0.5]"}
                add_metadata(path, meta, props)
                r, got = run(tmp, meta, x)
                check(got is not None and float(np.abs(got - want).max()) <= TOL,
                      f"Deepness metadata: loads, same probabilities ({r.stderr.strip()})", True)
                exe = os.path.join(os.path.dirname(BIN), "seg_forward")
                r = subprocess.run([exe, meta, "64", "0", "-", "-"], capture_output=True, text=True)
                facts = r.stdout.splitlines()[-1].split() if r.returncode == 0 else []
                want_facts = ["tile", "64", "classes", "5", "water", "mean", "0.1", "std", "0.5",
                              "scale", "0.00392157", "overlap", "25", "type", "Segmentor"]
                check(facts == want_facts, f"Deepness metadata read into the model file's facts "
                      f"({r.stdout.strip()} {r.stderr.strip()})", True)
                for key, val, word in (("tiles_overlap", "100", "tiles_overlap"),
                                       ("tiles_size", "96", "tiles_size")):
                    add_metadata(path, meta, dict(props, **{key: val}))
                    r, _ = run(tmp, meta, x)
                    check(r.returncode == 1 and f"'{word}'" in r.stderr,
                          f"metadata {key} = {val} refused naming it ({r.stderr.strip()})", True)
            if name == "fcn":
                # aux_loss on, both outputs exported (opset 11: an empty scales tensor beside
                # the sizes): aux_classifier read and ignored
                both = os.path.join(tmp, "fcn_aux.onnx")
                export(m, x, both, aux=True, opset=11)
                r, got = run(tmp, both, x)
                d = float(np.abs(got - want).max()) if got is not None else 1
                check(d <= TOL, f"fcn with its aux output (opset 11): {d:.3g} <= {TOL} "
                      f"({r.stderr.strip()})", True)
            if name == "unet":
                bad = os.path.join(tmp, "bad.onnx")
                node = edited(path, bad, lambda g: (lambda n: (set_attr(n, "mode", b"linear"),
                                                               n.name)[1])(
                    node_by(g, lambda n: n.op_type == "Resize")))
                refuse(tmp, bad, x, node, "U-Net decoder Resize linear", ("nearest",))
                node = edited(path, bad, lambda g: (lambda n: (
                    n.input.__setitem__(slice(None), [n.input[1], n.input[0]]), n.name)[1])(
                    node_by(g, lambda n: n.op_type == "Concat")))
                refuse(tmp, bad, x, node, "U-Net Concat [skip, upsampled]", ("concatenates",))
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
