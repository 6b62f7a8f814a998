#!/usr/bin/python3
"""Where the CPU backend's time goes, per layer (issue 20).

    bench/cpu_layers.py [--bin build/cpu_layers] [--iters 20] [--threads 2]
                        [--arch resnet18,resnet50] [--tile 64] [--batch 0] [--peak GFLOPS]

Runs build/cpu_layers (the CPU backend on a standard-width ResNet, synthetic
weights, batch 0 = batch: auto) under ONEDNN_VERBOSE=1 and prints a Markdown
table per net: each layer's shape, the implementation oneDNN picked, its
milliseconds (the best of --iters batches: the machine is shared, the least
disturbed batch is the closest to the layer's own time), direct-equivalent
GFLOP/s (2 N Cin Cout k^2 Hout Wout / time), its share of the summed layer
times and, with --peak (bench/sgemm_peak's GFLOP/s), the % of that peak.
ONEDNN_MAX_CPU_ISA in the environment is passed on (AVX2 on an AVX-512
machine is the AVX2 stand-in). oneDNN 2.6 prints exec lines with wall
milliseconds at ONEDNN_VERBOSE=1 ("profile" is oneDNN 3's spelling).
"""
import argparse
import os
import re
import subprocess
import sys

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SHAPE = re.compile(r"mb(\d+)_ic(\d+)oc(\d+)_ih(\d+)oh(\d+)kh(\d+)sh(\d+)")
IP = re.compile(r"mb(\d+)ic(\d+)oc(\d+)")


def layer_name(kind, impl, desc):
    m = SHAPE.search(desc)
    if kind == "convolution" and m:
        n, ci, co, ih, oh, k, s = map(int, m.groups())
        return "conv %dx%d s%d %d->%d %dx%d->%dx%d" % (k, k, s, ci, co, ih, ih, oh, oh), \
            2.0 * n * ci * co * k * k * oh * oh
    m = IP.search(desc)
    if kind == "inner_product" and m:
        # a lowered conv (GEMM): its own multiply-adds, not direct-equivalent
        n, ci, co = map(int, m.groups())
        return "GEMM %dx%d . %dx%d" % (n, ci, ci, co), 2.0 * n * ci * co
    return "%s %s" % (kind, desc), 0.0


def run(args, arch):
    env = dict(os.environ, ONEDNN_VERBOSE="1", OMP_NUM_THREADS=str(args.threads))
    out = subprocess.run([args.bin, arch, str(args.tile), str(args.batch), str(args.iters),
                          str(args.threads)], env=env, check=True, capture_output=True,
                         text=True).stdout
    header, batches, cur, cpu = "", [], [], []
    started = False
    for line in out.splitlines():
        if line.startswith("tw_layers"):
            header, started = line, True
        elif line.startswith("tw_iter"):
            batches.append(cur)
            cpu.append(float(re.search(r"cpu_s=([\d.]+)", line).group(1)))
            cur = []
        elif started and line.startswith("onednn_verbose,exec"):
            f = line.split(",")
            # exec,cpu,KIND,IMPL,PROP,MDS,ATTR,ALG,DESC,MS
            kind, impl, layouts, alg, desc, ms = f[3], f[4], f[6], f[8], f[9], float(f[10])
            src = re.search(r"src_\w+::blocked:(\w+)", layouts)
            cur.append((kind, impl, src.group(1) if src else "", alg, desc, ms))
    batches = batches[1:]  # the first batch pays oneDNN's lazy set-up
    n = len(batches[0])
    rows = []
    for i in range(n):
        kind, impl, src, alg, desc, _ = batches[0][i]
        best = min(b[i][5] for b in batches if len(b) == n)
        name, flop = layer_name(kind, impl, desc)
        if "winograd" in alg:
            impl += " (winograd)"
        rows.append((name, impl, src, best, flop))
    return header, rows, min(cpu[1:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "cpu_layers"))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--arch", default="resnet18,resnet50")
    ap.add_argument("--tile", type=int, default=64)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--peak", type=float, default=0.0)
    ap.add_argument("--merge", action="store_true",
                    help="one row per distinct (layer, implementation), times summed")
    args = ap.parse_args()
    for arch in args.arch.split(","):
        header, rows, cpu_best = run(args, arch)
        total = sum(r[3] for r in rows)
        flop = sum(r[4] for r in rows)
        print("%s (ONEDNN_MAX_CPU_ISA=%s)\n" % (header, os.environ.get("ONEDNN_MAX_CPU_ISA", "-")))
        if args.merge:
            merged = {}
            order = []
            for r in rows:
                key = (r[0], r[1], r[2])
                if key not in merged:
                    merged[key] = [0, 0.0, 0.0]
                    order.append(key)
                merged[key][0] += 1
                merged[key][1] += r[3]
                merged[key][2] += r[4]
            rows = [(("%dx " % merged[k][0]) + k[0], k[1], k[2], merged[k][1], merged[k][2])
                    for k in order]
        print("| layer | oneDNN implementation | src layout | ms | GFLOP/s | share |%s" %
              (" % peak |" if args.peak else ""))
        print("|---|---|---|---|---|---|%s" % ("---|" if args.peak else ""))
        for name, impl, src, ms, fl in rows:
            g = fl / ms * 1e-6 if ms > 0 and fl else 0.0
            print("| %s | %s | %s | %.3f | %s | %.1f %% |%s" % (
                name, impl, src, ms, "%.1f" % g if fl else "", 100.0 * ms / total,
                (" %.0f %% |" % (100.0 * g / args.peak) if fl else " |") if args.peak else ""))
        g = flop / total * 1e-6
        print("| **sum of layers** | | | %.2f | %.1f | 100 %% |%s" % (
            total, g, (" %.0f %% |" % (100.0 * g / args.peak)) if args.peak else ""))
        print("\nbest whole batch: %.1f ms process CPU time (%d iterations)\n" %
              (cpu_best * 1e3, args.iters))
    return 0


if __name__ == "__main__":
    sys.exit(main())
