#!/usr/bin/python3
"""A local input replaced between an interrupted run and its rerun (issue 27).

Before: the resume fingerprint held a local raster's size and type only, so a
raster replaced by another of the same size resumed: one class map of two
rasters, exit 0. Now (io/input/identity.c) every file of the dataset is fingerprinted
by size, mtime and sampled content:

* kill -9 after some chunks (--chunk-rows), the raster replaced by one of the
  same size and type with other pixels, its old mtime put back (so only the
  content tells): the rerun exits 6, one line naming the file, what changed
  and --restart; nothing deleted. --restart: exit 0, outputs equal to an
  uninterrupted run on the new raster.
* A VRT whose source .tif is replaced (SIGTERM, exit 75): exit 6 naming the
  source. Shard 2/2 run on a raster replaced after shard 1/2: exit 6.
* Same bytes: `cp -p` (mtime kept) resumes; `cp` (new mtime) is refused,
  naming the mtime (a sampled hash can miss an unsampled change; the mtime
  is what catches an in-place edit there).
"""
import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2eutil  # noqa: E402
from e2eutil import BIN, SRC  # noqa: E402

FAILURES = []


def check(cond, what):
    print(("  ok    " if cond else "  FAIL  ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def run(wf, *args, timeout=600):
    return subprocess.run([BIN, "run", wf, "-q", "--chunk-rows", "2", *args],
                          capture_output=True, text=True, timeout=timeout)


def interrupted(wf, out, sig, rows=4, timeout=300):
    """Start a run, wait for rows committed output rows, send sig; the exit code."""
    p = subprocess.Popen([BIN, "run", wf, "-q", "--chunk-rows", "2"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while time.time() - t0 < timeout and p.poll() is None and e2eutil.committed_rows(out) < rows:
        time.sleep(0.02)
    if p.poll() is None:
        p.send_signal(sig)
    p.communicate(timeout=timeout)
    return p.returncode


def products(gdal, out, stem):
    return {k: gdal.Open(f"{out}/{stem}.{k}.tif").ReadAsArray() for k in ("class", "prob")}


def same(a, b):
    import numpy as np
    return all(np.array_equal(a[k], b[k]) for k in a)


def replace_keeping_mtime(new, path):
    """Put new in place of path with path's old mtime (ns): same size, type
    and date, other bytes."""
    st = os.stat(path)
    os.replace(new, path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def main():
    gdal = e2eutil.gdal_or_skip()
    if gdal is None:
        return 77
    tmp = tempfile.mkdtemp(prefix="tw_replaced_")
    try:
        return body(gdal, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def body(gdal, tmp):
    src = os.path.join(SRC, "sample_data", "L7_ETMs.tif")
    # 2048 x 2048, 6 bands, tiled, uncompressed: the other raster has the same
    # size to the byte. Stride 32: 4096 tiles in chunks of 2 cell rows.
    opts = ["TILED=YES", "BLOCKXSIZE=256", "BLOCKYSIZE=256"]
    old, new = os.path.join(tmp, "old.tif"), os.path.join(tmp, "new.tif")
    gdal.Translate(old, src, width=2048, height=2048, resampleAlg="bilinear", creationOptions=opts)
    gdal.Translate(new, src, width=2048, height=2048, resampleAlg="bilinear", creationOptions=opts,
                   scaleParams=[[0, 255, 255, 0]])
    check(os.path.getsize(old) == os.path.getsize(new), "the two rasters have the same size")
    scene = os.path.join(tmp, "scene.tif")

    print("reference: an uninterrupted run on the new raster")
    shutil.copy(new, scene)
    wf_ref, out_ref = e2eutil.workflow(tmp, "ref", scene, stride=32, products="[class, prob]")
    r = run(wf_ref)
    check(r.returncode == 0, f"reference run exit 0 ({r.stderr.strip()[:300]})")
    ref = products(gdal, out_ref, "scene")

    print("kill -9, the raster replaced (same size, type and mtime), rerun")
    shutil.copy(old, scene)
    wf, out = e2eutil.workflow(tmp, "run", scene, stride=32, products="[class, prob]")
    rc = interrupted(wf, out, signal.SIGKILL)
    rows = e2eutil.committed_rows(out)
    check(rc == -signal.SIGKILL and rows > 0, f"killed with {rows} rows committed (exit {rc})")
    shutil.copy(new, scene + ".new")
    replace_keeping_mtime(scene + ".new", scene)
    r = run(wf)
    # (the advice's warnings about the raster's values come first: not errors)
    lines = [ln for ln in r.stderr.splitlines()
             if ln.strip() and not ln.startswith("tilewise: warning:")]
    check(r.returncode == 6, f"rerun on the replaced raster: exit 6 ({r.returncode}: "
          f"{r.stderr.strip()[:400]})")
    check(len(lines) == 1 and f"content[{scene}]" in r.stderr and "--restart" in r.stderr
          and "mtime[" not in r.stderr,
          f"one line naming the file, its content (not its mtime) and --restart ({lines})")
    check(e2eutil.committed_rows(out) == rows, "nothing was deleted")
    r = run(wf, "--restart")
    check(r.returncode == 0, f"--restart: exit 0 ({r.stderr.strip()[:300]})")
    if r.returncode == 0:
        check(same(products(gdal, out, "scene"), ref),
              "--restart: class and prob equal an uninterrupted run on the new raster")

    print("a VRT whose source is replaced")
    vsrc = os.path.join(tmp, "src.tif")
    shutil.copy(old, vsrc)
    vrt = os.path.join(tmp, "mosaic.vrt")
    gdal.BuildVRT(vrt, [vsrc])
    wf, out = e2eutil.workflow(tmp, "vrt", vrt, stride=32)
    rc = interrupted(wf, out, signal.SIGTERM)
    check(rc == 75 and e2eutil.committed_rows(out) > 0, f"SIGTERM: exit 75 with rows ({rc})")
    shutil.copy(new, vsrc + ".new")
    replace_keeping_mtime(vsrc + ".new", vsrc)
    r = run(wf)
    check(r.returncode == 6 and f"content[{vsrc}]" in r.stderr and f"[{vrt}]" not in r.stderr,
          f"VRT source replaced: exit 6 naming the source, not the VRT ({r.returncode}: "
          f"{r.stderr.strip()[:400]})")

    print("shards: shard 2/2 of a replaced raster after shard 1/2")
    shutil.copy(old, scene)
    wf, out = e2eutil.workflow(tmp, "shards", scene, stride=64)
    r = subprocess.run([BIN, "run", wf, "-q", "--shard", "1/2"], capture_output=True, text=True,
                       timeout=600)
    check(r.returncode == 0, f"shard 1/2: exit 0 ({r.stderr.strip()[:300]})")
    shutil.copy(new, scene + ".new")
    replace_keeping_mtime(scene + ".new", scene)
    r = subprocess.run([BIN, "run", wf, "-q", "--shard", "2/2"], capture_output=True, text=True,
                       timeout=600)
    check(r.returncode == 6 and f"content[{scene}]" in r.stderr,
          f"shard 2/2 on the replaced raster: exit 6 naming its content ({r.returncode}: "
          f"{r.stderr.strip()[:400]})")

    print("same bytes: cp -p resumes, cp (new mtime) is refused")
    shutil.copy2(old, scene)  # old's mtime
    wf, out = e2eutil.workflow(tmp, "copy", scene, stride=32)
    rc = interrupted(wf, out, signal.SIGTERM)
    check(rc == 75, f"SIGTERM: exit 75 ({rc})")
    subprocess.run(["cp", "-p", old, scene + ".cp"], check=True)
    os.replace(scene + ".cp", scene)
    r = run(wf)
    resumed = 0
    if r.returncode == 0:
        import json
        with open(os.path.join(out, "run.json")) as f:
            resumed = json.load(f)["inputs"][0].get("rows_resumed", 0)
    check(r.returncode == 0 and resumed > 0,
          f"cp -p (same bytes, same mtime): resumed {resumed} rows ({r.stderr.strip()[:300]})")
    shutil.rmtree(out)
    rc = interrupted(wf, out, signal.SIGTERM)
    check(rc == 75, f"SIGTERM again: exit 75 ({rc})")
    time.sleep(0.01)
    subprocess.run(["cp", old, scene + ".cp"], check=True)
    os.replace(scene + ".cp", scene)
    r = run(wf)
    check(r.returncode == 6 and f"mtime[{scene}]" in r.stderr and "content[" not in r.stderr,
          f"cp (same bytes, new mtime): exit 6 naming the mtime only ({r.returncode}: "
          f"{r.stderr.strip()[:400]})")
    return finish()


def finish():
    print("FAILED: " + "; ".join(FAILURES) if FAILURES else "all passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
