#!/usr/bin/env python3
"""tilewise on the GPU against PyTorch on the same GPU (issue 4).

Two cases, each the same network on both sides (torchvision layout, conv1 for
6 bands, 10 classes, batch norm randomized from a fixed seed, weights handed
to tilewise as safetensors), the same batch size, fp16:

  r50: ResNet-50 on 224-pixel tiles, batch 256
  r18: ResNet-18 on 64-pixel tiles,  batch 1024

Measured:
  tilewise e2e      `tilewise run` (runtime.device cuda, precision fp16) on a
                    6-band uint8 raster: GDAL reads it, raw pixels cross the bus,
                    normalize + network + softmax on the device, class raster
                    written. tiles/s = run.json inputs[0].tiles_classified /
                    inputs[0].seconds; also tiles / backend_stats.compute_s
                    (device compute only) and copy_in_s / copy_hidden_s.
  torch model-only  random uint8 batches already on the device -> normalize ->
                    channels_last fp16 model -> softmax; no host work at all.
  torch e2e         the same raster as a numpy array in host memory: tiles are
                    cut into pinned uint8 buffers (two, alternating), copied to
                    the device each batch (non_blocking), then as model-only.
                    Reading the file is NOT counted (it is loaded before the
                    clock starts); tilewise's figure includes its GDAL reads.
Each torch variant runs eager and under torch.compile (mode max-autotune,
falling back to the default mode when that fails or runs past
--compile-timeout). Every torch measurement runs in its own child process, so a
failing or hanging compile cannot take the benchmark down.

Goals (issue 4): tilewise >= 1.5x torch eager, >= 1.0x torch compiled. The
table gives tilewise e2e / torch for every variant; the verdict lines use the
torch e2e variants (same work on both sides) and also say how tilewise fares
against model-only torch, the stricter comparison.

Sanity: the argmax of every tile from torch eager e2e is compared with
tilewise's class raster (fp16 on both sides, so a few near-ties may differ).

The raster is an ENVI file (flat band-interleaved-by-line uint8 + .hdr),
written with numpy alone because the GPU machine has no GDAL for Python; the
packed tilewise reads it through its own GDAL. Outputs are written uncompressed
(COMPRESS=NONE), so read_tiff() below reads them back without GDAL.

usage: bench/gpu_vs_torch.py --bin PATH/tilewise-gpu [--quick] [--work DIR]
       [--json FILE] [--cases r50,r18] [--compile-mode max-autotune]
       bench/gpu_vs_torch.py --make-raster FILE.bil --size N   (only the raster)
On a machine without a GPU it stops at once with a clear message; --device cpu
runs the whole plumbing on the CPU (fp32, tiny sizes) as a dry run.
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import time

try:
    import numpy as np
except ImportError:
    sys.exit(f"{os.path.basename(sys.argv[0])}: numpy is not importable by {sys.executable}; run this "
             "with the python3 that holds numpy and torch (on the GPU machine: python3; here: "
             "/usr/bin/python3)")

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(REPO, "tools"))
import safetensors_io  # noqa: E402

BANDS = 6
N_CLASSES = 10
MEAN = [127.5] * BANDS  # uniform uint8 pixels: mean 127.5, std ~73.9
STD = [73.9] * BANDS
CASES = {
    "r50": {"arch": "resnet50", "tile": 224, "batch": 256, "seed": 50},
    "r18": {"arch": "resnet18", "tile": 64, "batch": 1024, "seed": 18},
}
# 24640 = 110 x 224 = 385 x 64: whole tiles for both cases, 3.6 GB of pixels.
FULL_SIZE = 24640
QUICK_SIZE = 4480  # 20 x 224 = 70 x 64


def log(*a):
    print(*a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- raster ----

def envi_header_path(bil):
    return os.path.splitext(bil)[0] + ".hdr"


def make_raster(bil, size, seed=4):
    """Write a size x size x 6 uint8 ENVI raster (BIL) at bil, plus its .hdr,
    unless one of that size is already there. Pixels: uniform random from a
    fixed seed (every tile differs). Returns bil."""
    hdr = envi_header_path(bil)
    nbytes = size * size * BANDS
    if os.path.exists(bil) and os.path.exists(hdr) and os.path.getsize(bil) == nbytes:
        with open(hdr) as f:
            text = f.read()
        if f"samples = {size}\n" in text and f"lines = {size}\n" in text:
            return bil
    os.makedirs(os.path.dirname(os.path.abspath(bil)), exist_ok=True)
    rng = np.random.default_rng(seed)
    tmp = bil + ".part"
    rows = max(1, (64 << 20) // (size * BANDS))  # ~64 MiB per chunk
    with open(tmp, "wb") as f:
        for r0 in range(0, size, rows):
            n = min(rows, size - r0)
            # BIL: for each line, band 1's samples, then band 2's, ...
            rng.integers(0, 256, size=(n, BANDS, size), dtype=np.uint8).tofile(f)
    with open(hdr + ".part", "w") as f:
        f.write("ENVI\n"
                f"description = {{tilewise GPU benchmark: uniform random uint8, seed {seed}}}\n"
                f"samples = {size}\nlines = {size}\nbands = {BANDS}\n"
                "header offset = 0\nfile type = ENVI Standard\ndata type = 1\n"
                "interleave = bil\nbyte order = 0\n"
                "map info = {UTM, 1, 1, 500000, 5000000, 10, 10, 33, North, WGS-84, units=Meters}\n")
    os.replace(tmp, bil)
    os.replace(hdr + ".part", hdr)
    return bil


def load_raster(bil, size):
    """The raster as a (rows, bands, cols) uint8 array in memory."""
    return np.fromfile(bil, dtype=np.uint8).reshape(size, BANDS, size)


# ------------------------------------------------------- TIFF, no GDAL -----

_TIFF_TYPES = {1: "B", 3: "H", 4: "I", 6: "b", 8: "h", 9: "i", 16: "Q", 17: "q"}


def read_tiff(path):
    """First image of an uncompressed TIFF or BigTIFF (strips or tiles, pixel
    or band interleaved) as a (bands, rows, cols) numpy array. Raises
    ValueError for anything else (a compressed file, say): the benchmarks ask
    tilewise for COMPRESS=NONE so that this is all they need."""
    with open(path, "rb") as f:
        data = f.read()
    bo = {b"II": "<", b"MM": ">"}.get(data[:2])
    if bo is None:
        raise ValueError(f"{path}: not a TIFF file")
    (magic,) = struct.unpack(bo + "H", data[2:4])
    big = magic == 43
    if magic not in (42, 43):
        raise ValueError(f"{path}: not a TIFF file (magic {magic})")
    if big:
        (ifd,) = struct.unpack(bo + "Q", data[8:16])
        (n,) = struct.unpack(bo + "Q", data[ifd:ifd + 8])
        entry, pos, inline = 20, ifd + 8, 8
    else:
        (ifd,) = struct.unpack(bo + "I", data[4:8])
        (n,) = struct.unpack(bo + "H", data[ifd:ifd + 2])
        entry, pos, inline = 12, ifd + 2, 4
    tags = {}
    for i in range(n):
        e = data[pos + i * entry:pos + (i + 1) * entry]
        tag, typ = struct.unpack(bo + "HH", e[:4])
        count = struct.unpack(bo + ("Q" if big else "I"), e[4:4 + (8 if big else 4)])[0]
        if typ not in _TIFF_TYPES:
            continue
        code = _TIFF_TYPES[typ]
        size = struct.calcsize(code) * count
        raw = e[entry - inline:]
        if size > inline:
            (off,) = struct.unpack(bo + ("Q" if big else "I"), raw)
            raw = data[off:off + size]
        tags[tag] = struct.unpack(bo + code * count, raw[:size])
    width, height = tags[256][0], tags[257][0]
    bits, spp = tags.get(258, (1,))[0], tags.get(277, (1,))[0]
    if tags.get(259, (1,))[0] != 1:
        raise ValueError(f"{path}: compressed (TIFF compression {tags[259][0]}); "
                         "write it with creation_options [COMPRESS=NONE]")
    fmt = tags.get(339, (1,))[0]
    dt = np.dtype({1: "u", 2: "i", 3: "f"}[fmt] + str(bits // 8)).newbyteorder(bo)
    planar = tags.get(284, (1,))[0] == 2
    per_chunk = 1 if planar else spp
    if 322 in tags:
        cw, ch, offs, counts = tags[322][0], tags[323][0], tags[324], tags[325]
    else:
        cw, ch, offs, counts = width, tags.get(278, (height,))[0], tags[273], tags[279]
    across, down = -(-width // cw), -(-height // ch)
    out = np.zeros((spp, down * ch, across * cw), dtype=dt.newbyteorder("="))
    for k, (off, cnt) in enumerate(zip(offs, counts)):
        plane, k2 = divmod(k, across * down)
        cy, cx = divmod(k2, across)
        need = ch * cw * per_chunk
        chunk = np.frombuffer(data, dtype=dt, count=min(need, cnt // dt.itemsize), offset=off)
        chunk = np.pad(chunk, (0, need - chunk.size)).reshape(ch, cw, per_chunk)
        sl = slice(plane, plane + 1) if planar else slice(0, spp)
        out[sl, cy * ch:(cy + 1) * ch, cx * cw:(cx + 1) * cw] = chunk.transpose(2, 0, 1)
    return out[:, :height, :width]


# ----------------------------------------------------------------- model ----

def make_model(arch, n_classes, seed):
    """torchvision ResNet, conv1 for 6 bands, randomized batch norm, eval."""
    import torch
    import torchvision
    torch.manual_seed(seed)
    model = getattr(torchvision.models, arch)(num_classes=n_classes)
    model.conv1 = torch.nn.Conv2d(BANDS, 64, 7, 2, 3, bias=False)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn_like(m.running_mean) * 0.1)
                m.running_var.copy_(torch.rand_like(m.running_var) + 0.5)
                m.weight.copy_(torch.rand_like(m.weight) + 0.5)
                m.bias.copy_(torch.randn_like(m.bias) * 0.1)
    return model.eval()


def write_weights(arch, seed, path):
    """The case's model as a safetensors state_dict (float32) at path."""
    if os.path.exists(path):
        return path
    model = make_model(arch, N_CLASSES, seed)
    sd = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()
          if not k.endswith("num_batches_tracked")}
    safetensors_io.save(path + ".part", sd, "F32")
    os.replace(path + ".part", path)
    return path


def load_model(arch, weights, device, dtype):
    """The model of weights on device, in dtype and channels_last."""
    import torch
    import torchvision
    model = getattr(torchvision.models, arch)(num_classes=N_CLASSES)
    model.conv1 = torch.nn.Conv2d(BANDS, 64, 7, 2, 3, bias=False)
    sd, _ = safetensors_io.load(weights)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=False)
    return model.eval().to(device=device, dtype=dtype, memory_format=torch.channels_last)


# -------------------------------------------------------------- tilewise ----

def yaml_list(xs):
    return "[" + ", ".join(str(x) for x in xs) + "]"


def write_workflow(path, raster, weights, arch, tile, batch, device, precision, memory, out_dir,
                   products=("class",)):
    """A tilewise workflow for the benchmark raster; batch may be 'auto'."""
    with open(path, "w") as f:
        f.write(f"""input:
  path: {raster}
  bands: {yaml_list(range(1, BANDS + 1))}
model:
  weights: {weights}
  arch: {arch}
  mean: {yaml_list(MEAN)}
  std: {yaml_list(STD)}
tiling:
  tile: {tile}
  stride: {tile}
  batch: {batch}
  edge: pad
runtime:
  device: {device}
  precision: {precision}
  memory: {memory}
output:
  dir: {out_dir}
  products: {yaml_list(products)}
  format: GTiff
  creation_options: [COMPRESS=NONE]
""")
    return path


def run_tilewise(binary, workflow, out_dir, env_extra=None, timeout=600):
    """Run `tilewise run workflow -q`; returns (run.json as a dict, stderr).
    Raises RuntimeError naming the command and its stderr when it fails."""
    env = dict(os.environ)
    env.update(env_extra or {})
    cmd = [binary, "run", workflow, "-q"]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode} after {time.time() - t0:.1f} s:\n"
                           f"{r.stderr.strip()}")
    with open(os.path.join(out_dir, "run.json")) as f:
        return json.load(f), r.stderr


def tilewise_figures(rep):
    """The throughput figures of one run.json."""
    inp, st = rep["inputs"][0], rep["backend_stats"]
    tiles = inp["tiles_classified"]
    return {
        "tiles": tiles,
        "seconds": inp["seconds"],
        "tiles_per_s": tiles / inp["seconds"],
        "compute_tiles_per_s": tiles / st["compute_s"] if st["compute_s"] > 0 else None,
        "batch": rep["memory"]["batch"],
        "copy_in_s": st["copy_in_s"],
        "compute_s": st["compute_s"],
        "copy_out_s": st["copy_out_s"],
        "copy_hidden_s": st["copy_hidden_s"],
        "device_peak_bytes": st["device_peak_bytes"],
        "batch_halvings": st["batch_halvings"],
        "stages": {k: v["busy_s"] for k, v in inp.get("stages", {}).items()},
        "readers": inp.get("stages", {}).get("read", {}).get("workers"),
        "device": st.get("device"),
        "library": st.get("library"),
        "algorithms": st.get("algorithms"),
    }


# ------------------------------------------------------- torch (child) -----

def torch_child(spec):
    """One torch measurement (runs in a child process): model-only, then e2e
    when spec['raster'] is set. Returns a dict of figures."""
    import torch
    dev = torch.device(spec["device"])
    on_gpu = dev.type == "cuda"
    dtype = torch.float16 if spec["dtype"] == "fp16" else torch.float32
    tile, batch = spec["tile"], spec["batch"]
    torch.backends.cudnn.benchmark = True
    model = load_model(spec["arch"], spec["weights"], dev, dtype)
    mean = torch.tensor(MEAN, device=dev, dtype=dtype).view(1, BANDS, 1, 1)
    inv_std = (1.0 / torch.tensor(STD, device=dev, dtype=torch.float32)).to(dtype).view(1, BANDS, 1, 1)

    def step(x_u8):
        x = x_u8.to(dtype=dtype, memory_format=torch.channels_last)
        x = (x - mean) * inv_std
        return torch.softmax(model(x).float(), dim=1).argmax(dim=1)

    res = {"mode": spec["mode"]}
    fn = step
    if spec["mode"] != "eager":
        if not hasattr(torch, "compile"):
            raise RuntimeError(f"torch {torch.__version__} has no torch.compile")
        fn = torch.compile(step, mode=spec["mode"])

    def sync():
        if on_gpu:
            torch.cuda.synchronize()

    with torch.inference_mode():
        xs = [torch.randint(0, 256, (batch, BANDS, tile, tile), dtype=torch.uint8, device=dev)
              for _ in range(3)]
        t0 = time.perf_counter()
        fn(xs[0])
        sync()
        res["first_call_s"] = time.perf_counter() - t0  # includes compiling
        for i in range(spec["warmup"]):
            fn(xs[i % 3])
        sync()
        # size the timed loop from a short probe so that it lasts ~target_s
        t0 = time.perf_counter()
        for i in range(3):
            fn(xs[i % 3])
        sync()
        per = (time.perf_counter() - t0) / 3
        iters = max(3, int(spec["target_s"] / max(per, 1e-6)))
        t0 = time.perf_counter()
        for i in range(iters):
            fn(xs[i % 3])
        sync()
        dt = time.perf_counter() - t0
        res["model_only"] = {"tiles": iters * batch, "seconds": dt, "tiles_per_s": iters * batch / dt}
        if spec.get("raster"):
            res["e2e"] = torch_e2e(spec, fn, dev, sync)
    if on_gpu:
        res["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    return res


def torch_e2e(spec, fn, dev, sync):
    """Tiles cut from the raster in host memory into two alternating pinned
    buffers, copied to the device each batch, classified; argmax per tile kept.
    The last batch is padded to full size so that compiled code sees one shape."""
    import torch
    tile, batch, size = spec["tile"], spec["batch"], spec["size"]
    raw = load_raster(spec["raster"], size)
    gw = size // tile
    n_tiles = (size // tile) * gw
    if spec.get("max_tiles"):
        n_tiles = min(n_tiles, spec["max_tiles"])
    on_gpu = dev.type == "cuda"
    bufs = [torch.empty((batch, BANDS, tile, tile), dtype=torch.uint8) for _ in range(2)]
    if on_gpu:
        bufs = [b.pin_memory() for b in bufs]
    done = [None, None]
    classes = torch.empty(n_tiles, dtype=torch.int64, device=dev)

    def fill(buf, k0, n):
        i = 0
        while i < n:
            r, c = divmod(k0 + i, gw)
            m = min(n - i, gw - c)
            strip = raw[r * tile:(r + 1) * tile, :, c * tile:(c + m) * tile]  # (T, bands, m*T)
            src = strip.reshape(tile, BANDS, m, tile).transpose(2, 1, 0, 3)  # (m, bands, T, T)
            buf[i:i + m].copy_(torch.from_numpy(src))
            i += m

    t0 = time.perf_counter()
    for bi, k0 in enumerate(range(0, n_tiles, batch)):
        j = bi % 2
        if done[j] is not None:
            done[j].synchronize()  # the copy out of bufs[j] has finished
        n = min(batch, n_tiles - k0)
        fill(bufs[j], k0, n)
        x = bufs[j].to(dev, non_blocking=True)
        if on_gpu:
            done[j] = torch.cuda.Event()
            done[j].record()
        classes[k0:k0 + n] = fn(x)[:n]
    sync()
    dt = time.perf_counter() - t0
    out = {"tiles": n_tiles, "seconds": dt, "tiles_per_s": n_tiles / dt}
    if spec.get("save_classes"):
        np.save(spec["save_classes"], classes.cpu().numpy().astype(np.uint8))
    return out


def run_child(spec, timeout):
    """Run torch_child(spec) in a fresh interpreter; its result dict, or
    {'error': why} when it fails or runs past timeout seconds."""
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-child", json.dumps(spec)]
    t0 = time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"mode": spec["mode"], "error": f"ran past {timeout} s"}
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
            res["wall_s"] = time.time() - t0
            return res
    tail = (r.stderr.strip().splitlines() or ["(no output)"])[-12:]
    return {"mode": spec["mode"], "error": f"exit {r.returncode}: " + "\n".join(tail)}


# ------------------------------------------------------------------ main ----

def require_gpu(device):
    """Stop with a clear message when device is cuda and PyTorch sees no GPU."""
    if device != "cuda":
        return
    try:
        import torch
    except ImportError:
        sys.exit(f"{os.path.basename(sys.argv[0])}: PyTorch is not importable by {sys.executable}; "
                 "run this with the python3 that holds torch (on the GPU machine: python3)")
    if not torch.cuda.is_available():
        sys.exit(f"{os.path.basename(sys.argv[0])}: no CUDA device visible to PyTorch "
                 f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}): this benchmark "
                 "needs a GPU machine (see bench/RESULTS.md, 'GPU (issue 4)'); "
                 "--device cpu --quick runs the plumbing on the CPU as a dry run")


def fmt_rate(x):
    return "-" if x is None else f"{x:,.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring (head -60 of this file) for "
                                        "what each variant measures.")
    ap.add_argument("--bin", help="tilewise to run: the tilewise-gpu wrapper from "
                                  "scripts/pack_gpu.sh, its unpacked run.sh, or build*/tilewise")
    ap.add_argument("--quick", action="store_true",
                    help=f"{QUICK_SIZE}-pixel raster, short timings, compile mode 'default'")
    ap.add_argument("--work", default="/tmp/tw_gpu_bench",
                    help="folder for the raster, weights, workflows and outputs (reused)")
    ap.add_argument("--json", help="also write every figure to this JSON file")
    ap.add_argument("--cases", default="r50,r18", help="comma list of " + ", ".join(CASES))
    ap.add_argument("--size", type=int, help="raster side in pixels (default "
                    f"{FULL_SIZE}, {QUICK_SIZE} with --quick); a multiple of 224 and 64 keeps "
                    "every tile whole")
    ap.add_argument("--compile-mode", default=None,
                    help="torch.compile mode (default max-autotune; 'default' with --quick); "
                         "'none' skips compiling")
    ap.add_argument("--compile-timeout", type=int, default=420,
                    help="seconds for one compiled measurement, compile included; past it the "
                         "default mode is tried once")
    ap.add_argument("--r50-batch", type=int, default=CASES["r50"]["batch"])
    ap.add_argument("--r18-batch", type=int, default=CASES["r18"]["batch"])
    ap.add_argument("--repeat", type=int, default=2, help="tilewise runs per case (best kept)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: dry run of the plumbing without a GPU (fp32, use a small --size)")
    ap.add_argument("--make-raster", metavar="FILE.bil",
                    help="only write the benchmark raster (ENVI) of --size and exit")
    ap.add_argument("--torch-child", help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.torch_child:
        res = torch_child(json.loads(a.torch_child))
        print("RESULT " + json.dumps(res), flush=True)
        return 0
    size = a.size or (QUICK_SIZE if a.quick else FULL_SIZE)
    if a.make_raster:
        t0 = time.time()
        make_raster(a.make_raster, size)
        log(f"{a.make_raster}: {size} x {size} x {BANDS} uint8 ENVI (BIL) in {time.time() - t0:.1f} s")
        return 0
    if not a.bin:
        ap.error("--bin is required (the tilewise to benchmark)")
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"gpu_vs_torch.py: --bin {a.bin}: not an executable file")
    require_gpu(a.device)
    import torch

    cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    for c in cases:
        if c not in CASES:
            ap.error(f"--cases: unknown case {c!r} (expected {', '.join(CASES)})")
    compile_mode = a.compile_mode or ("default" if a.quick else "max-autotune")
    precision = "fp16" if a.device == "cuda" else "fp32"
    target_s = 1.0 if a.quick else 3.0
    os.makedirs(a.work, exist_ok=True)
    t0 = time.time()
    raster = make_raster(os.path.join(a.work, f"scene_{size}.bil"), size)
    log(f"raster {raster}: {size} x {size} x {BANDS} uint8 ({time.time() - t0:.1f} s)")
    gpu = torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu"
    report = {"device": gpu, "torch": torch.__version__, "raster": raster, "size": size,
              "precision": precision, "compile_mode": compile_mode, "cases": {}}
    log(f"device {gpu}, torch {torch.__version__}, precision {precision}")

    for name in cases:
        cs = dict(CASES[name])
        cs["batch"] = a.r50_batch if name == "r50" else a.r18_batch
        tile, batch, arch = cs["tile"], cs["batch"], cs["arch"]
        weights = write_weights(arch, cs["seed"], os.path.join(a.work, f"{arch}_{BANDS}b_{N_CLASSES}c.safetensors"))
        out_dir = os.path.join(a.work, f"out_{name}")
        wf = write_workflow(os.path.join(a.work, f"{name}.yaml"), raster, weights, arch, tile, batch,
                            a.device, precision, "16GiB", out_dir)
        entry = {"arch": arch, "tile": tile, "batch": batch, "tilewise_runs": []}
        report["cases"][name] = entry
        log(f"[{name}] tilewise: {arch}, tile {tile}, batch {batch}")
        try:
            for i in range(a.repeat):
                rep, err = run_tilewise(a.bin, wf, out_dir)
                if i == 0:  # the backend's own notices (unfused convolutions, batch lowered)
                    notes = [ln for ln in err.splitlines() if ln.startswith("tilewise: cuda")]
                    entry["tilewise_notices"] = notes
                    for ln in notes:
                        log(f"[{name}]   {ln}")
                entry["tilewise_runs"].append(tilewise_figures(rep))
                log(f"[{name}]   {fmt_rate(entry['tilewise_runs'][-1]['tiles_per_s'])} tiles/s")
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            entry["tilewise_error"] = str(e)
            log(f"[{name}] tilewise FAILED: {e}")
        spec = {"arch": arch, "weights": weights, "tile": tile, "batch": batch, "device": a.device,
                "dtype": "fp16" if precision == "fp16" else "fp32", "warmup": 3, "target_s": target_s,
                "raster": raster, "size": size}
        torch_runs = {}
        classes_npy = os.path.join(a.work, f"torch_classes_{name}.npy")
        log(f"[{name}] torch eager")
        torch_runs["eager"] = run_child(dict(spec, mode="eager", save_classes=classes_npy), 900)
        if compile_mode != "none":
            log(f"[{name}] torch.compile mode {compile_mode}")
            r = run_child(dict(spec, mode=compile_mode), a.compile_timeout)
            if "error" in r and compile_mode != "default":
                log(f"[{name}]   {compile_mode} failed ({r['error'].splitlines()[-1]}); trying default")
                r = dict(run_child(dict(spec, mode="default"), a.compile_timeout),
                         fallback_from=compile_mode, fallback_reason=r["error"])
            torch_runs["compiled"] = r
        entry["torch"] = torch_runs
        for k, v in torch_runs.items():
            if "error" in v:
                log(f"[{name}]   torch {k}: FAILED: {v['error'].splitlines()[-1]}")
        # argmax agreement: torch eager e2e vs tilewise's class raster
        cls_tif = os.path.join(out_dir, f"scene_{size}.class.tif")
        if os.path.exists(classes_npy) and os.path.exists(cls_tif) and entry["tilewise_runs"]:
            tw_cls = read_tiff(cls_tif)[0].reshape(-1)
            th_cls = np.load(classes_npy)
            n = min(tw_cls.size, th_cls.size)
            entry["argmax_agreement"] = float(np.mean(tw_cls[:n] == th_cls[:n]))
            entry["argmax_compared"] = int(n)
        if os.path.exists(classes_npy):
            os.remove(classes_npy)

    print_table(report)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
        log(f"figures: {a.json}")
    # 1 when a measurement is missing (tilewise or torch eager failed); goals
    # not met are findings, printed above, not failures of the benchmark
    missing = [n for n, e in report["cases"].items()
               if not e["tilewise_runs"] or "error" in e["torch"]["eager"]]
    if missing:
        print("measurements missing for: " + ", ".join(missing))
    return 1 if missing else 0


def print_table(report):
    print(f"\ndevice {report['device']}, torch {report['torch']}, {report['precision']}, raster "
          f"{report['size']} x {report['size']} x {BANDS} uint8 (ENVI, page cache)")
    hdr = f"{'case':<22} {'variant':<44} {'tiles/s':>10} {'tilewise / this':>16}"
    print(hdr)
    print("-" * len(hdr))
    verdicts = []
    for name, e in report["cases"].items():
        label = f"{name} {e['arch']} {e['tile']}px b{e['batch']}"
        runs = e["tilewise_runs"]
        best = max(runs, key=lambda r: r["tiles_per_s"]) if runs else None
        tw = best["tiles_per_s"] if best else None
        rows = []
        if best:
            rows.append(("tilewise e2e (GDAL read .. write)", tw))
            rows.append(("tilewise device compute only (tiles/compute_s)", best["compute_tiles_per_s"]))
        else:
            rows.append(("tilewise e2e: FAILED", None))
        torch_rates = {}
        for k, r in e.get("torch", {}).items():
            mode = r.get("mode", k)
            if "error" in r:
                rows.append((f"torch {mode}: FAILED", None))
                continue
            tag = "eager" if k == "eager" else f"compile({mode})"
            rows.append((f"torch {tag} model-only", r["model_only"]["tiles_per_s"]))
            torch_rates[(k, "model_only")] = r["model_only"]["tiles_per_s"]
            if "e2e" in r:
                rows.append((f"torch {tag} e2e (RAM, pinned, H2D)", r["e2e"]["tiles_per_s"]))
                torch_rates[(k, "e2e")] = r["e2e"]["tiles_per_s"]
        for i, (v, rate) in enumerate(rows):
            ratio = f"{tw / rate:.2f}x" if tw and rate else "-"
            print(f"{label if i == 0 else '':<22} {v:<44} {fmt_rate(rate):>10} {ratio:>16}")
        if best:
            print(f"{'':<22} tilewise batch {best['batch']}, copy_in {best['copy_in_s']:.2f} s, "
                  f"compute {best['compute_s']:.2f} s, copy_hidden {best['copy_hidden_s']:.2f} s, "
                  f"device peak {best['device_peak_bytes'] / 2**30:.2f} GiB, "
                  f"wall {best['seconds']:.2f} s for {best['tiles']} tiles")
        if best:
            print(f"{'':<22} readers {best.get('readers')}, stages busy "
                  + ", ".join(f"{k} {v:.2f} s" for k, v in best["stages"].items())
                  + f"; {best.get('device')}; {best.get('library')}")
            # issue 14: the device never waits on the host
            cr = best["compute_tiles_per_s"]
            if cr:
                ok = tw / cr >= 0.9
                verdicts.append(f"{name}: tilewise e2e / device compute only = {tw / cr:.2f} "
                                f"(goal >= 0.90): {'MET' if ok else 'NOT MET'}")
            if best["copy_in_s"] > 0:
                hid = best["copy_hidden_s"] / best["copy_in_s"]
                verdicts.append(f"{name}: copy_hidden_s / copy_in_s = {hid:.2f} (goal >= 0.90 when "
                                f"the device is the bottleneck): {'MET' if hid >= 0.9 else 'NOT MET'}")
        if "argmax_agreement" in e:
            print(f"{'':<22} argmax agreement tilewise vs torch eager: "
                  f"{100 * e['argmax_agreement']:.2f} % of {e['argmax_compared']} tiles")
        for k, goal in (("eager", 1.5), ("compiled", 1.0)):
            for kind in ("e2e", "model_only"):
                rate = torch_rates.get((k, kind))
                if tw and rate:
                    ok = tw / rate >= goal
                    verdicts.append(f"{name}: tilewise / torch {k} {kind.replace('_', '-')} = "
                                    f"{tw / rate:.2f} (goal >= {goal}): {'MET' if ok else 'NOT MET'}")
    print()
    for v in verdicts:
        print(v)


if __name__ == "__main__":
    sys.exit(main())
