#!/usr/bin/python3
"""Bounded memory, whatever the raster's size.

A 32768 x 32768 six-band raster (a VRT mosaic of copies of the real
L7_ETMs.tif, nodata elsewhere: no disk needed, the whole extent is still read
and written) and a 2048 x 2048 one made the same way are classified with
budgets of 256 MiB and 1 GiB. Peak RSS (wait4's ru_maxrss of the child, an
outside measurement) must be:
  * under the budget,
  * for 32768^2 within 10% of the peak for 2048^2 at the same budget;
and `tilewise validate`'s memory estimate within 15% of the measured peak.
Also: the run allocates nothing in the steady state (run.json's
steady_state_allocs == 0), and a budget too small for batch 1 fails at once
with the number of bytes needed.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

FIX = os.environ.get("TW_FIXTURES")
SRC = os.environ.get("TW_SOURCE_DIR")
BIN = os.environ.get("TW_BIN")
MIB = 1 << 20


def mosaic_vrt(path, size, step):
    """A size x size VRT with a copy of L7_ETMs.tif every `step` pixels on the
    diagonal band; nodata (0) elsewhere."""
    src = f"{SRC}/sample_data/L7_ETMs.tif"
    w, h = 349, 352
    places = [(o, o) for o in range(0, size - max(w, h), step)]
    bands = []
    for b in range(1, 7):
        srcs = "".join(
            f"""    <SimpleSource><SourceFilename relativeToVRT="0">{src}</SourceFilename>
      <SourceBand>{b}</SourceBand><SrcRect xOff="0" yOff="0" xSize="{w}" ySize="{h}"/>
      <DstRect xOff="{x}" yOff="{y}" xSize="{w}" ySize="{h}"/></SimpleSource>
""" for x, y in places)
        bands.append(f"""  <VRTRasterBand dataType="Byte" band="{b}">
    <NoDataValue>0</NoDataValue>
{srcs}  </VRTRasterBand>
""")
    with open(path, "w") as f:
        f.write(f"""<VRTDataset rasterXSize="{size}" rasterYSize="{size}">
  <SRS>EPSG:31985</SRS>
  <GeoTransform>288776.3, 28.5, 0, 9120748.2, 0, -28.5</GeoTransform>
  <BlockXSize>512</BlockXSize><BlockYSize>128</BlockYSize>
{''.join(bands)}</VRTDataset>
""")


def workflow(path, raster, out, memory):
    with open(path, "w") as f:
        f.write(f"""input:
  path: {raster}
  nodata: 0
model:
  weights: {FIX}/resnet18_6b_7c.safetensors
tiling:
  tile: 64
  stride: 64
  batch: auto
runtime:
  device: cpu
  memory: {memory}
output:
  dir: {out}
  products: [class, prob]
""")


def run_measured(argv):
    t0 = time.time()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate()
    # communicate() reaped the child; its rusage is in RUSAGE_CHILDREN only
    # as a maximum over all children, so run each measured child via wait4.
    return p.returncode, out.decode(), err.decode(), time.time() - t0


def peak_rss_of(argv):
    pid = os.fork()
    if pid == 0:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os.execv(argv[0], argv)
    _, status, ru = os.wait4(pid, 0)
    return os.waitstatus_to_exitcode(status), ru.ru_maxrss * 1024


def main():
    if not (FIX and SRC and BIN):
        print("TW_FIXTURES/TW_SOURCE_DIR/TW_BIN not set: skipped")
        return 77
    if os.environ.get("TW_SANITIZED"):
        print("RSS is not meaningful under AddressSanitizer: skipped")
        return 77
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        big, small = f"{tmp}/big.vrt", f"{tmp}/small.vrt"
        mosaic_vrt(big, 32768, 4096)
        mosaic_vrt(small, 2048, 1024)
        for memory, budget in [("256MiB", 256 * MIB), ("1GiB", 1024 * MIB)]:
            peaks = {}
            for name, raster in [("small", small), ("big", big)]:
                wf = f"{tmp}/{name}_{memory}.yaml"
                out = f"{tmp}/out_{name}_{memory}"
                workflow(wf, raster, out, memory)
                v = subprocess.run([BIN, "validate", wf], capture_output=True, text=True)
                check(v.returncode == 0, f"validate {name} {memory}: {v.stderr.strip()}")
                m = re.search(r"estimate ([\d.]+) (MiB|GiB)", v.stdout)
                est = float(m.group(1)) * (MIB if m.group(2) == "MiB" else 1024 * MIB) if m else 0
                t0 = time.time()
                rc, peak = peak_rss_of([BIN, "run", wf, "-q"])
                secs = time.time() - t0
                check(rc == 0, f"run {name} {memory} exit {rc}")
                with open(f"{out}/run.json") as f:
                    rep = json.load(f)
                peaks[name] = peak
                print(f"     {name:5s} budget {memory:6s}: peak RSS {peak / MIB:7.1f} MiB, "
                      f"estimate {est / MIB:7.1f} MiB, batch {rep['memory']['batch']}, "
                      f"{rep['inputs'][0]['tiles_total']} tiles in {secs:.1f} s")
                check(peak < budget, f"{name} {memory}: peak {peak / MIB:.1f} MiB under the budget")
                check(abs(est - peak) <= 0.15 * peak,
                      f"{name} {memory}: estimate {est / MIB:.1f} MiB within 15% of peak {peak / MIB:.1f} MiB")
                check(rep["inputs"][0]["steady_state_allocs"] == 0,
                      f"{name} {memory}: no allocation in the steady state "
                      f"({rep['inputs'][0]['steady_state_allocs']})")
            ratio = peaks["big"] / peaks["small"]
            check(abs(ratio - 1.0) <= 0.10,
                  f"{memory}: peak for 32768^2 is {ratio:.3f} x the peak for 2048^2 (within 10%)")

        wf = f"{tmp}/tiny.yaml"
        workflow(wf, small, f"{tmp}/out_tiny", "40MiB")
        t0 = time.time()
        r = subprocess.run([BIN, "run", wf, "-q"], capture_output=True, text=True)
        check(r.returncode == 4 and "needs about" in r.stderr and time.time() - t0 < 10,
              f"too-small budget refused at once: {r.stderr.strip()}")
    print(f"{0 if failures else 1} passed, {1 if failures else 0} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
