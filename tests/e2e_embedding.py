#!/usr/bin/python3
"""Headless backbones and the embedding_raster product, end to end (issue 31, items 3-4).

* A headless SSL-style ResNet-50 checkpoint as TorchGeo/Lightning users hold
  it (torch.save of {"state_dict": {"backbone.conv1.weight", ...}}: timm's
  key names under a prefix, no fc, a projection head beside it; conv1 for 6
  bands; random weights, seed 31) goes through tools/export_model.py, which
  says what it did; `tilewise info` shows no head and D = 2048.
* It runs on a 100 x 90 crop of sample_data/L7_ETMs.tif (real Landsat 7)
  with tile 32, stride 16 (every inner cell averages 4 tiles) to
  scene.emb.tif. Reference: PyTorch's pooled features of every tile (the
  model with fc = Identity, the input normalized as tilewise does, zero
  padding past the edge), averaged per cell in float64 over the tiles that
  cover it. Tolerances: float32 |x - ref| <= 1e-4 (the features here are
  0..~4); float16 |x - ref| <= 2^-10 |ref| + 1e-4 (GDAL's half conversion
  plus fp32's); int8 |offset + scale q - ref| <= scale / 2 + 1e-4 with the
  band's scale/offset read through GDAL (GetScale/GetOffset).
* COG (int8): the same pixels as the GTiff.
* Shards 1/2 + 2/2 and `tilewise merge` give one run's pixels, and a run
  killed (-9) after its first committed row and run again gives them too.
* A class product with the headless model: exit 3 before the first tile,
  naming the product and the model file; `embeddings` works: its tile table
  holds PyTorch's per-tile features (<= 1e-4) and no probabilities.
* SIGTERM after 8 of 30 tiles: exit 75 with a checkpoint (the stitcher's
  sums of features in the state file); the rerun classifies only the rest
  and gives one run's pixels.
* A headed model (the ResNet-18 fixture) writes 512 bands next to its class
  map, and the class map is byte for byte the one of a run without them.
* export_model.py refuses a layout it does not know, naming the first
  unexpected key, and a pickle holding code unless --trust-pickle.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2eutil import BIN, FIX, MEAN, SRC, STD, check, committed_rows, gdal_or_skip  # noqa: E402

T, S = 32, 16
SRCWIN = [50, 60, 100, 90]  # x, y, w, h of the crop


def make_checkpoint(path, torch):
    import torchvision
    torch.manual_seed(31)
    m = torchvision.models.resnet50()
    m.conv1 = torch.nn.Conv2d(6, 64, 7, 2, 3, bias=False)
    m.fc = torch.nn.Identity()
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):  # statistics that folding must honour
            mod.running_mean.uniform_(-0.1, 0.1)
            mod.running_var.uniform_(0.5, 1.5)
            mod.weight.data.uniform_(0.5, 1.0)
            mod.bias.data.uniform_(-0.1, 0.1)
    m.eval()
    sd = {"backbone." + k: v for k, v in m.state_dict().items()}
    sd["projection_head.0.weight"] = torch.randn(128, 2048)  # beside the backbone
    torch.save({"state_dict": sd, "epoch": 3, "hyper_parameters": {"lr": 0.03}}, path)
    return m


def reference(m, torch, pix):
    """Cell-grid average of PyTorch's pooled features, float64 [D, gh, gw]."""
    b, h, w = pix.shape
    x = (pix.astype(np.float32) - np.asarray(MEAN, np.float32)[:, None, None]) / \
        np.asarray(STD, np.float32)[:, None, None]
    def n_aligned(size):
        return 1 if size <= T else -(-(size - T) // S) + 1
    nx, ny = n_aligned(w), n_aligned(h)
    gw, gh = -(-w // S), -(-h // S)
    tiles, where = [], []
    for ty in range(ny):
        for tx in range(nx):
            t = np.zeros((b, T, T), np.float32)  # padding: 0 after normalization
            y0, x0 = ty * S, tx * S
            part = x[:, y0:y0 + T, x0:x0 + T]
            t[:, :part.shape[1], :part.shape[2]] = part
            tiles.append(t)
            where.append((ty, tx))
    with torch.no_grad():
        feats = m(torch.from_numpy(np.stack(tiles))).numpy().astype(np.float64)
    k = T // S
    acc = np.zeros((feats.shape[1], gh, gw))
    cnt = np.zeros((gh, gw))
    for f, (ty, tx) in zip(feats, where):
        acc[:, ty:ty + k, tx:tx + k] += f[:, None, None]
        cnt[ty:ty + k, tx:tx + k] += 1
    return acc / cnt, cnt, feats, where


def said(cond, what, detail):
    """check() with the detail shown only when it fails."""
    check(cond, what + ("" if cond else f": {detail}"), True)


def export(args):
    """tools/export_model.py's main(args) in this process (torch is imported
    once): (exit code, stdout, stderr)."""
    import contextlib
    import io
    sys.path.insert(0, f"{SRC}/tools")
    import export_model
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = export_model.main(args)
    return rc, out.getvalue(), err.getvalue()


def run(args, **kw):
    return subprocess.run([BIN] + args, capture_output=True, text=True, **kw)


def main():
    gdal = gdal_or_skip()
    if gdal is None:
        return 77
    import torch
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        # --- the checkpoint, exported ---
        ckpt, h5 = f"{tmp}/ssl_resnet50.ckpt", f"{tmp}/r50_headless.h5"
        m = make_checkpoint(ckpt, torch)
        r = subprocess.run([sys.executable, f"{SRC}/tools/export_model.py", ckpt, "-o", h5],
                           capture_output=True, text=True)  # the command itself, once
        check(r.returncode == 0, f"export_model.py: {r.stderr}")
        for says in ("'state_dict'", "prefix 'backbone.' stripped", "projection_head.0.weight",
                     "arch resnet50 inferred", "no head (fc)", "2048 features"):
            said(says in r.stdout, f"export_model.py says {says}", r.stdout)
        r = run(["info", h5])
        said(r.returncode == 0 and "head:       none" in r.stdout and "2048" in r.stdout,
             "info shows no head and D = 2048", r.stdout)
        r = run(["info", "--json", h5])
        info = json.loads(r.stdout)
        said(info.get("head") is False and info.get("features") == 2048,
             "info --json: head false, features 2048", r.stdout)

        # --- the input: a crop of the real sample raster ---
        src = f"{tmp}/crop.tif"
        gdal.Translate(src, f"{SRC}/sample_data/L7_ETMs.tif", srcWin=SRCWIN)
        pix = gdal.Open(src).ReadAsArray()
        ref, cnt, feats, where = reference(m, torch, pix)
        check(cnt.max() == 4 and cnt.min() == 1, "stride < tile: cells average 1 to 4 tiles", True)

        def flow(name, extra="", products="[embedding_raster]", weights=h5):
            wf, out = f"{tmp}/{name}.yaml", f"{tmp}/{name}"
            with open(wf, "w") as f:
                f.write(f"""input:
  path: {src}
model:
  weights: {weights}
  mean: {MEAN}
  std: {STD}
tiling:
  tile: {T}
  stride: {S}
runtime:
  device: cpu
  memory: 1GiB
output:
  dir: {out}
  products: {products}
{extra}""")
            return wf, out

        def emb(out):
            ds = gdal.Open(f"{out}/crop.emb.tif")
            return ds, ds.ReadAsArray()

        # --- validate: the plan says no head and the outputs' size ---
        wf, out = flow("f32")
        r = run(["validate", wf])
        said(r.returncode == 0 and "no head" in r.stdout and "outputs   " in r.stdout,
             "validate shows the headless model and the outputs' size", r.stdout + r.stderr)

        # --- float32 ---
        r = run(["run", wf, "-q"])
        check(r.returncode == 0, f"float32 run: {r.stderr}")
        ds, a32 = emb(out)
        check(ds.RasterCount == 2048 and a32.shape == ref.shape,
              f"2048 bands on the {ref.shape[2]} x {ref.shape[1]} cell grid", True)
        check(ds.GetRasterBand(1).GetDescription() == "emb_0" and
              ds.GetRasterBand(2048).GetDescription() == "emb_2047", "band descriptions emb_i", True)
        check(ds.GetRasterBand(1).DataType == gdal.GDT_Float32, "float32 pixels", True)
        check(ds.GetMetadata("IMAGE_STRUCTURE").get("INTERLEAVE") == "BAND",
              "band-interleaved", True)
        gt_in, gt_out = gdal.Open(src).GetGeoTransform(), ds.GetGeoTransform()
        check(np.allclose(gt_out, [gt_in[0], gt_in[1] * S, 0, gt_in[3], 0, gt_in[5] * S]),
              "georeferenced on the cell grid", True)
        d = np.abs(a32 - ref).max()
        print(f"     float32: max |x - ref| = {d:.2e} (features up to {np.abs(ref).max():.2f})")
        check(d <= 1e-4, f"float32 cells equal PyTorch's averaged features within 1e-4 ({d:.2e})",
              True)

        # --- float16 ---
        wf, out = flow("f16", "  embedding_type: float16\n")
        r = run(["run", wf, "-q"])
        check(r.returncode == 0, f"float16 run: {r.stderr}")
        ds, a16 = emb(out)
        check(ds.GetRasterBand(1).GetMetadata("IMAGE_STRUCTURE").get("NBITS") == "16",
              "float16 stored as 16-bit floats (NBITS=16)", True)
        bound = 2.0 ** -10 * np.abs(ref) + 1e-4
        e = (np.abs(a16 - ref) - bound).max()
        check(e <= 0, f"float16 within 2^-10 |ref| + 1e-4 (worst excess {e:.2e})", True)

        # --- int8 ---
        wf, out = flow("i8", "  embedding_type: int8\n")
        r = run(["run", wf, "-q"])
        check(r.returncode == 0, f"int8 run: {r.stderr}")
        ds = gdal.Open(f"{out}/crop.emb.tif")
        q = ds.ReadAsArray().view(np.int8).astype(np.float64)
        # a band whose features are all 0 keeps GDAL's default scale 1, offset 0 (None here)
        sc = np.array([ds.GetRasterBand(b + 1).GetScale() or 1.0 for b in range(2048)])
        of = np.array([ds.GetRasterBand(b + 1).GetOffset() or 0.0 for b in range(2048)])
        check(ds.GetRasterBand(1).GetMetadata("IMAGE_STRUCTURE").get("PIXELTYPE") == "SIGNEDBYTE"
              and ds.GetRasterBand(1).GetNoDataValue() == -128, "int8: signed, nodata -128", True)
        check(np.all(sc > 0) and q.min() >= -127 and q.max() <= 127, "int8: q in -127..127", True)
        v = of[:, None, None] + sc[:, None, None] * q
        e = (np.abs(v - ref) - (sc[:, None, None] / 2 + 1e-4)).max()
        check(e <= 0, f"int8 offset + scale q within scale/2 of the reference ({e:.2e})", True)

        # --- COG (int8): the same pixels ---
        wf, out = flow("cog", "  embedding_type: int8\n  format: COG\n")
        r = run(["run", wf, "-q"])
        check(r.returncode == 0, f"COG run: {r.stderr}")
        ds = gdal.Open(f"{out}/crop.emb.tif")
        check(ds.GetMetadata("IMAGE_STRUCTURE").get("LAYOUT") == "COG" and
              np.array_equal(ds.ReadAsArray().view(np.int8), q.astype(np.int8)),
              "COG: a COG with the GTiff's pixels", True)
        wf, out = flow("cog16", "  embedding_type: float16\n  format: COG\n")
        r = run(["run", wf, "-q"])
        check(r.returncode == 2 and "float16" in r.stderr, f"float16 COG refused: {r.stderr}",
              True)

        # --- shards + merge ---
        wf, out = flow("shards")
        for i in (1, 2):
            r = run(["run", wf, "-q", "--shard", f"{i}/2"])
            check(r.returncode == 0, f"shard {i}/2: {r.stderr}")
        r = run(["merge", out, "-q"])
        check(r.returncode == 0, f"merge: {r.stderr}")
        _, am = emb(out)
        check(np.array_equal(am, a32), "shards 1/2 + 2/2, merged: one run's pixels", True)

        # --- resume after kill -9 ---
        wf, out = flow("kill")
        argv = [BIN, "run", wf, "-q", "--chunk-rows", "1"]
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.time()
        while p.poll() is None and committed_rows(out) < 1 and time.time() - t0 < 120:
            time.sleep(0.002)
        p.send_signal(signal.SIGKILL)
        p.wait()
        rows = committed_rows(out)
        check(p.returncode == -signal.SIGKILL and 1 <= rows < ref.shape[1],
              f"killed with {rows} of {ref.shape[1]} rows committed (exit {p.returncode})", True)
        r = subprocess.run(argv, capture_output=True, text=True)
        check(r.returncode == 0, f"rerun after kill: {r.stderr}")
        with open(f"{out}/run.json") as f:
            resumed = json.load(f)["inputs"][0].get("rows_resumed", 0)
        _, ak = emb(out)
        check(resumed >= 1 and np.array_equal(ak, a32),
              f"killed and run again ({resumed} rows resumed): one run's pixels", True)

        # --- SIGTERM mid-chunk: a checkpoint keeps the stitcher's sums of
        # probabilities and features (state file), the rerun adds the rest ---
        wf, out = flow("term")
        argv = [BIN, "run", wf, "--progress=json", "--set", "tiling.batch=4"]
        p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for line in p.stderr:
            ev = json.loads(line)
            if ev.get("event") == "progress" and ev.get("tiles_done", 0) >= 8:
                p.send_signal(signal.SIGTERM)
                break
        p.communicate(timeout=60)
        states = [f for f in os.listdir(f"{out}/.tilewise/crop") if f.startswith("state.")] \
            if os.path.isdir(f"{out}/.tilewise/crop") else []
        said(p.returncode == 75 and states, "SIGTERM after 8 of 30 tiles: exit 75, a state kept",
             f"exit {p.returncode}, {states}")
        r = subprocess.run(argv[:3], capture_output=True, text=True)
        with open(f"{out}/run.json") as f:
            redone = json.load(f)["tiles_classified"]
        _, at = emb(out)
        said(r.returncode == 0 and redone < 30 and np.array_equal(at, a32),
             "stopped, run again from the state (the rest of the tiles only): one run's pixels",
             f"exit {r.returncode}, {redone} tiles classified again: {r.stderr}")

        # --- a class product with the headless model ---
        for prod in ("[prob, embedding_raster]", "[tiles]"):
            wf, out = flow("cls", products=prod)
            r = run(["run", wf, "-q"])
            word = prod.strip("[]").split(",")[0]
            check(r.returncode == 3 and f"'{word}'" in r.stderr and h5 in r.stderr and
                  "headless" in r.stderr, f"{prod}: exit 3 naming '{word}' and the model: "
                  f"{r.returncode} {r.stderr.strip()}", True)
            check(not os.path.exists(f"{out}/crop.emb.tif") and
                  not os.path.exists(f"{out}/.tilewise"), f"{prod}: nothing run", True)

        # --- the headless model's per-tile features: the HDF5 tile table ---
        import h5py
        wf, out = flow("table", products="[embeddings, embedding_raster]")
        r = run(["run", wf, "-q"])
        check(r.returncode == 0, f"[embeddings] with the headless model: {r.stderr}")
        with h5py.File(f"{out}/crop.tiles.h5", "r") as f:
            origin, e = f["origin"][()], f["embeddings"][()]
            said("probabilities" not in f and "classes" not in f.attrs and e.shape == (30, 2048),
                 "tiles.h5 of a headless model: embeddings only (no probabilities, no classes)",
                 f"{list(f)}, {list(f.attrs)}, {e.shape}")
        want = {(ty * S, tx * S): ft for ft, (ty, tx) in zip(feats, where)}
        d = max(np.abs(e[i] - want[tuple(origin[i])]).max() for i in range(len(e)))
        said(d <= 1e-4, f"its per-tile features equal PyTorch's within 1e-4 ({d:.2e})", d)
        _, ae = emb(out)
        check(np.array_equal(ae, a32), "and the embedding raster beside it is the same", True)

        # --- a headed model: its embeddings next to its class map ---
        w18 = f"{FIX}/resnet18_6b_7c.safetensors"
        wf, out = flow("headed", products="[class, embedding_raster]", weights=w18)
        r = run(["run", wf, "-q"])
        check(r.returncode == 0, f"headed run: {r.stderr}")
        ds, a18 = emb(out)
        check(ds.RasterCount == 512 and np.isfinite(a18).all() and a18.max() > 0,
              "ResNet-18 with a head: 512 bands of features", True)
        wf2, out2 = flow("headed_cls", products="[class]", weights=w18)
        r = run(["run", wf2, "-q"])
        c1 = gdal.Open(f"{out}/crop.class.tif").ReadAsArray()
        c2 = gdal.Open(f"{out2}/crop.class.tif").ReadAsArray()
        check(r.returncode == 0 and np.array_equal(c1, c2),
              "its class map equals a run without embedding_raster", True)

        # --- export_model.py refuses what it does not know ---
        bad = {k: v for k, v in torch.load(ckpt)["state_dict"].items()}
        bad["backbone.blocks.0.attn.qkv.weight"] = torch.zeros(3, 3)
        torch.save({"state_dict": bad}, f"{tmp}/bad.ckpt")
        rc, so, se = export([f"{tmp}/bad.ckpt", "-o", f"{tmp}/bad.h5"])
        said(rc == 1 and "'backbone.blocks.0.attn.qkv.weight'" in se and
             "first unexpected key" in se and not os.path.exists(f"{tmp}/bad.h5"),
             "unknown layout refused naming the first unexpected key", se)
        print("     " + se.strip())
        vit = {"cls_token": torch.zeros(1, 1, 8), "patch_embed.proj.weight": torch.zeros(8, 3, 4, 4)}
        torch.save(vit, f"{tmp}/vit.pth")
        rc, so, se = export([f"{tmp}/vit.pth", "-o", f"{tmp}/vit.h5"])
        said(rc == 1 and "'cls_token'" in se, "a ViT refused naming its first key", se)
        torch.save({"state_dict": m.state_dict(), "task": torch.nn.ReLU()}, f"{tmp}/obj.ckpt")
        rc, so, se = export([f"{tmp}/obj.ckpt", "-o", f"{tmp}/obj.h5"])
        said(rc == 1 and "--trust-pickle" in se and "torch.nn.modules.activation.ReLU" in se,
             "a pickle naming a class refused without --trust-pickle, naming it", se)
        rc, so, se = export([f"{tmp}/obj.ckpt", "-o", f"{tmp}/obj.h5", "--trust-pickle"])
        said(rc == 0 and "full unpickler" in so, "... and read with --trust-pickle, saying so",
             so + se)
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
