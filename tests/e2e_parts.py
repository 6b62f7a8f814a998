#!/usr/bin/python3
"""Parts are never destroyed by a different run, and one shard runs once.

* Shards: shard 1/2 runs; shard 2/2 with another configuration
  (--set tiling.stride=32) refuses with exit 6, naming the keys that differ
  (tiling.stride, grid) and how to proceed; shard 1's committed chunks
  survive byte for byte (and with -q too). So does a shard 2/2 that differs
  in any key an output byte depends on (prob_type, resolution, format,
  products, creation_options, colours, class names). `merge` then names why rows are
  missing (shard 2/2 committed nothing). The matching shard 2/2 runs, and
  `merge` gives the same class and probability rasters as one run - with
  the manifest rewritten in the model facts' shape an earlier version wrote
  ("feat_dim", "headless"; no "feature_dim", "head", "n_classes"): parts
  run by an earlier version still merge.
* --restart discards the other configuration's parts (a notice naming the
  keys) and the run completes equal to a fresh run of that configuration.
* Single runs: a run interrupted (SIGTERM, exit 75) and rerun with another
  model.mean refuses (exit 6, naming model.mean); the original command
  finishes it, equal to one uninterrupted run.
* The same command started twice at once: one runs, the other exits 7 with
  the lock message naming the holder's pid and host; the outputs equal one
  run, and the refused process wrote no run.json over the running one's.
* A failed attempt (missing input, too small a budget) leaves the finished
  run's run.json byte for byte, writes run.failed.json, and every attempt is
  a line of .tilewise/attempts.jsonl.
"""
import glob
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np

from e2eutil import BIN, SRC, check, gdal_or_skip, write_workflow

EXIT_PARTS, EXIT_LOCKED, EXIT_INTERRUPTED = 6, 7, 75


def workflow(path, out, stride=32, extra=""):
    write_workflow(path, out, f"{SRC}/sample_data/L7_ETMs.tif", extra, stride=stride,
                   products="[class, prob]", batch=8, threads=1)


def run(*args, **kw):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600, **kw)


def outputs(gdal, out):
    return {p: gdal.Open(f"{out}/L7_ETMs.{p}.tif").ReadAsArray() for p in ("class", "prob")}


def same(a, b):
    return all(np.array_equal(a[k], b[k]) for k in ("class", "prob"))


def digests(out):
    res = {}
    for p in sorted(glob.glob(f"{out}/.tilewise/L7_ETMs/rows-*.bin")):
        with open(p, "rb") as f:
            res[os.path.basename(p)] = hashlib.sha256(f.read()).hexdigest()
    return res


def to_old_manifest(out):
    """The manifests under out in the shape written before the model facts'
    one shape (issue 35): "feat_dim" for "feature_dim", "headless" (only when
    true) for "head", no "n_classes". Returns how many were rewritten."""
    n = 0
    for p in glob.glob(f"{out}/.tilewise/*/manifest"):
        with open(p) as f:
            man = json.load(f)
        model = man["model"]
        model["feat_dim"] = model.pop("feature_dim")
        if not model.pop("head"):
            model["headless"] = True
        del model["n_classes"]
        with open(p, "w") as f:
            json.dump(man, f, indent=2)
        n += 1
    return n


def main():
    gdal = gdal_or_skip()
    if not gdal:
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        wf = f"{tmp}/w.yaml"
        ref_out = f"{tmp}/ref"
        workflow(wf, ref_out)
        r = run("run", wf, "-q")
        check(r.returncode == 0, f"reference run: {r.stderr}")
        ref = outputs(gdal, ref_out)

        # ---- shards: a mismatched shard refuses, shard 1's parts survive
        out = f"{tmp}/shards"
        r = run("run", wf, "-q", "--shard", "1/2", "--set", f"output.dir={out}")
        check(r.returncode == 0, f"shard 1/2: {r.stderr}")
        before = digests(out)
        check(len(before) > 0, "shard 1/2 committed chunks", True)
        for quiet in ([], ["-q"]):
            r = run("run", wf, *quiet, "--shard", "2/2", "--set", f"output.dir={out}", "--set",
                    "tiling.stride=16")
            lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
            check(r.returncode == EXIT_PARTS, f"mismatched shard exits 6 {quiet}, got "
                  f"{r.returncode}: {r.stderr}", True)
            check(len(lines) == 1 and "tiling.stride: 16 now, 32 in the parts" in lines[0]
                  and "--restart" in lines[0] and "original configuration" in lines[0]
                  and "nothing was deleted" in lines[0],
                  f"the refusal names the keys and how to proceed: {r.stderr.strip()}", True)
            check(digests(out) == before, "shard 1's chunks survive byte for byte", True)
        # every key an output byte depends on is compared between shards
        # (core/keys.h, TW_KEY_BYTES), not only the tiling: before, these
        # shards ran (exit 0) and merge used whichever finished last
        for key, value, shown in (
                ("output.prob_type", "uint8", "uint8 now, float32 in the parts"),
                ("output.resolution", "input", "input now, cells in the parts"),
                ("output.format", "COG", "COG now, GTiff in the parts"),
                ("output.products", "[class, prob, confidence]",
                 "[class, prob, confidence] now, [class, prob] in the parts"),
                ("output.creation_options", "[COMPRESS=LZW]", "[COMPRESS=LZW] now, [] in"),
                ("model.colors", "[" + ", ".join(f"'#00000{i}'" for i in range(7)) + "]",
                 "['#000000', '#000001', '#000002', '#000003', '#000004', '#000005', "
                 "'#000006'] now, [] in"),
                ("model.classes", "[a, b, c, d, e, f, g]", "[a, b, c, d, e, f, g] now, [")):
            r = run("run", wf, "-q", "--shard", "2/2", "--set", f"output.dir={out}", "--set",
                    f"{key}={value}")
            check(r.returncode == EXIT_PARTS and f"{key}: {shown}" in r.stderr,
                  f"shard 2/2 with {key}={value} exits 6 naming it: {r.returncode} "
                  f"{r.stderr.strip()}", True)
            check(digests(out) == before, f"shard 1's chunks survive ({key})")
        r = run("merge", out)
        check(r.returncode == 3 and "shard 2/2" in r.stderr and "committed nothing" in r.stderr,
              f"merge names the missing shard: {r.stderr.strip()}", True)
        r = run("run", wf, "-q", "--shard", "2/2", "--set", f"output.dir={out}")
        check(r.returncode == 0, f"matching shard 2/2: {r.stderr}")
        check(to_old_manifest(out) == 1, "the manifest rewritten in the earlier model shape")
        r = run("merge", "-q", out)
        check(r.returncode == 0, f"merge (a manifest of the earlier shape): {r.stderr}")
        check(same(outputs(gdal, out), ref), "merged shards equal one run", True)
        # merging again has no work: exit 0, says so, leaves no empty .tilewise/
        # (it was exit 3, "no shard outputs to merge"), also when an empty
        # .tilewise/ is there (a run stopped before its first chunk)
        for empty in (False, True):
            if empty:
                os.makedirs(f"{out}/.tilewise", exist_ok=True)
            r = run("merge", out)
            check(r.returncode == 0 and "already merged" in r.stdout and "wrote" not in r.stdout,
                  f"a second merge (empty .tilewise/: {empty}) is exit 0 and says it is merged "
                  f"already: {r.returncode} {r.stdout.strip()} {r.stderr.strip()}", True)
            left = os.listdir(f"{out}/.tilewise") if os.path.exists(f"{out}/.tilewise") else []
            check(left in ([], ["attempts.jsonl"]),
                  f"no parts left after a second merge, only the log of attempts (empty "
                  f".tilewise/ before: {empty}): {left}", True)
            check(same(outputs(gdal, out), ref), "the merged products are untouched", True)

        # ---- --restart discards the other configuration's parts
        out = f"{tmp}/restart"
        r = run("run", wf, "-q", "--shard", "1/2", "--set", f"output.dir={out}", "--set",
                "tiling.stride=16")
        check(r.returncode == 0, f"stride 16 shard: {r.stderr}")
        r = run("run", wf, "--progress=none", "--restart", "--set", f"output.dir={out}")
        check(r.returncode == 0, f"--restart run: {r.stderr}")
        check("--restart: discarding" in r.stderr and "tiling.stride" in r.stderr,
              f"--restart says what it discards: {r.stderr.strip()}", True)
        check(same(outputs(gdal, out), ref), "--restart run equals a fresh run", True)
        check(not glob.glob(f"{out}/.tilewise/L7_ETMs"), "no parts left after --restart run", True)

        # ---- single run: interrupted, rerun with another mean refuses
        out = f"{tmp}/single"
        wf2 = f"{tmp}/slow.yaml"
        workflow(wf2, out, stride=8)
        slow_ref = f"{tmp}/slowref"
        r = run("run", wf2, "-q", "--set", f"output.dir={slow_ref}")
        check(r.returncode == 0, f"stride 8 reference: {r.stderr}")
        p = subprocess.Popen([BIN, "run", wf2, "-q", "--chunk-rows", "4"],
                             stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        while time.time() < deadline and not glob.glob(f"{out}/.tilewise/L7_ETMs/rows-*.bin"):
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=120)
        if p.returncode == EXIT_INTERRUPTED:
            before = digests(out)
            r = run("run", wf2, "-q", "--set", "model.mean=[80, 67.5, 64.4, 60, 80, 60]")
            check(r.returncode == EXIT_PARTS and "model.mean: [80, 67.5" in r.stderr,
                  f"single run with another mean refuses: {r.stderr.strip()}", True)
            check(digests(out) == before, "the interrupted run's chunks survive", True)
            r = run("run", wf2, "-q")
            check(r.returncode == 0, f"original command resumes: {r.stderr}")
            check(same(outputs(gdal, out), outputs(gdal, slow_ref)),
                  "resumed single run equals one run", True)
        else:
            # 0: it finished first (fine); anything else is a crash (issue 39:
            # SIGABRT from a heap a signal frame overwrote) or a failure
            check(p.returncode == 0,
                  f"the interrupted run exits 75 (or 0, finished first), never by a signal: "
                  f"exit {p.returncode} {err.strip()[-600:]}", True)
            print(f"note: the run finished before SIGTERM (exit {p.returncode}); "
                  "single-run refusal not exercised this time")

        # ---- the same command twice at once
        out = f"{tmp}/twice"
        workflow(wf2, out, stride=8)
        # the first runs slower (batches of 1 on one thread: keys that change
        # no byte), so that it still holds the lock when the second, whose
        # checks before the first tile take seconds under the sanitizers,
        # reaches it (with the defaults it had finished first)
        a = subprocess.Popen([BIN, "run", wf2, "-q", "--set", "tiling.batch=1", "--set",
                              "runtime.threads=1"], stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 120
        lock = f"{out}/.tilewise/L7_ETMs/lock.0001-of-0001"
        while time.time() < deadline and not (os.path.exists(lock) and os.path.getsize(lock)):
            time.sleep(0.02)
        b = run("run", wf2, "-q")
        _, aerr = a.communicate(timeout=600)
        check(a.returncode == 0, f"first run: {aerr}")
        host = socket.gethostname()
        check(b.returncode == EXIT_LOCKED and f"process {a.pid} on host {host}" in b.stderr,
              f"second run exits 7 naming the holder: {b.stderr.strip()}", True)
        check(same(outputs(gdal, out), outputs(gdal, slow_ref)), "outputs equal one run", True)
        import json
        with open(f"{out}/run.json") as f:
            check(json.load(f)["status"] == "ok", "run.json is the first run's (ok)", True)

        # ---- a failed attempt never overwrites the finished run's run.json
        # (before: a later run on a missing input or with too small a budget
        # replaced it, and the provenance of good outputs was lost)
        with open(f"{out}/run.json", "rb") as f:
            good = f.read()
        for why, sets in (("missing input", ["input.path=nothere.tif"]),
                          ("too small a budget", ["runtime.memory=16MiB", "tiling.batch=4096"])):
            args = [a for s_ in sets for a in ("--set", s_)]
            r = run("run", wf2, "-q", *args)
            check(r.returncode in (3, 4), f"{why}: fails ({r.returncode} {r.stderr.strip()})")
            with open(f"{out}/run.json", "rb") as f:
                check(f.read() == good, f"{why}: run.json is still the finished run's", True)
            with open(f"{out}/run.failed.json") as f:
                failed = json.load(f)
            check(failed["status"] != "ok" and failed["exit_code"] == r.returncode,
                  f"{why}: run.failed.json reports the failure ({failed['status']})", True)
        with open(f"{out}/.tilewise/attempts.jsonl") as f:
            attempts = [json.loads(line) for line in f]
        check([a["exit_code"] for a in attempts[-2:]] != [0, 0] and
              attempts[-1]["report"].endswith("run.failed.json"),
              f"every attempt is logged in .tilewise/attempts.jsonl: {attempts}", True)
        r = run("run", wf2, "-q")
        check(r.returncode == 0 and not os.path.exists(f"{out}/run.failed.json"),
              "a finished run writes run.json and retires run.failed.json", True)
        with open(f"{out}/.tilewise/attempts.jsonl") as f:
            last = [json.loads(line) for line in f][-1]
        check(last["status"] == "ok" and last["report"].endswith("/run.json"),
              "the finished attempt is logged too", True)
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
