#!/usr/bin/python3
"""Remote-input read-ahead: tilewise runs over tests/httpfault.py with a
fixed per-request latency, one GDAL HTTP setting changed at a time.

  bench/remote_read.py BUILD/tilewise RASTER [--latency 0.05] [--rounds 2]
                       [--only NAME,...] [--set key=value]...

RASTER is served from a temporary folder; each configuration runs the
fixture ResNet-18 (BUILD/fixtures/resnet18_6b_7c.safetensors, 6 bands) with
products [class] on it. Rounds alternate the configurations so that load
from other processes spreads over all of them. Prints, per configuration,
the median wall time, the read stage's busy time (run.json), the requests
and the bytes the server sent. Configuration values are passed as
environment variables: GDAL reads them, and tilewise leaves a read-ahead
option the user set alone (io/url.h).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import httpfault  # noqa: E402

# GDAL 3.6's own defaults, spelled out, as the baseline.
GDAL_DEFAULTS = {"GDAL_HTTP_MERGE_CONSECUTIVE_RANGES": "NO", "GDAL_HTTP_MULTIRANGE": "PARALLEL",
                 "VSI_CACHE": "FALSE", "CPL_VSIL_CURL_CHUNK_SIZE": "16384",
                 "GDAL_INGESTED_BYTES_AT_OPEN": "16384", "GDAL_DISABLE_READDIR_ON_OPEN": "FALSE"}

CONFIGS = [
    ("gdal-defaults", {}),
    ("merge-ranges", {"GDAL_HTTP_MERGE_CONSECUTIVE_RANGES": "YES"}),
    ("multirange-serial", {"GDAL_HTTP_MULTIRANGE": "SERIAL"}),
    ("multirange-single-get", {"GDAL_HTTP_MULTIRANGE": "SINGLE_GET"}),
    ("vsi-cache-25MB", {"VSI_CACHE": "TRUE", "VSI_CACHE_SIZE": str(25 << 20)}),
    ("chunk-64KB", {"CPL_VSIL_CURL_CHUNK_SIZE": str(64 << 10)}),
    ("chunk-256KB", {"CPL_VSIL_CURL_CHUNK_SIZE": str(256 << 10)}),
    ("chunk-1MB", {"CPL_VSIL_CURL_CHUNK_SIZE": str(1 << 20)}),
    ("ingest-64KB", {"GDAL_INGESTED_BYTES_AT_OPEN": str(64 << 10)}),
    ("no-readdir", {"GDAL_DISABLE_READDIR_ON_OPEN": "EMPTY_DIR"}),
    ("tilewise-defaults", None),  # nothing set: what tilewise chooses
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tilewise")
    ap.add_argument("raster")
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default="")
    ap.add_argument("--set", action="append", default=[], help="extra workflow --set")
    a = ap.parse_args()
    fix = os.path.join(os.path.dirname(os.path.abspath(a.tilewise)), "fixtures")
    tmp = tempfile.mkdtemp(prefix="tw_remote_bench_")
    try:
        shutil.copy(a.raster, os.path.join(tmp, "scene.tif"))
        srv = httpfault.serve(tmp)
        base = f"http://127.0.0.1:{srv.server_port}"

        def ctl(q=""):
            with urllib.request.urlopen(base + "/__ctl?" + q) as r:
                return json.load(r)

        wf = os.path.join(tmp, "bench.yaml")
        with open(wf, "w") as f:
            f.write(f"""input:
  path: {base}/scene.tif
model:
  weights: {fix}/resnet18_6b_7c.safetensors
tiling:
  tile: 64
runtime:
  device: cpu
  memory: 1GiB
output:
  dir: {tmp}/out
  products: [class]
""")
        configs = [c for c in CONFIGS if not a.only or c[0] in a.only.split(",")]
        res = {name: [] for name, _ in configs}
        for rnd in range(a.rounds):
            for name, cfg in (configs if rnd % 2 == 0 else configs[::-1]):
                env = dict(os.environ)
                for k in list(GDAL_DEFAULTS) + ["VSI_CACHE_SIZE"]:
                    env.pop(k, None)
                if cfg is not None:
                    env.update(GDAL_DEFAULTS)
                    env.update(cfg)
                shutil.rmtree(os.path.join(tmp, "out"), ignore_errors=True)
                ctl(f"reset=1&latency={a.latency}")
                args = [a.tilewise, "run", wf, "-q"]
                for s in a.set:
                    args += ["--set", s]
                t0 = time.monotonic()
                r = subprocess.run(args, env=env, capture_output=True, text=True)
                wall = time.monotonic() - t0
                c = ctl()
                if r.returncode != 0:
                    sys.exit(f"{name}: exit {r.returncode}: {r.stderr}")
                with open(os.path.join(tmp, "out", "run.json")) as f:
                    rep = json.load(f)
                rd = rep["inputs"][0]["stages"]["read"]
                res[name].append((wall, rd["busy_s"], c["requests"], c["bytes"],
                                  rd.get("workers", 1)))
        print(f"latency {a.latency * 1000:.0f} ms per request, {a.rounds} rounds, {a.set}, "
              f"raster {os.path.basename(a.raster)} ({os.path.getsize(a.raster)} bytes)")
        print(f"| configuration | wall s (median) | read busy s | requests | MB sent | readers |")
        print("|---|---|---|---|---|---|")
        for name, _ in configs:
            rows = res[name]
            print(f"| {name} | {statistics.median(r[0] for r in rows):.2f} | "
                  f"{statistics.median(r[1] for r in rows):.2f} | "
                  f"{int(statistics.median(r[2] for r in rows))} | "
                  f"{statistics.median(r[3] for r in rows) / 1e6:.1f} | {rows[0][4]} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
