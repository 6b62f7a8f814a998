#!/usr/bin/python3
"""Shards, merge, kill -9 and SIGTERM: the final outputs are always identical
to one uninterrupted, unsharded run.

* Shards 1..N run separately (--shard I/N) then `tilewise merge`: class and
  probability rasters equal pixel for pixel (and georeferencing) to a single
  run, for N = 1, 2, 3, 7. Also with --shard auto under SLURM's, Kubernetes',
  PBS, LSF and AWS Batch variables; without --shard an array task runs the
  whole raster (and says so); disagreeing indices are refused.
* kill -9 at 5 different moments of a run (committed chunks differ each
  time), then the same command again: identical outputs.
* SIGTERM: exit with the resumable code (75) within 30 s, having committed the
  chunk under way; the rerun completes identically.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from e2eutil import BIN, FIX, SRC, committed_rows, write_workflow

EXIT_INTERRUPTED = 75


def workflow(path, out, stride, products="[class, prob, tiles]"):
    write_workflow(path, out, f"{SRC}/sample_data/L7_ETMs.tif", stride=stride, products=products,
                   batch=8, threads=1)


def read_outputs(out):
    from osgeo import gdal
    import h5py
    gdal.UseExceptions()
    res = {}
    for prod in ("class", "prob"):
        ds = gdal.Open(f"{out}/L7_ETMs.{prod}.tif")
        res[prod] = ds.ReadAsArray()
        res[prod + "_geo"] = (ds.GetGeoTransform(), ds.GetProjection(), ds.RasterXSize,
                              ds.RasterYSize)
    with h5py.File(f"{out}/L7_ETMs.tiles.h5", "r") as h:
        res["tiles"] = (h["origin"][:], h["probabilities"][:])
    return res


def same(a, b):
    if a["class_geo"] != b["class_geo"] or a["prob_geo"] != b["prob_geo"]:
        return "georeferencing differs"
    if not np.array_equal(a["class"], b["class"]):
        return "class rasters differ"
    if not np.array_equal(a["prob"], b["prob"]):
        return "probability rasters differ (max %g)" % np.abs(a["prob"] - b["prob"]).max()
    oa, pa = a["tiles"]
    ob, pb = b["tiles"]
    ia, ib = np.lexsort(oa.T[::-1]), np.lexsort(ob.T[::-1])
    if not (np.array_equal(oa[ia], ob[ib]) and np.array_equal(pa[ia], pb[ib])):
        return "tile tables differ"
    return None


def main():
    if not (FIX and SRC and BIN):
        print("TW_FIXTURES/TW_SOURCE_DIR/TW_BIN not set: skipped")
        return 77
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        # --- the reference: one uninterrupted, unsharded run ---
        wf = f"{tmp}/ref.yaml"
        workflow(wf, f"{tmp}/ref", 32)
        r = subprocess.run([BIN, "run", wf, "-q"], capture_output=True, text=True)
        check(r.returncode == 0, f"reference run: {r.stderr.strip()}")
        ref = read_outputs(f"{tmp}/ref")
        check(os.listdir(f"{tmp}/ref/.tilewise") == ["attempts.jsonl"],
              "parts removed after assembly (the log of attempts stays)")

        # --- shards then merge ---
        for n in (1, 2, 3, 7):
            out = f"{tmp}/shards{n}"
            wf = f"{tmp}/shards{n}.yaml"
            workflow(wf, out, 32)
            ok = True
            for i in range(1, n + 1):
                r = subprocess.run([BIN, "run", wf, "-q", "--shard", f"{i}/{n}", "--chunk-rows", "2"],
                                   capture_output=True, text=True)
                ok = ok and r.returncode == 0
                if r.returncode != 0:
                    print(r.stderr)
            if n > 1:
                # merge before the last shard would have to refuse; here all are done
                r = subprocess.run([BIN, "merge", out], capture_output=True, text=True)
                ok = ok and r.returncode == 0
                if r.returncode != 0:
                    print(r.stderr)
            diff = same(read_outputs(out), ref) if ok else "a shard or the merge failed"
            check(diff is None, f"{n} shard(s) + merge == single run" + (f": {diff}" if diff else ""))

        # merge refuses while a shard is missing
        out = f"{tmp}/missing"
        wf = f"{tmp}/missing.yaml"
        workflow(wf, out, 32)
        subprocess.run([BIN, "run", wf, "-q", "--shard", "1/3"], capture_output=True)
        subprocess.run([BIN, "run", wf, "-q", "--shard", "3/3"], capture_output=True)
        r = subprocess.run([BIN, "merge", out], capture_output=True, text=True)
        check(r.returncode == 3 and "not finished" in r.stderr and
              not os.path.exists(f"{out}/L7_ETMs.class.tif"),
              f"merge with shard 2/3 missing refused: {r.stderr.strip()}")

        # merge refuses a manifest of another format version (a future text
        # one, the old binary TWMANIF1) with one line naming both versions,
        # exit 3, nothing written; with the manifest back, it completes.
        out = f"{tmp}/version"
        wf = f"{tmp}/version.yaml"
        workflow(wf, out, 32)
        for i in (1, 2):
            subprocess.run([BIN, "run", wf, "-q", "--shard", f"{i}/2"], capture_output=True)
        mpath = f"{out}/.tilewise/L7_ETMs/manifest"
        with open(mpath, "rb") as f:
            good = f.read()
        check(good.startswith(b"{") and b'"version": 2' in good, "the manifest is versioned text")
        for bad, want in ((good.replace(b'"version": 2', b'"version": 3'), "format version 3,"),
                          (b"TWMANIF1" + bytes(140000), 'format version 1 (binary, "TWMANIF1")')):
            with open(mpath, "wb") as f:
                f.write(bad)
            r = subprocess.run([BIN, "merge", out], capture_output=True, text=True)
            lines = r.stderr.strip().splitlines()
            check(r.returncode == 3 and len(lines) == 1 and want in r.stderr and
                  "reads version 2 only" in r.stderr and
                  not os.path.exists(f"{out}/L7_ETMs.class.tif"),
                  f"merge refuses manifest {want}: exit {r.returncode}, {r.stderr.strip()}")
        with open(mpath, "wb") as f:
            f.write(good)
        r = subprocess.run([BIN, "merge", out], capture_output=True, text=True)
        diff = same(read_outputs(out), ref) if r.returncode == 0 else r.stderr
        check(diff is None, "after the refusals, merge with the manifest restored == single run" +
              (f": {diff}" if diff else ""))

        # --shard auto under SLURM's array variables picks the shard
        out = f"{tmp}/slurm"
        wf = f"{tmp}/slurm.yaml"
        workflow(wf, out, 32)
        for task in (5, 6, 7):
            env = dict(os.environ, SLURM_ARRAY_TASK_ID=str(task), SLURM_ARRAY_TASK_COUNT="3",
                       SLURM_ARRAY_TASK_MIN="5")
            subprocess.run([BIN, "run", wf, "-q", "--shard", "auto"], env=env,
                           capture_output=True)
        r = subprocess.run([BIN, "merge", out], capture_output=True, text=True)
        diff = same(read_outputs(out), ref) if r.returncode == 0 else r.stderr
        check(diff is None, f"SLURM array tasks 5..7 + merge == single run" + (f": {diff}" if diff else ""))

        # Without --shard, a run in an array task is a whole run (one scene per
        # task is the common job script): the products at once, and run.json and
        # stderr say which it was.
        out = f"{tmp}/slurm_plain"
        wf = f"{tmp}/slurm_plain.yaml"
        workflow(wf, out, 32)
        env = dict(os.environ, SLURM_ARRAY_TASK_ID="6", SLURM_ARRAY_TASK_COUNT="3",
                   SLURM_ARRAY_TASK_MIN="5")
        r = subprocess.run([BIN, "run", wf], env=env, capture_output=True, text=True)
        diff = same(read_outputs(out), ref) if r.returncode == 0 else r.stderr
        check(diff is None, "a plain run in a SLURM array task == single run" +
              (f": {diff}" if diff else ""))
        check("a whole run of every input in this SLURM array task (SLURM_ARRAY_TASK_ID=6)"
              in r.stderr, f"its stderr says it is a whole run: {r.stderr!r}")
        with open(f"{out}/run.json") as f:
            rj = json.load(f)
        check(rj.get("sharding", "").startswith("none: a whole run in a SLURM array task") and
              "shard" not in rj, f"its run.json says so: sharding {rj.get('sharding')!r}")
        # Two batch systems' indices that name other shards: refused, not one picked.
        env = dict(os.environ, SLURM_ARRAY_TASK_ID="1", SLURM_ARRAY_TASK_COUNT="3",
                   JOB_COMPLETION_INDEX="2")
        r = subprocess.run([BIN, "run", wf, "--shard", "auto/3"], env=env, capture_output=True,
                           text=True)
        check(r.returncode == 2 and "SLURM says shard 2/3" in r.stderr and
              "Kubernetes says 3/3" in r.stderr,
              f"--shard auto with disagreeing SLURM and Kubernetes indices: exit 2 "
              f"(got {r.returncode}: {r.stderr.strip()!r})")

        # --shard auto: each batch system's array index, with its first index
        for system, var, first, arg in (("Kubernetes", "JOB_COMPLETION_INDEX", 0, "auto/3"),
                                        ("PBS", "PBS_ARRAY_INDEX", 1, "auto/3"),
                                        ("LSF", "LSB_JOBINDEX", 1, "auto/3"),
                                        ("AWS Batch", "AWS_BATCH_JOB_ARRAY_INDEX", 0, "auto")):
            out = f"{tmp}/auto_{var}"
            wf = f"{tmp}/auto.yaml"
            workflow(wf, out, 32)
            for task in range(3):
                env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
                env[var] = str(first + task)
                if var == "AWS_BATCH_JOB_ARRAY_INDEX":
                    env["AWS_BATCH_JOB_ARRAY_SIZE"] = "3"
                r = subprocess.run([BIN, "run", wf, "-q", "--shard", arg], env=env,
                                   capture_output=True, text=True)
                check(r.returncode == 0 and
                      os.path.exists(f"{out}/run.shard{task + 1:04d}-of-0003.json"),
                      f"{system} task {first + task}: shard {task + 1}/3 ({r.stderr.strip()})")
            r = subprocess.run([BIN, "merge", out], capture_output=True, text=True)
            diff = same(read_outputs(out), ref) if r.returncode == 0 else r.stderr
            check(diff is None, f"--shard {arg} under {system} + merge == single run" +
                  (f": {diff}" if diff else ""))
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        r = subprocess.run([BIN, "run", wf, "-q", "--shard", "auto"], env=env,
                           capture_output=True, text=True)
        check(r.returncode == 2 and "no array index in the environment" in r.stderr,
              f"--shard auto outside an array: exit 2 ({r.stderr.strip()})")

        # --- kill -9 at different moments, then the same command again ---
        # A moment is "right after the journal holds at least K committed rows"
        # (K = 0: before any commit), so the kills land at different places
        # whatever the machine's speed.
        wf = f"{tmp}/kill.yaml"
        out = f"{tmp}/kill"
        workflow(wf, out, 16)  # 4x the tiles of stride 32: a longer run to hit
        r = subprocess.run([BIN, "run", wf, "-q"], capture_output=True, text=True)
        check(r.returncode == 0, f"reference run (stride 16): {r.stderr.strip()}")
        ref16 = read_outputs(out)
        grid_rows = ref16["class"].shape[0]
        argv = [BIN, "run", wf, "-q", "--chunk-rows", "1"]

        def kill_when(target):
            p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            start = committed_rows(out)
            t0 = time.time()
            while p.poll() is None and time.time() - t0 < 120:
                if target == 0 and time.time() - t0 > 0.3:
                    break
                if target > 0 and committed_rows(out) - start >= target:
                    break
                time.sleep(0.005)
            p.send_signal(signal.SIGKILL)
            p.wait()
            return p.returncode, committed_rows(out)

        subprocess.run(["rm", "-rf", out])
        seen = []
        for target in (0, 2, 4, 3, 5):  # one interrupted run after another
            rc, rows = kill_when(target)
            seen.append(rows)
            print(f"     kill -9 after {target} more committed rows: exit {rc}, {rows} rows committed")
        check(len(set(seen)) >= 4 and seen[-1] < grid_rows,
              f"5 kills at different moments ({seen} rows committed of {grid_rows})")
        r = subprocess.run(argv, capture_output=True, text=True)
        check(r.returncode == 0, f"rerun after kills: {r.stderr.strip()}")
        diff = same(read_outputs(out), ref16) if r.returncode == 0 else "rerun failed"
        check(diff is None, "after 5 kill -9 and a rerun: identical to an uninterrupted run" +
              (f": {diff}" if diff else ""))
        # each moment separately: one kill, then the rerun
        for target in (0, 1, 5, 10, grid_rows - 2):
            subprocess.run(["rm", "-rf", out])
            rc, rows = kill_when(target)
            r = subprocess.run(argv, capture_output=True, text=True)
            diff = same(read_outputs(out), ref16) if r.returncode == 0 else r.stderr
            check(diff is None, f"kill -9 with {rows} rows committed, rerun: identical" +
                  (f": {diff}" if diff else ""))

        # --- SIGTERM: resumable exit within 30 s, rerun identical ---
        subprocess.run(["rm", "-rf", out])
        p = subprocess.Popen([BIN, "run", wf, "-q", "--chunk-rows", "2"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        t0 = time.time()
        while p.poll() is None and committed_rows(out) < 4 and time.time() - t0 < 120:
            time.sleep(0.005)
        t_sig = time.time()
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        took = time.time() - t_sig
        rows = committed_rows(out)
        check(p.returncode == EXIT_INTERRUPTED and took < 30,
              f"SIGTERM: exit {p.returncode} after {took:.2f} s, {rows} rows committed: {err.strip()}")
        check(not os.path.exists(f"{out}/L7_ETMs.class.tif"), "no finished product after SIGTERM")
        r = subprocess.run([BIN, "run", wf, "-q", "--chunk-rows", "2"], capture_output=True, text=True)
        diff = same(read_outputs(out), ref16) if r.returncode == 0 else r.stderr
        check(diff is None, "SIGTERM then rerun: identical" + (f": {diff}" if diff else ""))

    print(f"{0 if failures else 1} passed, {1 if failures else 0} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
