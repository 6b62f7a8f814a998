#!/usr/bin/python3
"""Segmentation blending (pipeline/engine/blend.c) against PyTorch and numpy.

test_blend, run with TW_BLEND_DUMP=dir, blends a few rasters of random
logits (every edge mode and blend mode, margins, strides that divide the
tile and strides that do not, tiles left out, nodata pixels) and writes the
logits, which tiles were classified, the input nodata mask and its output
(layout in tests/test_blend.c, dump_one). Here the same output is computed
from the logits alone: torch.softmax over the class axis of each tile, tile
positions from tiling.edge's words, and KEYS.md's weights ("Blending
segmentation tiles") as numpy arrays over the whole raster. Every pixel
must agree within 1e-4 (the issue's bound; seen: ~1e-7), and nodata exactly
where the sum of weights is 0.
"""
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

from e2eutil import BIN, check

EDGES = ("pad", "shift", "skip")
MODES = ("mean", "linear", "cosine")


def positions(size, T, S, edge):
    """Tile starts along one axis (KEYS.md's tiling.edge)."""
    if size <= T:
        return [0]
    if edge == "pad":
        return [a * S for a in range(-(-(size - T) // S) + 1)]
    pos = list(range(0, size - T + 1, S))
    if edge == "shift" and pos[-1] + T < size:
        pos.append(size - T)
    return pos


def f(mode, t):
    if mode == "linear":
        return t
    if mode == "cosine":
        return 0.5 - 0.5 * np.cos(math.pi * t)
    return np.ones_like(t)


def edge_factor(mode, T, o, m):
    """r(i) for i = 0..T-1 pixels from an edge overlapped by o pixels."""
    i = np.arange(T, dtype=np.float64)
    if o <= 0:
        return np.ones(T)
    e = o - 2 * m
    r = np.ones(T)
    r[i < m] = 0.0
    ramp = (i >= m) & (i < m + e)
    if e > 0:
        r[ramp] = f(mode, (i[ramp] - m + 0.5) / e)
    return r


def axis_weights(mode, T, m, pos, a):
    lo = pos[a - 1] + T - pos[a] if a > 0 else 0
    hi = pos[a] + T - pos[a + 1] if a + 1 < len(pos) else 0
    return edge_factor(mode, T, max(lo, 0), m) * edge_factor(mode, T, max(hi, 0), m)[::-1]


def check_dump(path):
    import torch

    raw = open(path, "rb").read()
    hdr = np.frombuffer(raw[:40], dtype="<i4")
    w, h, T, S, edge, mode, m, C, nx, ny = (int(v) for v in hdr)
    edge, mode = EDGES[edge], MODES[mode]
    off = 40

    def take(dtype, shape):
        nonlocal off
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        a = np.frombuffer(raw[off:off + n], dtype=dtype).reshape(shape)
        off += n
        return a

    logits = take("<f4", (ny, nx, C, T, T))
    classified = take("u1", (ny, nx))
    nodata = take("u1", (h, w)).astype(bool)
    out = take("<f4", (h, w, C))
    has = take("u1", (h, w))
    check(off == len(raw), f"{path}: {len(raw) - off} bytes after the output")
    xs, ys = positions(w, T, S, edge), positions(h, T, S, edge)
    check(len(xs) == nx and len(ys) == ny,
          f"{path}: {nx} x {ny} tiles, KEYS.md's {edge} gives {len(xs)} x {len(ys)}")
    probs = torch.softmax(torch.from_numpy(logits.copy()).double(), dim=2).numpy()
    num = np.zeros((h + T, w + T, C))
    den = np.zeros((h + T, w + T))
    for ty, y0 in enumerate(ys):
        wy = axis_weights(mode, T, m, ys, ty)
        for tx, x0 in enumerate(xs):
            if not classified[ty, tx]:
                continue
            wt = np.outer(wy, axis_weights(mode, T, m, xs, tx))
            valid = np.ones((T, T), dtype=bool)
            vh, vw = min(T, h - y0), min(T, w - x0)
            valid[:vh, :vw] = ~nodata[y0:y0 + vh, x0:x0 + vw]
            wt = wt * valid
            num[y0:y0 + T, x0:x0 + T] += wt[:, :, None] * probs[ty, tx].transpose(1, 2, 0)
            den[y0:y0 + T, x0:x0 + T] += wt
    num, den = num[:h, :w], den[:h, :w]
    want_has = den > 0
    what = f"{path} ({w}x{h}, tile {T} stride {S}, {edge}, {mode}, margin {m})"
    check(np.array_equal(has.astype(bool), want_has),
          f"{what}: nodata where the weights sum to 0 ({int((has == 0).sum())} pixels, "
          f"numpy {int((~want_has).sum())})")
    ref = np.where(want_has[:, :, None], num / np.where(want_has, den, 1.0)[:, :, None], 0.0)
    diff = float(np.abs(out - ref).max())
    check(diff <= 1e-4, f"{what}: largest difference from numpy {diff:.3g} (<= 1e-4)")
    check(np.all(out[~want_has] == 0), f"{what}: nodata pixels' probabilities are 0")
    return diff


def main():
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch not importable: skipped")
        return 77
    if not BIN:
        print("TW_BIN not set: skipped")
        return 77
    exe = os.path.join(os.path.dirname(BIN), "test_blend")
    with tempfile.TemporaryDirectory() as d:
        r = subprocess.run([exe], env=dict(os.environ, TW_BLEND_DUMP=d), capture_output=True,
                           text=True)
        check(r.returncode == 0, f"test_blend dump: exit {r.returncode}: {r.stderr.strip()}")
        files = sorted(os.listdir(d))
        check(len(files) == 5, f"test_blend dumped {len(files)} configurations, expected 5")
        worst = max(check_dump(os.path.join(d, n)) for n in files)
    print(f"5 configurations agree with PyTorch's softmax and KEYS.md's weights "
          f"(largest difference {worst:.3g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
