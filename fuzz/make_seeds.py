#!/usr/bin/python3
"""Write the committed seed corpora under fuzz/corpus/<harness>/
(workflow, safetensors, hdf5 for the bundle harness, hdf5_raw, tiff, onnx).

Seeds are small valid inputs plus a few hostile ones, so that the fuzzer
starts from inputs that reach deep into each parser. Run from anywhere with
Debian's python3 (numpy, h5py); it rewrites the corpus files in place and is
deterministic, except for the object timestamps HDF5 puts in the two
libver="latest" files (which does not change what the fuzzer gets from them). Crash reproducers found later are added by hand next to them
(named crash-<what>) and kept as regression inputs.
"""
import json
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
import safetensors_io  # noqa: E402


def tiny_resnet(rng, bands=3, classes=4, width=1):
    """A torchvision-layout ResNet-18 state_dict with `width` channels in the
    first stage (1, 2, 4, 8 with width 1): every key and shape rule of the
    reader, in a few KiB."""
    sd = {}

    def bn(prefix, c):
        sd[prefix + ".weight"] = rng.random(c, dtype=np.float32) + 0.5
        sd[prefix + ".bias"] = rng.standard_normal(c).astype(np.float32)
        sd[prefix + ".running_mean"] = rng.standard_normal(c).astype(np.float32)
        sd[prefix + ".running_var"] = rng.random(c, dtype=np.float32) + 0.5

    sd["conv1.weight"] = rng.standard_normal((width, bands, 7, 7)).astype(np.float32)
    bn("bn1", width)
    cin = width
    for stage in range(4):
        cout = width * (2 ** stage)
        for block in range(2):
            p = f"layer{stage + 1}.{block}"
            ci = cin if block == 0 else cout
            sd[p + ".conv1.weight"] = rng.standard_normal((cout, ci, 3, 3)).astype(np.float32)
            bn(p + ".bn1", cout)
            sd[p + ".conv2.weight"] = rng.standard_normal((cout, cout, 3, 3)).astype(np.float32)
            bn(p + ".bn2", cout)
            if block == 0 and (stage > 0):
                sd[p + ".downsample.0.weight"] = rng.standard_normal((cout, ci, 1, 1)).astype(
                    np.float32)
                bn(p + ".downsample.1", cout)
        cin = cout
    sd["fc.weight"] = rng.standard_normal((classes, cin)).astype(np.float32)
    sd["fc.bias"] = rng.standard_normal(classes).astype(np.float32)
    return sd


def write(dirname, name, blob):
    d = os.path.join(HERE, "corpus", dirname)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(blob if isinstance(blob, bytes) else blob.encode())


def raw_st(header_text, data):
    h = header_text.encode()
    return struct.pack("<Q", len(h)) + h + data


def safetensors_seeds(sd):
    meta = {"arch": json.dumps("resnet18"), "bands": json.dumps([3, 2, 1]),
            "scale": json.dumps(0.5), "mean": json.dumps([1.0, 2.0, 3.0]),
            "std": json.dumps([0.5, 0.25, 2.0]), "classes": json.dumps(["a", "b", "c", "d"]),
            "tile": json.dumps(32)}
    write("safetensors", "resnet18_f32_meta", safetensors_io.encode(sd, "F32", meta))
    write("safetensors", "resnet18_f16", safetensors_io.encode(sd, "F16"))
    write("safetensors", "resnet18_bf16", safetensors_io.encode(sd, "BF16"))
    small = {"conv1.weight": sd["conv1.weight"][:, :, :3, :3].copy(),
             "fc.bias": sd["fc.bias"]}
    good = safetensors_io.encode(small, "F32", {"arch": "resnet34"})
    write("safetensors", "two_tensors", good)
    n = struct.unpack("<Q", good[:8])[0]
    write("safetensors", "overlap", raw_st(json.dumps({
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}), bytes(16)))
    write("safetensors", "past_end", raw_st(json.dumps({
        "a": {"dtype": "F16", "shape": [4], "data_offsets": [0, 1 << 40]}}), bytes(8)))
    write("safetensors", "header_too_long", struct.pack("<Q", 1 << 20) + good[8:8 + n])
    write("safetensors", "escapes", raw_st(
        '{"__metadata__": {"classes": "[\\"w\\\\u00e9t\\", \\"\\\\ud83d\\\\ude00\\"]"},'
        ' "fc.bias": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', bytes(4)))
    write("safetensors", "numbers", raw_st(
        '{"x": {"dtype": "BF16", "shape": [1, 1e0, -0, 2], "data_offsets": [0.0, 4]}}',
        bytes(4)))


def hdf5_seeds(sd):
    import h5py
    d = os.path.join(HERE, "corpus", "hdf5_raw")
    os.makedirs(d, exist_ok=True)
    # Only the first stage's tensors: a valid bundle layout with every
    # attribute kind, small enough (a few KiB) for the fuzzer to mutate.
    keep = {k: v for k, v in sd.items() if k.startswith(("conv1", "bn1", "fc"))}
    # h5py writes the creation time into object headers unless told not to;
    # track_times=False keeps the seeds byte-identical between runs.
    with h5py.File(os.path.join(d, "bundle_full"), "w", libver="latest") as f:
        f.attrs["format"] = np.bytes_("tilewise-resnet")
        f.attrs["format_version"] = np.int32(1)
        g = f.create_group("tensors")
        for k, v in sd.items():
            g.create_dataset(k, data=v, track_times=False)
    with h5py.File(os.path.join(d, "bundle_fixed_strings"), "w", libver="earliest") as f:
        f.attrs["format"] = np.bytes_("tilewise-resnet")
        f.attrs["format_version"] = np.int32(1)
        f.attrs["arch"] = np.bytes_("resnet18")
        f.attrs["bands"] = np.array([1, 2, 3], dtype=np.int32)
        f.attrs["scale"] = np.float64(0.25)
        f.attrs["mean"] = np.array([1, 2, 3], dtype=np.float32)
        f.attrs["std"] = np.array([1, 2, 3], dtype=np.float32)
        f.attrs["classes"] = np.array([b"water", b"forest", b"crop", b"urban"])
        f.attrs["tile"] = np.int32(32)
        g = f.create_group("tensors", track_order=False)
        for k, v in keep.items():
            g.create_dataset(k, data=v, track_times=False)
    with h5py.File(os.path.join(d, "bundle_vlen_f16"), "w", libver="latest") as f:
        f.attrs["format"] = "tilewise-resnet"
        f.attrs["format_version"] = 1
        f.attrs["arch"] = "resnet18"
        f.attrs["classes"] = ["a", "b", "c", "d"]
        f.attrs["bands"] = np.array([3, 1, 2], dtype=np.int64)
        g = f.create_group("tensors")
        for k, v in keep.items():
            g.create_dataset(k, data=v.astype(np.float16), track_times=False)
    with h5py.File(os.path.join(d, "int_tensor_chunked"), "w", libver="earliest") as f:
        f.attrs["format"] = np.bytes_("tilewise-resnet")
        f.attrs["format_version"] = np.int32(1)
        g = f.create_group("tensors")
        g.create_dataset("fc.bias", data=np.arange(4, dtype=np.int32), chunks=(2,),
                         track_times=False)
        g.create_dataset("conv1.weight", data=keep["conv1.weight"], chunks=(1, 3, 7, 1),
                         compression="gzip", track_times=False)


def bundle_seeds():
    """Byte strings for fuzz_hdf5_bundle.c, which builds the file itself:
    each byte steers one choice (attribute present and its type, mutations)."""
    import random
    write("hdf5", "zeros", bytes(64))
    # format as a string, format_version 1, the other attributes absent,
    # a clean ResNet-18: loads.
    write("hdf5", "minimal_valid",
          bytes([1, 1, 5, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1]) + bytes([7]) * 3000)
    write("hdf5", "ones", bytes([1]) * 3000)
    write("hdf5", "fives", bytes([5]) * 3000)
    r = random.Random(5)
    write("hdf5", "random", bytes(r.randrange(256) for _ in range(3000)))


def workflow_seeds():
    root = os.path.join(HERE, "..")
    for name in ("sample.yaml", "batch_cog.yaml"):
        with open(os.path.join(root, "workflows", name), "rb") as f:
            write("workflow", name, f.read())
    write("workflow", "flow_and_sets.yaml",
          "input: {path: [a.tif, 'b c.tif'], bands: [3, 2, 1], scale: 1e-4, nodata: -9999,"
          " on_error: skip}\n"
          "model: {weights: m.h5, arch: resnet50, mean: [.1, .2, .3], std: [1, 2, 3],"
          " classes: [water, \"for\\u00e9st\", ~]}\n"
          "tiling: {tile: 96, stride: 48, batch: 16, edge: shift, max_nodata_fraction: 0.25}\n"
          "runtime: {device: 'cuda:1', precision: bf16, memory: 1.5GiB, threads: 4}\n"
          "output: {dir: out, products: [class, prob, confidence, embeddings, tiles],"
          " prob_type: uint8, format: COG, creation_options: [COMPRESS=ZSTD, 'BLOCKSIZE=512']}\n"
          "tiling.stride=32\n")
    write("workflow", "anchors_tags.yaml",
          "%YAML 1.1\n---\ninput: &in\n  path: !!str x.tif\n  bands: !!seq [1]\n"
          "model: {weights: *in}\noutput:\n  <<: {dir: o}\n  dir: |\n    multi\n    line\n...\n")
    write("workflow", "errors.yaml",
          "input:\n  path: x.tif\n  path: y.tif\ntiling:\n  tile: 0x40\n  stride: -1\n"
          "  edge: [pad]\nruntime:\n  memory: 99999999999999999999PiB\n\toops\n")


def tiff_seeds():
    """fuzz_tiff: 16 parameter bytes (tests/tiff_roundtrip.h) + pixel bytes.
    One seed per sample type, each with another codec, layout and window;
    two with missing tiles, two with corrupted tile data."""
    r = np.random.default_rng(7)
    px = bytes(r.integers(0, 256, 300, dtype=np.uint8))
    #        W   H  tw  th spp type planar codec pred sp0 sp1 flags nd win step cache
    seeds = {
        "byte_deflate_pred": [63, 40, 0, 1, 2, 0, 0, 2, 1, 0, 0, 0, 100, 24, 20, 0],
        "int8_none_band": [30, 30, 1, 0, 2, 1, 1, 0, 0, 0, 0, 0, 100, 16, 16, 0],
        "uint16_lzw_reversed": [71, 71, 2, 2, 3, 2, 2, 1, 1, 0, 0, 0, 100, 40, 33, 1],
        "int16_zstd_planar": [50, 20, 0, 0, 1, 3, 3, 4, 1, 0, 0, 0, 100, 7, 5, 2],
        "uint32_lzma": [17, 33, 1, 1, 0, 4, 0, 5, 0, 0, 0, 0, 100, 16, 16, 0],
        "int32_packbits": [40, 40, 0, 2, 1, 5, 1, 3, 0, 0, 0, 0, 100, 13, 13, 0],
        "float32_pred3": [47, 29, 2, 0, 2, 6, 0, 2, 2, 0, 0, 0, 100, 32, 32, 0],
        "float64_none": [20, 20, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 100, 3, 2, 1],
        "sparse_nodata": [63, 63, 0, 0, 2, 2, 0, 2, 0, 0xAA, 0x55, 3, 160, 20, 17, 0],
        "sparse_zero_planar": [40, 60, 0, 0, 1, 0, 1, 1, 0, 0xF0, 0x0F, 1, 100, 16, 16, 0],
        "whole_tiles": [63, 63, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 100, 15, 16, 0],
        "corrupt_deflate": [40, 40, 0, 0, 2, 2, 0, 2, 1, 0, 0, 0, 100, 20, 20, 4],
        "corrupt_lzw_planar": [33, 33, 1, 0, 1, 6, 1, 1, 0, 0, 0, 0, 100, 11, 9, 4],
    }
    for name, head in seeds.items():
        write("tiff", name, bytes(head) + px)


def onnx_resnet(sd, bn_nodes=True, head="gemm", opset=17, meta=None, foreign=None,
                inits_as_inputs=False):
    """The ResNet-18 of sd as an ONNX graph the way torch.onnx.export lays it
    out (BatchNormalization nodes, or folded into the Conv's bias), or with
    another converter's head (ReduceMean, MatMul + Add, Softmax); foreign
    replaces the first ReLU by that op; inits_as_inputs lists the weights
    among the graph's inputs too (IR < 4, keep_initializers_as_inputs)."""
    import onnx
    from onnx import helper, numpy_helper
    nodes, inits = [], []
    count = [0]

    def name(prefix):
        count[0] += 1
        return f"{prefix}_{count[0]}"

    def init(arr, n):
        inits.append(numpy_helper.from_array(np.ascontiguousarray(arr, dtype=np.float32), n))
        return n

    def conv(x, prefix, bn_prefix, stride, pad):
        w = sd[prefix + ".weight"]
        g, b, m, v = (sd[bn_prefix + "." + k] for k in ("weight", "bias", "running_mean",
                                                          "running_var"))
        y = name("conv")
        k = w.shape[2]
        attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4,
                     dilations=[1, 1], group=1)
        if bn_nodes:
            nodes.append(helper.make_node("Conv", [x, init(w, prefix + ".weight")], [y], y,
                                          **attrs))
            z = name("bn")
            nodes.append(helper.make_node("BatchNormalization",
                                          [y] + [init(a, f"{bn_prefix}.{k2}") for a, k2 in
                                                 zip((g, b, m, v), ("w", "b", "m", "v"))],
                                          [z], z, epsilon=1e-5))
            return z
        s_ = g / np.sqrt(v + 1e-5)
        nodes.append(helper.make_node("Conv", [x, init(w * s_[:, None, None, None], y + ".w"),
                                               init(b - m * s_, y + ".b")], [y], y, **attrs))
        return y

    def relu(x, first=[True]):
        y = name("relu")
        op = foreign if foreign and first[0] else "Relu"
        first[0] = False
        nodes.append(helper.make_node(op, [x], [y], y))
        return y

    bands = sd["conv1.weight"].shape[1]
    x = relu(conv("image", "conv1", "bn1", 2, 3))
    y = name("pool")
    nodes.append(helper.make_node("MaxPool", [x], [y], y, kernel_shape=[3, 3], strides=[2, 2],
                                  pads=[1, 1, 1, 1]))
    x = y
    for stage in range(4):
        for block in range(2):
            p = f"layer{stage + 1}.{block}"
            stride = 2 if stage > 0 and block == 0 else 1
            h = relu(conv(x, p + ".conv1", p + ".bn1", stride, 1))
            h = conv(h, p + ".conv2", p + ".bn2", 1, 1)
            sc = x
            if p + ".downsample.0.weight" in sd:
                sc = conv(x, p + ".downsample.0", p + ".downsample.1", stride, 0)
            a = name("add")
            nodes.append(helper.make_node("Add", [h, sc], [a], a))
            x = relu(a)
    w, b = sd["fc.weight"], sd["fc.bias"]
    if head == "gemm":
        nodes.append(helper.make_node("GlobalAveragePool", [x], ["gap"], "gap"))
        nodes.append(helper.make_node("Flatten", ["gap"], ["flat"], "flat", axis=1))
        nodes.append(helper.make_node("Gemm", ["flat", init(w, "fc.weight"), init(b, "fc.bias")],
                                      ["logits"], "fc", alpha=1.0, beta=1.0, transB=1))
    else:
        nodes.append(helper.make_node("ReduceMean", [x], ["flat"], "pool2", axes=[2, 3],
                                      keepdims=0))
        nodes.append(helper.make_node("MatMul", ["flat", init(w.T, "fc_wt")], ["mm"], "mm"))
        nodes.append(helper.make_node("Add", ["mm", init(b, "fc_b")], ["out"], "bias"))
        nodes.append(helper.make_node("Softmax", ["out"], ["logits"], "softmax", axis=1))
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("image", onnx.TensorProto.FLOAT,
                                                      ["n", bands, 32, 32])],
        [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["n", w.shape[0]])],
        inits)
    if inits_as_inputs:
        graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                           for t in inits)
    model = helper.make_model(graph, producer_name="make_seeds", producer_version="1",
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    for k, v in (meta or {}).items():
        e = model.metadata_props.add()
        e.key, e.value = k, v
    return model.SerializeToString()


def onnx_seeds(sd):
    meta = {"class_names": json.dumps({0: "a", 1: "b", 2: "c", 3: "d"}),
            "standardization_mean": json.dumps([0.1, 0.2, 0.3]),
            "standardization_std": json.dumps([0.5, 0.5, 0.5]), "tiles_size": "32",
            "resolution": "50", "model_type": json.dumps("Recognition")}
    good = onnx_resnet(sd)
    write("onnx", "resnet18_bn", good)
    write("onnx", "resnet18_folded_o11", onnx_resnet(sd, bn_nodes=False, opset=11))
    write("onnx", "resnet18_matmul_meta", onnx_resnet(sd, head="matmul", meta=meta))
    write("onnx", "foreign_clip", onnx_resnet(sd, foreign="Clip"))
    write("onnx", "truncated", good[:len(good) // 3])
    write("onnx", "bad_meta", onnx_resnet(sd, meta={"class_names": "{0: 'a'"}))
    write("onnx", "resnet18_inits_as_inputs", onnx_resnet(sd, bn_nodes=False, opset=9,
                                                          inits_as_inputs=True))
    # class names as Deepness also reads them: a Python dict (ast.literal_eval)
    write("onnx", "resnet18_pydict", onnx_resnet(
        sd, bn_nodes=False, meta={"class_names": "{0: 'water', 1: \"it's\", 2: 'c', 3: 'd'}"}))


def main():
    rng = np.random.default_rng(2024)
    sd = tiny_resnet(rng)
    onnx_seeds(sd)
    safetensors_seeds(sd)
    hdf5_seeds(sd)
    bundle_seeds()
    workflow_seeds()
    tiff_seeds()
    return 0


if __name__ == "__main__":
    sys.exit(main())
