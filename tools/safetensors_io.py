"""Minimal safetensors reader/writer (Debian ships no python safetensors).

File layout: 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
then the raw little-endian tensor bytes; offsets are relative to the data start.

Only numpy is needed. BF16 has no numpy dtype: it is written from float32 by
rounding to nearest-even on the top 16 bits and read back by widening.
"""
import json
import struct

import numpy as np

_NP_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


def f32_to_bf16_bits(a):
    """uint16 array of the bfloat16 nearest (ties to even) to float32 array a."""
    u = np.ascontiguousarray(a, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype("<u2")


def bf16_bits_to_f32(bits):
    """float32 array from uint16 bfloat16 bit patterns."""
    return (np.asarray(bits, dtype="<u2").astype("<u4") << 16).view("<f4")


def _to_numpy(t):
    if hasattr(t, "detach"):  # torch tensor without importing torch here
        t = t.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        t = t.numpy()
    return np.asarray(t)


def encode(tensors, dtype="F32", metadata=None):
    """Bytes of a safetensors file. tensors: name -> array (numpy or torch);
    floating arrays are converted to dtype (F32, F16 or BF16), others kept."""
    header = {}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        a = _to_numpy(t)
        if a.dtype.kind == "f":
            if dtype == "BF16":
                raw = f32_to_bf16_bits(a.astype(np.float32)).tobytes()
                code = "BF16"
            else:
                raw = np.ascontiguousarray(a, dtype=_NP_DTYPES[dtype]).tobytes()
                code = dtype
        else:
            code = next(k for k, v in _NP_DTYPES.items() if v == a.dtype.newbyteorder("<"))
            raw = np.ascontiguousarray(a, dtype=_NP_DTYPES[code]).tobytes()
        header[name] = {"dtype": code, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * (-len(hbytes) % 8)  # keep the data 8-byte aligned
    return struct.pack("<Q", len(hbytes)) + hbytes + b"".join(blobs)


def save(path, tensors, dtype="F32", metadata=None):
    """Write tensors (name -> array) to path; see encode()."""
    with open(path, "wb") as f:
        f.write(encode(tensors, dtype, metadata))


def load(path):
    """Read path; returns (tensors, metadata): name -> numpy array (BF16 widened
    to float32) and the "__metadata__" dict (empty when absent)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError(f"{path}: header length {n} exceeds the file")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        if not 0 <= b <= e <= len(data):
            raise ValueError(f"{path}: tensor {name} offsets past the end of the data")
        raw = bytes(data[b:e])
        shape = tuple(info["shape"])
        if info["dtype"] == "BF16":
            arr = bf16_bits_to_f32(np.frombuffer(raw, dtype="<u2"))
        else:
            arr = np.frombuffer(raw, dtype=_NP_DTYPES[info["dtype"]]).copy()
        out[name] = arr.reshape(shape)
    return out, meta
