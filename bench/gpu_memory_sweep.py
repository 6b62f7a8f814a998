#!/usr/bin/env python3
"""tilewise's device memory against runtime.memory, and the forced allocation
failure, on a GPU (issue 4).

1. Budget sweep. ResNet-50 on 224-pixel tiles, fp16, tiling.batch auto, for
   each runtime.memory in --budgets: the batch tilewise picked
   (run.json memory.batch), its device arena (backend_stats.device_peak_bytes),
   the budget's workspace item (memory.items.workspace, the estimate the arena
   must stay under), the host peak RSS, and what nvidia-smi saw the GPU use
   during the run above the idle baseline (sampled every 0.1 s: CUDA context
   and cuDNN's kernels included, which the arena does not count).
   Check: device_peak_bytes < budget, and device_peak_bytes <= the estimate.
   The auto batch is capped at 256 on the GPU, so large budgets level off.

2. Forced allocation failure. ResNet-50, 224, fp32, fixed batch 64, products
   class + prob. A first run gives the arena size P. Then the same run through
   bench/run_hooked (--hooked) with the test hook at P-1 (reserve treats any
   arena above it as cudaErrorMemoryAllocation, see cuda/README.md) and at P/4.
   Check: backend_stats.batch_halvings >= 1 (>= 2 for P/4), the arena under the
   limit, the "batch lowered" notice on stderr, and outputs equal
   to the unforced run's: the class raster byte for byte, the probabilities
   within 1e-5 (a smaller batch may make cuDNN pick other algorithms, so bitwise
   equality of floats is reported but not required).

How the outputs are compared without GDAL (the GPU machine has none for
Python): tilewise writes them with creation_options [COMPRESS=NONE], and
gpu_vs_torch.read_tiff() reads the pixel arrays of an uncompressed GeoTIFF
with numpy alone. Comparing whole files would fail on the metadata (the
TILEWISE_RUN tag holds the run's own settings), so pixels are compared.

usage: bench/gpu_memory_sweep.py --bin PATH/tilewise-gpu [--quick] [--json FILE]
Exit status 0 when every check holds, 1 when one fails. Without a GPU it stops
at once with a clear message; --device cpu runs the plumbing as a dry run (the
device checks then cannot hold).
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_vs_torch as g  # noqa: E402

GIB = 1 << 30


def parse_size(s):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[:-len(u)]) * m)
    return int(s)


def gpu_used_mib():
    """memory.used of GPU 0 in MiB per nvidia-smi, or None without it."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                            "-i", "0"], capture_output=True, text=True, timeout=10)
        return float(r.stdout.strip().splitlines()[0]) if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, IndexError, ValueError):
        return None


def run_polled(binary, workflow, out_dir, env_extra=None, timeout=600):
    """g.run_tilewise, while a thread samples nvidia-smi every 0.1 s. Returns
    (run.json, stderr, peak GPU memory above the idle baseline in bytes or
    None). Raises RuntimeError with tilewise's stderr when it fails."""
    base = gpu_used_mib()
    peak = [base]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            u = gpu_used_mib()
            if u is not None and (peak[0] is None or u > peak[0]):
                peak[0] = u
            stop.wait(0.1)

    th = threading.Thread(target=sample, daemon=True)
    if base is not None:
        th.start()
    try:
        rep, err = g.run_tilewise(binary, workflow, out_dir, env_extra, timeout)
    finally:
        stop.set()
        if base is not None:
            th.join()
    seen = None if base is None else int((peak[0] - base) * (1 << 20))
    return rep, err, seen


def gib(x):
    return "-" if x is None else f"{x / GIB:.2f}"


def sweep(a, raster, weights, precision):
    rows, ok = [], True
    print(f"\n1. budget sweep: resnet50, tile 224, {precision}, batch auto, "
          f"raster {a.size} x {a.size} x 6 uint8")
    hdr = (f"{'budget':>8} {'batch':>6} {'arena GiB':>10} {'estimate GiB':>13} "
           f"{'nvidia-smi GiB':>15} {'host RSS GiB':>13}  check")
    print(hdr)
    print("-" * len(hdr))
    for b in a.budgets.split(","):
        budget = parse_size(b.strip())
        out_dir = os.path.join(a.work, f"sweep_{b.strip()}")
        wf = g.write_workflow(os.path.join(a.work, f"sweep_{b.strip()}.yaml"), raster, weights,
                              "resnet50", 224, "auto", a.device, precision, b.strip(), out_dir)
        try:
            rep, _, seen = run_polled(a.bin, wf, out_dir)
        except RuntimeError as e:
            # a budget too small for batch 1 is refused up front: that is an answer, not a crash
            msg = str(e).strip().splitlines()[-1]
            refused = "too small" in msg
            ok &= refused
            rows.append({"budget": budget, "error": msg, "refused": refused})
            print(f"{b:>8} {'-':>6} {'-':>10} {'-':>13} {'-':>15} {'-':>13}  "
                  f"{'refused' if refused else 'FAIL'}: {msg}")
            continue
        st, mem = rep["backend_stats"], rep["memory"]
        arena, est = st["device_peak_bytes"], mem["items"]["workspace"]
        good = 0 < arena < budget and arena <= est
        ok &= good
        rows.append({"budget": budget, "batch": mem["batch"], "device_peak_bytes": arena,
                     "workspace_estimate": est, "nvidia_smi_bytes": seen,
                     "peak_rss_bytes": rep["peak_rss_bytes"], "ok": good})
        print(f"{b:>8} {mem['batch']:>6} {gib(arena):>10} {gib(est):>13} {gib(seen):>15} "
              f"{gib(rep['peak_rss_bytes']):>13}  {'ok' if good else 'FAIL'}"
              + ("" if good else f" (arena {arena} vs budget {budget}, estimate {est})"))
    return rows, ok


def compare_outputs(ref_dir, got_dir, stem):
    """Pixel comparison of class and prob rasters; a dict of findings."""
    res = {}
    for prod in ("class", "prob"):
        ra = g.read_tiff(os.path.join(ref_dir, f"{stem}.{prod}.tif"))
        rb = g.read_tiff(os.path.join(got_dir, f"{stem}.{prod}.tif"))
        if ra.shape != rb.shape:
            res[prod] = {"shape": [list(ra.shape), list(rb.shape)], "equal": False}
            continue
        d = {"equal": bool(np.array_equal(ra, rb))}
        if prod == "class":
            d["cells_differing"] = int(np.count_nonzero(ra != rb))
        else:
            d["max_abs_diff"] = float(np.max(np.abs(ra.astype(np.float64) - rb)))
        res[prod] = d
    return res


def run_hooked(hooked, workflow, out_dir, limit, timeout=600):
    """bench/run_hooked WORKFLOW LIMIT (hooked: its command line, e.g. the pack's
    env.sh then the binary); returns (run.json as a dict, stderr)."""
    if not hooked:
        raise RuntimeError("no --hooked command: the forced part runs bench/run_hooked")
    cmd = shlex.split(hooked) + [workflow, str(limit)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr.strip()}")
    with open(os.path.join(out_dir, "run.json")) as f:
        return json.load(f), r.stderr


def forced(a, raster, weights, precision):
    print(f"\n2. forced allocation failure: resnet50, tile 224, {precision}, batch 64, class + prob")
    stem = os.path.splitext(os.path.basename(raster))[0]
    out_ref = os.path.join(a.work, "forced_ref")
    wf = g.write_workflow(os.path.join(a.work, "forced_ref.yaml"), raster, weights, "resnet50", 224,
                          64, a.device, precision, "16GiB", out_ref, ("class", "prob"))
    rep, _ = g.run_tilewise(a.bin, wf, out_ref)
    arena = rep["backend_stats"]["device_peak_bytes"]
    print(f"unforced: batch {rep['memory']['batch']}, arena {arena} bytes, "
          f"halvings {rep['backend_stats']['batch_halvings']}")
    results, ok = [{"limit": None, "device_peak_bytes": arena, "batch": rep["memory"]["batch"],
                    "batch_halvings": rep["backend_stats"]["batch_halvings"]}], True
    if arena <= 0:
        print("FAIL: the unforced run reports no device arena (backend_stats.device_peak_bytes 0): "
              "not a CUDA run, so there is nothing to force")
        return results, False
    for limit, want in ((arena - 1, 1), (arena // 4, 2)):
        out = os.path.join(a.work, f"forced_{want}")
        wf = g.write_workflow(os.path.join(a.work, f"forced_{want}.yaml"), raster, weights,
                              "resnet50", 224, 64, a.device, precision, "16GiB", out,
                              ("class", "prob"))
        row = {"limit": limit, "want_halvings": want}
        try:
            rep, err = run_hooked(a.hooked, wf, out, limit)
        except RuntimeError as e:
            row["error"] = str(e)
            ok = False
            results.append(row)
            print(f"hook at {limit}: FAIL: {e}")
            continue
        st = rep["backend_stats"]
        row.update(batch=rep["memory"]["batch"], batch_halvings=st["batch_halvings"],
                   device_peak_bytes=st["device_peak_bytes"],
                   stderr_says=[ln for ln in err.splitlines() if "batch lowered" in ln],
                   outputs=compare_outputs(out_ref, out, stem))
        cmp_ = row["outputs"]
        good = (st["batch_halvings"] >= want and 0 < st["device_peak_bytes"] <= limit
                and bool(row["stderr_says"]) and cmp_["class"]["equal"]
                and cmp_["prob"].get("max_abs_diff", 1.0) <= 1e-5)
        row["ok"] = good
        ok &= good
        results.append(row)
        print(f"hook at {limit}: halvings {st['batch_halvings']} (want >= {want}), "
              f"arena {st['device_peak_bytes']}, stderr: {'; '.join(row['stderr_says']) or '(none)'}")
        print(f"    class raster equal: {cmp_['class']['equal']} "
              f"({cmp_['class'].get('cells_differing', '?')} cells differ); prob max |dp| "
              f"{cmp_['prob'].get('max_abs_diff', float('nan')):.3g}, bitwise equal "
              f"{cmp_['prob']['equal']}  -> {'ok' if good else 'FAIL'}")
    return results, ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring (head -40 of this file).")
    ap.add_argument("--bin", required=True, help="tilewise to run (the tilewise-gpu wrapper, ...)")
    ap.add_argument("--quick", action="store_true", help="budgets 1GiB,4GiB only")
    ap.add_argument("--budgets", default=None, help="comma list (default 1GiB,2GiB,4GiB,8GiB)")
    ap.add_argument("--size", type=int, default=4480, help="raster side (4480: 400 tiles of 224)")
    ap.add_argument("--work", default="/tmp/tw_gpu_memory")
    ap.add_argument("--json", help="also write every figure to this JSON file")
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--skip-forced", action="store_true")
    ap.add_argument("--hooked", default=None,
                    help="command line of bench/run_hooked (the forced part's runs)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: dry run of the plumbing without a GPU")
    a = ap.parse_args()
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"gpu_memory_sweep.py: --bin {a.bin}: not an executable file")
    g.require_gpu(a.device)
    a.budgets = a.budgets or ("1GiB,4GiB" if a.quick else "1GiB,2GiB,4GiB,8GiB")
    os.makedirs(a.work, exist_ok=True)
    raster = g.make_raster(os.path.join(a.work, f"scene_{a.size}.bil"), a.size)
    weights = g.write_weights("resnet50", 50, os.path.join(a.work, "resnet50_6b_10c.safetensors"))
    report, ok = {"device": a.device}, True
    if not a.skip_sweep:
        report["sweep"], good = sweep(a, raster, weights, "fp16" if a.device == "cuda" else "fp32")
        ok &= good
    if not a.skip_forced:
        report["forced"], good = forced(a, raster, weights, "fp32")
        ok &= good
    print(f"\n{'all checks hold' if ok else 'SOME CHECKS FAILED'}"
          + (" (dry run on the CPU: device checks cannot hold)" if a.device == "cpu" else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
