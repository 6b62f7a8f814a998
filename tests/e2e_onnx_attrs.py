#!/usr/bin/python3
"""ONNX attributes honoured or refused, external data kept in the model's
folder (issue 39, item 4), through the CLI.

Graphs: the tiny ResNet-18 of fuzz/make_seeds.py (6 bands, 4 classes, widths
2-16, 32 px), as torch.onnx.export lays it out, with one attribute changed.

* Refused: every attribute of an accepted op that ONNX does not define for
  it at the model's opset, of the wrong type, or of a value tilewise does not
  run (Gemm alpha=3 as an INT, transA, MaxPool ceil_mode / dilations /
  storage_order / auto_pad, Conv dilations / asymmetric pads / SAME padding
  at stride 2, BatchNormalization training_mode, Flatten axis, Softmax axis,
  ReduceMean keepdims, Reshape allowzero with a 0 in its shape, a Constant's
  value_ints, a Relu or Add with an attribute): `tilewise info` exits 3 with
  one line naming the node (name and op type), the attribute and its value.
* Honoured: Gemm alpha=3.0, beta=7.0 (folded into fc), transB=0 with the
  weights stored [C, K], BatchNormalization momentum, Conv auto_pad
  SAME_UPPER at stride 1: `tilewise run` gives the probabilities of a
  float64 evaluation of the same ONNX graph (torch.nn.functional, each
  attribute as the ONNX operator documents it; onnx 1.12 has no
  onnx.reference) within 1e-5, on a 64 x 64 random raster (4 tiles).
* External data: a link out of the model's folder (to a copy of the real
  data, to /etc/passwd), ".." in the location, an absolute location: exit 3,
  "outside the model's folder", and nothing of the target (its size) in the
  message; a link to a folder and a FIFO: "is not a regular file" (the FIFO
  neither blocks nor is opened); a link that stays inside the folder, and a
  model reached through a linked folder, load.
"""
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

from e2eutil import BIN, SRC, check, gdal_or_skip

EXIT_MODEL = 3
TOL = 1e-5
TILE = 32
BANDS = 6


def tiny_blob(opset=17, bn_nodes=True, head="gemm"):
    sys.path.insert(0, os.path.join(SRC, "fuzz"))
    import make_seeds
    sd = make_seeds.tiny_resnet(np.random.default_rng(39), bands=BANDS, classes=4, width=2)
    # standard normal weights: scaled by fan-in so that the logits stay near 1 and the
    # probabilities away from 0 and 1 (a comparison of saturated ones would be blind)
    for k, w in sd.items():
        if k.endswith("conv1.weight") or k.endswith("conv2.weight") or ".downsample.0" in k:
            sd[k] = (w / np.sqrt(w[0].size)).astype(np.float32)
    sd["fc.weight"] = (sd["fc.weight"] * 0.2).astype(np.float32)
    return make_seeds.onnx_resnet(sd, bn_nodes=bn_nodes, head=head, opset=opset)


def nodes(g, op):
    return [n for n in g.node if n.op_type == op]


def set_attr(n, name, value, kind=None):
    """Node n's attribute name set to value (replacing one there); kind forces
    the ONNX type (onnx.helper infers INT for 3, FLOAT for 3.0)."""
    from onnx import AttributeProto, helper
    for a in list(n.attribute):
        if a.name == name:
            n.attribute.remove(a)
    a = helper.make_attribute(name, value)
    if kind is not None:
        a.type = getattr(AttributeProto, kind)
    n.attribute.append(a)


def del_attr(n, name):
    for a in list(n.attribute):
        if a.name == name:
            n.attribute.remove(a)


def info(path):
    return subprocess.run([BIN, "info", path], capture_output=True, text=True, timeout=60)


def expect_refused(path, want, label, hidden=()):
    r = info(path)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    ok = (r.returncode == EXIT_MODEL and len(lines) == 1 and want in r.stderr
          and not any(h in r.stderr for h in hidden))
    check(ok, f"{label}: exit {r.returncode} (expected {EXIT_MODEL}), '{r.stderr.strip()}' "
          f"(expected one line with '{want}'{' and none of ' + str(hidden) if hidden else ''})")
    print(f"ok   {label}: exit {EXIT_MODEL}, '...{want}...'")


# ---------------------------------------------------------------------------
# A float64 evaluation of the graph, each attribute as the ONNX operators say.

def evaluate(model, x):
    import torch
    import torch.nn.functional as F
    from onnx import helper, numpy_helper
    env = {t.name: torch.from_numpy(numpy_helper.to_array(t).astype(np.float64)
                                    if numpy_helper.to_array(t).dtype != np.int64
                                    else numpy_helper.to_array(t))
           for t in model.graph.initializer}
    env[model.graph.input[0].name] = torch.from_numpy(x)
    for n in model.graph.node:
        a = {at.name: helper.get_attribute_value(at) for at in n.attribute}
        i = [env[v] if v else None for v in n.input]
        op = n.op_type
        if op in ("Conv", "MaxPool"):
            k = a["kernel_shape"] if op == "MaxPool" else list(i[1].shape[2:])
            s = a.get("strides", [1, 1])
            d = a.get("dilations", [1, 1])
            ap = a.get("auto_pad", b"NOTSET").decode()
            if ap in ("SAME_UPPER", "SAME_LOWER"):
                pads = []
                for ax in range(2):
                    size = i[0].shape[2 + ax]
                    total = max((math.ceil(size / s[ax]) - 1) * s[ax] + (k[ax] - 1) * d[ax] + 1
                                - size, 0)
                    lo = total // 2 if ap == "SAME_UPPER" else total - total // 2
                    pads.append((lo, total - lo))
                pb = [pads[0][0], pads[1][0], pads[0][1], pads[1][1]]
            else:
                pb = a.get("pads", [0, 0, 0, 0])
            val = -math.inf if op == "MaxPool" else 0.0
            xp = F.pad(i[0], (pb[1], pb[3], pb[0], pb[2]), value=val)
            if op == "Conv":
                y = F.conv2d(xp, i[1], i[2] if len(i) > 2 else None, s, 0, d, a.get("group", 1))
            else:
                y = F.max_pool2d(xp, k, s, 0, d, ceil_mode=bool(a.get("ceil_mode", 0)))
        elif op == "BatchNormalization":
            y = F.batch_norm(i[0], i[3], i[4], i[1], i[2], False, 0.0, a.get("epsilon", 1e-5))
        elif op == "Relu":
            y = torch.relu(i[0])
        elif op == "Add":
            y = i[0] + i[1]
        elif op == "GlobalAveragePool":
            y = i[0].mean(dim=(2, 3), keepdim=True)
        elif op == "Flatten":
            y = torch.flatten(i[0], a.get("axis", 1))
        elif op == "Gemm":
            A = i[0].T if a.get("transA", 0) else i[0]
            B = i[1].T if a.get("transB", 0) else i[1]
            y = a.get("alpha", 1.0) * (A @ B)
            if len(i) > 2 and i[2] is not None:
                y = y + a.get("beta", 1.0) * i[2]
        elif op == "Softmax":
            y = torch.softmax(i[0], a.get("axis", -1))
        else:
            raise RuntimeError("evaluate: no " + op)
        env[n.output[0]] = y
    return env[model.graph.output[0].name].numpy()


def run_probs(gdal, tmp, name, weights, raster):
    wf, out = os.path.join(tmp, name + ".yaml"), os.path.join(tmp, name)
    with open(wf, "w") as f:
        f.write(f"""input:
  path: {raster}
model:
  weights: {weights}
  mean: {[0.0] * BANDS}
  std: {[1.0] * BANDS}
tiling:
  tile: {TILE}
runtime:
  device: cpu
  memory: 512MiB
output:
  dir: {out}
  products: [prob]
""")
    r = subprocess.run([BIN, "run", wf, "-q"], capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"run {name}: exit {r.returncode}: {r.stderr}")
    ds = gdal.Open(os.path.join(out, "rand.prob.tif"))
    p = ds.ReadAsArray().astype(np.float64)
    return np.moveaxis(p, 0, -1).reshape(-1, p.shape[0])


def main():
    gdal = gdal_or_skip()
    if gdal is None:
        return 77
    import onnx
    from onnx import helper, numpy_helper
    import torch
    torch.set_num_threads(2)
    base = tiny_blob()

    with tempfile.TemporaryDirectory() as tmp:
        def variant(name, change, blob=base):
            m = onnx.load_model_from_string(blob)
            change(m.graph)
            p = os.path.join(tmp, name + ".onnx")
            onnx.save(m, p)
            return p, m

        # -- refused ------------------------------------------------------------------
        first = lambda g, op: nodes(g, op)[0]  # noqa: E731
        conv3 = lambda g: nodes(g, "Conv")[1]  # noqa: E731  layer1.0.conv1: 3x3 stride 1
        cases = [
            ("gemm_alpha_int", lambda g: set_attr(first(g, "Gemm"), "alpha", 3),
             "node 'fc' (Gemm) has attribute alpha = 3 of type INT (Gemm's alpha is of type "
             "FLOAT)"),
            ("gemm_beta_int", lambda g: set_attr(first(g, "Gemm"), "beta", 7),
             "node 'fc' (Gemm) has attribute beta = 7 of type INT"),
            ("gemm_alpha_inf", lambda g: set_attr(first(g, "Gemm"), "alpha", math.inf),
             "node 'fc' (Gemm) has attribute alpha = inf"),
            ("gemm_transA", lambda g: set_attr(first(g, "Gemm"), "transA", 1),
             "node 'fc' (Gemm) has attribute transA = 1 (tilewise runs transA = 0 only)"),
            ("gemm_transB2", lambda g: set_attr(first(g, "Gemm"), "transB", 2),
             "node 'fc' (Gemm) has attribute transB = 2"),
            ("gemm_broadcast", lambda g: set_attr(first(g, "Gemm"), "broadcast", 1),
             "node 'fc' (Gemm) has attribute broadcast = 1, which Gemm does not define at "
             "opset 17"),
            ("maxpool_ceil", lambda g: set_attr(first(g, "MaxPool"), "ceil_mode", 1),
             "(MaxPool) has attribute ceil_mode = 1 (tilewise runs ceil_mode = 0 only)"),
            ("maxpool_dilations", lambda g: set_attr(first(g, "MaxPool"), "dilations", [2, 2]),
             "(MaxPool) has attribute dilations = [2, 2]"),
            ("maxpool_storage", lambda g: set_attr(first(g, "MaxPool"), "storage_order", 1),
             "(MaxPool) has attribute storage_order = 1"),
            ("maxpool_same", lambda g: set_attr(first(g, "MaxPool"), "auto_pad", "SAME_UPPER"),
             "(MaxPool) has attribute auto_pad = 'SAME_UPPER'"),
            ("maxpool_pads", lambda g: set_attr(first(g, "MaxPool"), "pads", [1, 1, 2, 2]),
             "(MaxPool) has attribute pads = [1, 1, 2, 2]"),
            ("maxpool_kernel", lambda g: set_attr(first(g, "MaxPool"), "kernel_shape", [2, 2]),
             "(MaxPool) has attribute kernel_shape = [2, 2]"),
            ("conv_dilations", lambda g: set_attr(conv3(g), "dilations", [2, 2]),
             "(Conv) has attribute dilations = [2, 2]"),
            ("conv_pads", lambda g: set_attr(conv3(g), "pads", [1, 1, 0, 0]),
             "(Conv) has attribute pads = [1, 1, 0, 0]"),
            ("conv_group_float", lambda g: set_attr(conv3(g), "group", 1.0),
             "(Conv) has attribute group = 1 of type FLOAT (Conv's group is of type INT)"),
            ("conv_same_stride2", lambda g: (del_attr(first(g, "Conv"), "pads"),
                                             set_attr(first(g, "Conv"), "auto_pad", "SAME_UPPER")),
             "(Conv) has attribute auto_pad = 'SAME_UPPER' at stride 2"),
            ("conv_unknown", lambda g: set_attr(conv3(g), "foo", 1),
             "(Conv) has attribute foo = 1, which Conv does not define at opset 17"),
            ("conv_twice", lambda g: conv3(g).attribute.append(helper.make_attribute("group", 1)),
             "(Conv) has attribute group twice"),
            ("bn_training", lambda g: set_attr(first(g, "BatchNormalization"), "training_mode", 1),
             "(BatchNormalization) has attribute training_mode = 1"),
            ("bn_spatial17", lambda g: set_attr(first(g, "BatchNormalization"), "spatial", 0),
             "(BatchNormalization) has attribute spatial = 0, which BatchNormalization does "
             "not define at opset 17"),
            ("bn_epsilon", lambda g: set_attr(first(g, "BatchNormalization"), "epsilon", -1.0),
             "(BatchNormalization) has attribute epsilon = -1"),
            ("flatten_axis", lambda g: set_attr(first(g, "Flatten"), "axis", 2),
             "node 'flat' (Flatten) has attribute axis = 2"),
            ("relu_alpha", lambda g: set_attr(first(g, "Relu"), "alpha", 0.1),
             "(Relu) has attribute alpha = 0.1, which Relu does not define"),
            ("add_broadcast", lambda g: set_attr(first(g, "Add"), "broadcast", 1),
             "(Add) has attribute broadcast = 1, which Add does not define"),
        ]
        for name, change, want in cases:
            p, _ = variant(name, change)
            expect_refused(p, want, name)

        # other heads: Softmax axis, ReduceMean keepdims, Reshape allowzero, Constant value_ints
        mm = tiny_blob(head="matmul")
        p, _ = variant("softmax_axis", lambda g: set_attr(first(g, "Softmax"), "axis", 0), mm)
        expect_refused(p, "node 'softmax' (Softmax) has attribute axis = 0", "softmax_axis")
        p, _ = variant("reducemean_keep", lambda g: set_attr(first(g, "ReduceMean"), "keepdims",
                                                             2), mm)
        expect_refused(p, "(ReduceMean) has attribute keepdims = 2", "reducemean_keepdims")

        def reshape_head(allowzero, const_ints):
            def change(g):
                fl = first(g, "Flatten")
                extra = {"allowzero": 1} if allowzero else {}
                k = list(g.node).index(fl)
                if const_ints:
                    g.node.insert(k, helper.make_node("Constant", [], ["shape"], "shape_c",
                                                      value_ints=[0, -1]))
                else:
                    g.initializer.append(numpy_helper.from_array(np.array([0, -1], np.int64),
                                                                 "shape"))
                g.node.remove(fl)
                g.node.insert(k + const_ints, helper.make_node(
                    "Reshape", [fl.input[0], "shape"], [fl.output[0]], "flat", **extra))
            return change
        p, _ = variant("reshape_allowzero", reshape_head(True, False))
        expect_refused(p, "node 'flat' (Reshape) has attribute allowzero = 1 with shape [0, -1]",
                       "reshape_allowzero")
        p, _ = variant("constant_ints", reshape_head(False, True))
        expect_refused(p, "node 'shape_c' (Constant) has attribute value_ints = [0, -1] "
                       "(tilewise reads a Constant's tensor 'value' only)", "constant_value_ints")
        p, _ = variant("reshape_ok", reshape_head(False, False))
        check(info(p).returncode == 0, "Reshape [0, -1] (allowzero absent) loads", say_ok=True)

        # the opset decides what is defined: ceil_mode arrived with MaxPool-10, spatial left
        # with BatchNormalization-9 (at opset 8 it must be 1)
        p, _ = variant("ceil_opset9", lambda g: set_attr(first(g, "MaxPool"), "ceil_mode", 0),
                       tiny_blob(opset=9))
        expect_refused(p, "has attribute ceil_mode = 0, which MaxPool does not define at opset 9",
                       "ceil_mode at opset 9")
        o8 = tiny_blob(opset=8)
        p, _ = variant("spatial0_opset8",
                       lambda g: set_attr(first(g, "BatchNormalization"), "spatial", 0), o8)
        expect_refused(p, "has attribute spatial = 0 (tilewise runs spatial = 1 only)",
                       "spatial 0 at opset 8")
        p, _ = variant("spatial1_opset8",
                       lambda g: set_attr(first(g, "BatchNormalization"), "spatial", 1), o8)
        check(info(p).returncode == 0, "BatchNormalization spatial = 1 at opset 8 loads",
              say_ok=True)

        # -- honoured: equal to a float64 evaluation of the graph ------------------------
        raster = os.path.join(tmp, "rand.tif")
        rng = np.random.default_rng(4)
        img = rng.standard_normal((BANDS, 64, 64)).astype(np.float32)
        ds = gdal.GetDriverByName("GTiff").Create(raster, 64, 64, BANDS, gdal.GDT_Float32)
        for b in range(BANDS):
            ds.GetRasterBand(b + 1).WriteArray(img[b])
        ds = None
        tiles = np.stack([img[:, y:y + TILE, x:x + TILE] for y in (0, TILE)
                          for x in (0, TILE)]).astype(np.float64)

        def softmax(z):
            e = np.exp(z - z.max(-1, keepdims=True))
            return e / e.sum(-1, keepdims=True)

        def transposed_fc(g):
            gm = first(g, "Gemm")
            set_attr(gm, "transB", 0)
            for t in g.initializer:
                if t.name == gm.input[1]:
                    t.CopyFrom(numpy_helper.from_array(
                        np.ascontiguousarray(numpy_helper.to_array(t).T), t.name))

        def same_upper(g):  # every 3x3 stride-1 convolution: SAME_UPPER instead of pads 1
            for n in nodes(g, "Conv"):
                at = {a.name: helper.get_attribute_value(a) for a in n.attribute}
                if at["kernel_shape"] == [3, 3] and at["strides"] == [1, 1]:
                    del_attr(n, "pads")
                    set_attr(n, "auto_pad", "SAME_UPPER")

        _, plain = variant("plain", lambda g: None)
        ref_plain = softmax(evaluate(plain, tiles))
        honoured = [
            ("gemm_alpha3", lambda g: set_attr(first(g, "Gemm"), "alpha", 3.0)),
            ("gemm_beta7", lambda g: set_attr(first(g, "Gemm"), "beta", 7.0)),
            ("gemm_transB0", transposed_fc),
            ("bn_momentum", lambda g: set_attr(first(g, "BatchNormalization"), "momentum", 0.3)),
            ("conv_same_upper", same_upper),
        ]
        for name, change in honoured:
            p, m = variant(name, change)
            ref = softmax(evaluate(m, tiles))
            got = run_probs(gdal, tmp, name, p, raster)
            d = float(np.abs(got - ref).max())
            check(d <= TOL and (got.argmax(-1) == ref.argmax(-1)).all(),
                  f"{name}: tilewise vs the graph evaluated in float64: max |diff| {d:.2e} "
                  f"(tolerance {TOL:g})", say_ok=True)
            if name in ("gemm_alpha3", "gemm_beta7"):
                check(np.abs(ref - ref_plain).max() > 1e-3,
                      f"{name}: the attribute changes the probabilities", say_ok=True)

        # -- external data -------------------------------------------------------------
        def ext_model(folder, location="w.data"):
            """The tiny net in folder/m.onnx, its tensors in folder/w.data, then its
            location set to location. Returns the model's path."""
            os.makedirs(folder, exist_ok=True)
            m = onnx.load_model_from_string(base)
            p = os.path.join(folder, "m.onnx")
            onnx.save_model(m, p, save_as_external_data=True, all_tensors_to_one_file=True,
                            location="w.data", size_threshold=0)
            if location != "w.data":
                m = onnx.load(p, load_external_data=False)
                for t in m.graph.initializer:
                    for e in t.external_data:
                        if e.key == "location":
                            e.value = location
                onnx.save(m, p)
            return p

        good = ext_model(os.path.join(tmp, "ext_good"))
        check(info(good).returncode == 0, "external data in the model's folder loads",
              say_ok=True)
        # a link to a copy of the same data outside the folder
        outside = os.path.join(tmp, "outside")
        os.makedirs(outside)
        os.rename(os.path.join(tmp, "ext_good", "w.data"), os.path.join(outside, "w.data"))
        os.symlink(os.path.join(outside, "w.data"), os.path.join(tmp, "ext_good", "w.data"))
        expect_refused(good, "external data location 'w.data' is outside the model's folder",
                       "link to a file outside the folder")
        # through a linked folder inside the model's folder
        p = ext_model(os.path.join(tmp, "ext_dirlink"), "sub/w.data")
        os.symlink(outside, os.path.join(tmp, "ext_dirlink", "sub"))
        expect_refused(p, "is outside the model's folder", "a linked folder leading outside")
        # a link to /etc/passwd: refused, its size never shown
        p = ext_model(os.path.join(tmp, "ext_passwd"), "passwd")
        os.symlink("/etc/passwd", os.path.join(tmp, "ext_passwd", "passwd"))
        size = str(os.path.getsize("/etc/passwd"))
        expect_refused(p, "is outside the model's folder", "link to /etc/passwd",
                       hidden=(f"holds {size}", f" {size} bytes", "/etc/passwd"))
        # ".." and absolute locations (ONNX's own rule)
        p = ext_model(os.path.join(tmp, "ext_dotdot"), "sub/../../outside/w.data")
        expect_refused(p, "location 'sub/../../outside/w.data' is outside the model's folder",
                       "'..' in the location")
        p = ext_model(os.path.join(tmp, "ext_abs"), os.path.join(outside, "w.data"))
        expect_refused(p, "is outside the model's folder", "an absolute location")
        # a link to a folder, a FIFO: not regular files (the FIFO must not block)
        p = ext_model(os.path.join(tmp, "ext_linkdir"), "d")
        os.makedirs(os.path.join(tmp, "ext_linkdir", "real_d"))
        os.symlink("real_d", os.path.join(tmp, "ext_linkdir", "d"))
        expect_refused(p, "is not a regular file", "link to a folder")
        p = ext_model(os.path.join(tmp, "ext_fifo"), "fifo")
        os.mkfifo(os.path.join(tmp, "ext_fifo", "fifo"))
        try:
            expect_refused(p, "is not a regular file", "a FIFO as external data")
        except subprocess.TimeoutExpired:
            check(False, "a FIFO as external data: tilewise blocked on it")
        # links that stay inside: a data file linked within the folder, and the model read
        # through a linked folder
        p = ext_model(os.path.join(tmp, "ext_inner"))
        os.makedirs(os.path.join(tmp, "ext_inner", "store"))
        os.rename(os.path.join(tmp, "ext_inner", "w.data"),
                  os.path.join(tmp, "ext_inner", "store", "w.data"))
        os.symlink("store/w.data", os.path.join(tmp, "ext_inner", "w.data"))
        check(info(p).returncode == 0, "a link inside the model's folder loads", say_ok=True)
        os.symlink(os.path.join(tmp, "ext_inner"), os.path.join(tmp, "inner_link"))
        r = info(os.path.join(tmp, "inner_link", "m.onnx"))
        check(r.returncode == 0, f"the model through a linked folder loads: {r.stderr.strip()}",
              say_ok=True)
        # offset and length against the file's size
        p = ext_model(os.path.join(tmp, "ext_offset"))
        m = onnx.load(p, load_external_data=False)
        ext = m.graph.initializer[0].external_data
        for e in list(ext):
            if e.key == "offset":
                ext.remove(e)
        e = ext.add()
        e.key, e.value = "offset", str(os.path.getsize(os.path.join(tmp, "ext_offset", "w.data")))
        onnx.save(m, p)
        expect_refused(p, "the tensor needs", "an offset past the end of the data file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
