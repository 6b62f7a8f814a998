#!/usr/bin/python3
"""Reader workers (runtime.readers) change how fast tiles arrive, never what
is written: every output file is identical, byte for byte, whatever the
number of readers.

* Four layouts of the sample raster (striped GTiff as shipped; tiled DEFLATE
  with nodata 0 and a nodata block, read by libtiff; ENVI BIL; tiled with an
  internal mask), edge pad, and shift/skip on one of them: readers 1, 2 and 7
  with batch 4 (many small batches, finished out of order) write the same
  class, prob and confidence rasters and tile table as readers 1. run.json
  reports the readers (stages.read.workers) and the bytes they read.
* Shards: 3 shards with readers 3, then merge: the same bytes as one run
  with readers 1.
* kill -9 in the middle of a run with readers 2, then the same command:
  the same bytes as an uninterrupted run.
* on_error: skip on a raster with two damaged blocks: readers 3 write the
  same outputs and the same two warnings as readers 1.
"""
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2eutil import BIN, FIX, SRC, check, gdal_or_skip, workflow  # noqa: E402

PRODUCTS = "[class, prob, confidence, tiles]"


def digests(out):
    """sha256 of every finished product in out, by file name."""
    res = {}
    for f in sorted(glob.glob(f"{out}/*.tif") + glob.glob(f"{out}/*.h5")):
        if f.endswith(".h5"):
            res[os.path.basename(f)] = h5_digest(f)
        else:
            with open(f, "rb") as fh:
                res[os.path.basename(f)] = hashlib.sha256(fh.read()).hexdigest()
    return res


def h5_digest(path):
    """HDF5 files carry no timestamps here, but compare their datasets and
    attributes anyway rather than the container's bytes."""
    import h5py
    h = hashlib.sha256()
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            h.update(name.encode())
            if isinstance(obj, h5py.Dataset):
                h.update(obj[()].tobytes())
            for k in sorted(obj.attrs):
                h.update(k.encode() + repr(obj.attrs[k]).encode())
        f.visititems(visit)
    return h.hexdigest()


def run(wf, *args, readers=1):
    return subprocess.run([BIN, "run", wf, "-q", "--set", f"runtime.readers={readers}", *args],
                          capture_output=True, text=True)


def fresh(out):
    """Runs compared byte for byte write into the same directory one after
    the other: the TILEWISE_RUN metadata names output.dir."""
    shutil.rmtree(out, ignore_errors=True)


def make_layouts(gdal, tmp):
    src = f"{SRC}/sample_data/L7_ETMs.tif"
    out = {"striped": src}
    import numpy as np
    tiled = f"{tmp}/tiled_nodata.tif"
    gdal.Translate(tiled, src, creationOptions=["TILED=YES", "BLOCKXSIZE=64", "BLOCKYSIZE=64",
                                                "COMPRESS=DEFLATE"], noData=0)
    ds = gdal.Open(tiled, gdal.GA_Update)
    for b in range(1, ds.RasterCount + 1):  # a nodata block: some tiles skipped, some partial
        ds.GetRasterBand(b).WriteArray(np.zeros((90, 70), np.uint8), 130, 40)
    ds = None
    out["tiled_nodata"] = tiled
    envi = f"{tmp}/bil.envi"
    gdal.Translate(envi, src, format="ENVI", creationOptions=["INTERLEAVE=BIL"])
    out["envi_bil"] = envi
    masked = f"{tmp}/masked.tif"
    gdal.Translate(masked, src, creationOptions=["TILED=YES", "BLOCKXSIZE=32", "BLOCKYSIZE=32"])
    ds = gdal.Open(masked, gdal.GA_Update)
    ds.CreateMaskBand(gdal.GMF_PER_DATASET)
    m = np.full((ds.RasterYSize, ds.RasterXSize), 255, np.uint8)
    m[200:, :120] = 0
    ds.GetRasterBand(1).GetMaskBand().WriteArray(m)
    ds = None
    out["masked"] = masked
    return out


def test_layouts(gdal, tmp, layouts):
    print("readers 1, 2, 7 on four layouts and three edge modes")
    cases = [(name, "pad") for name in layouts] + [("tiled_nodata", "shift"),
                                                   ("envi_bil", "skip")]
    for name, edge in cases:
        ref = None
        for readers in (1, 2, 7):
            wf, out = workflow(tmp, f"{name}_{edge}", [layouts[name]], stride=32,
                               products=PRODUCTS)
            fresh(out)
            with open(wf) as f:  # batch and edge go into the tiling section
                text = f.read().replace("  tile: 64\n", "  tile: 64\n  batch: 4\n"
                                        f"  edge: {edge}\n")
            with open(wf, "w") as f:
                f.write(text)
            r = run(wf, readers=readers)
            check(r.returncode == 0, f"{name} {edge} readers {readers}: exit {r.returncode} "
                  f"{r.stderr.strip()[:300]}")
            with open(f"{out}/run.json") as f:
                rep = json.load(f)
            stage = rep["inputs"][0]["stages"]["read"]
            check(stage["workers"] == readers and rep["memory"]["readers"] == readers,
                  f"{name}: run.json says {stage['workers']} reader workers (asked {readers})")
            check(stage["bytes"] > 0, f"{name}: run.json counts the bytes read")
            d = digests(out)
            check(len(d) == 4, f"{name}: four products written ({sorted(d)})")
            if ref is None:
                ref = d
            else:
                check(d == ref, f"{name} {edge}: readers {readers} write the same bytes as "
                      "readers 1", say_ok=True)


def test_shards(tmp, layouts):
    print("3 shards with readers 3, then merge")
    wf, out = workflow(tmp, "shards", [layouts["tiled_nodata"]], stride=32, products=PRODUCTS)

    def shards_then_merge(readers):
        fresh(out)
        for i in (1, 2, 3):
            r = run(wf, "--shard", f"{i}/3", "--chunk-rows", "2", readers=readers)
            check(r.returncode == 0, f"shard {i}/3, readers {readers}: {r.stderr.strip()[:300]}")
        r = subprocess.run([BIN, "merge", out, "-q"], capture_output=True, text=True)
        check(r.returncode == 0, f"merge: {r.stderr.strip()[:300]}")
        return digests(out)

    # (a merged file's pixels equal one run's, e2e_resume; its TIFF layout
    # differs, so bytes are compared between merges)
    ref = shards_then_merge(1)
    check(shards_then_merge(3) == ref, "3 shards with readers 3 + merge: the same bytes as with "
          "readers 1", say_ok=True)


def test_kill(tmp, layouts):
    print("kill -9 mid-run with readers 2, then the same command")
    wf, out = workflow(tmp, "kill", [layouts["striped"]], stride=16, products=PRODUCTS)
    # threads and batch are in the TILEWISE_RUN metadata: the same for both
    args = [BIN, "run", wf, "-q", "--set", "runtime.threads=1", "--set", "tiling.batch=2",
            "--chunk-rows", "2"]
    r = subprocess.run(args + ["--set", "runtime.readers=1"], capture_output=True, text=True)
    check(r.returncode == 0, f"kill reference: {r.stderr.strip()[:300]}")
    ref = digests(out)
    fresh(out)
    args += ["--set", "runtime.readers=2"]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline and p.poll() is None:
        if len(glob.glob(f"{out}/.tilewise/*/rows-*.bin")) >= 2:
            break
        time.sleep(0.02)
    killed = p.poll() is None
    if killed:
        p.send_signal(signal.SIGKILL)
    p.wait()
    check(killed, "the run was killed after committing chunks, before it finished")
    r = subprocess.run(args, capture_output=True, text=True)
    check(r.returncode == 0, f"rerun after kill -9: {r.stderr.strip()[:300]}")
    with open(f"{out}/run.json") as f:
        resumed = json.load(f)["inputs"][0]["rows_resumed"]
    check(resumed > 0, f"the rerun resumed {resumed} committed rows")
    check(digests(out) == ref, "kill -9 + rerun with readers 2: the same bytes as one run",
          say_ok=True)


def test_on_error(gdal, tmp):
    print("on_error: skip with two damaged blocks, readers 1 and 3")
    sys.path.insert(0, os.path.join(SRC, "tests", "bad_inputs"))
    import damage
    good = f"{tmp}/dmg_src.tif"
    bx, by = damage.make_tiled(f"{SRC}/sample_data/L7_ETMs.tif", good)
    bad = f"{tmp}/damaged.tif"
    shutil.copy(good, bad)
    damage.garble_block(bad, 3, 2)
    damage.truncate_block_count(bad, 1, 4, bx)
    res = []
    for readers in (1, 3):
        wf, out = workflow(tmp, "dmg", [bad], products=PRODUCTS)
        fresh(out)
        with open(wf) as f:
            text = f.read().replace("input:\n", "input:\n  on_error: skip\n")
        with open(wf, "w") as f:
            f.write(text)
        r = run(wf, readers=readers)
        check(r.returncode == 0, f"on_error skip, readers {readers}: {r.stderr.strip()[:300]}")
        warnings = sorted(ln for ln in r.stderr.splitlines() if "unreadable" in ln)
        res.append((digests(out), warnings))
    check(len(res[0][1]) == 2, f"two warnings for two damaged tiles ({len(res[0][1])})")
    check(res[0] == res[1], "readers 3 write the same outputs and warnings as readers 1",
          say_ok=True)


def main():
    gdal = gdal_or_skip()
    if gdal is None:
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        layouts = make_layouts(gdal, tmp)
        test_layouts(gdal, tmp, layouts)
        test_shards(tmp, layouts)
        test_kill(tmp, layouts)
        test_on_error(gdal, tmp)
    print("e2e_readers: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
