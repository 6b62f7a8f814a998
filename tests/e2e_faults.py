#!/usr/bin/python3
"""Faults during a run: damaged tiles, a full disk, the input deleted or cut
short mid-run. Each must end in a clear error with the documented exit code
(or a documented success), never a crash, never a half-written file under a
final name, and nothing lost: what was committed is reused by the rerun.

* input.on_error on a tiled DEFLATE GeoTIFF with two damaged blocks (one
  overwritten with garbage, one whose TileByteCounts entry is halved):
  fail -> exit 3 naming the first damaged window; skip -> exit 0,
  run.json inputs[].tiles_read_errors == 2, one warning line per damaged tile
  naming its position, those cells nodata (255 / -1), every other cell equal
  to a run on the undamaged file.
* Full disk: a 2 MiB tmpfs filled up to F bytes free, for several F: each run
  either succeeds with outputs equal to the reference, or exits 4 with one
  line saying so and leaves no finished product; after space is freed the
  same command completes with outputs equal to the reference. Skipped (with
  the reason) when tmpfs cannot be mounted.
* Input deleted mid-run (after the first committed chunk; the process is
  stopped with SIGSTOP while the file is unlinked): the open datasets keep
  reading the unlinked file, the run succeeds and equals the reference.
* Input cut short mid-run (truncated to a third): exit 3 naming the raster
  and the window, no finished product; once the file is restored the rerun
  resumes the committed rows and equals the reference.
"""
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from e2eutil import BIN, FIX, SRC, committed_rows, finished_products, write_workflow

sys.path.insert(0, os.path.join(SRC or ".", "tests", "bad_inputs"))

EXIT_INPUT, EXIT_RESOURCE = 3, 4
FAILURES = []


def check(cond, what):
    print(("  ok    " if cond else "  FAIL  ") + what)
    if not cond:
        FAILURES.append(what)
    return cond


def workflow(path, raster, out, stride=64, extra="", out_extra=""):
    write_workflow(path, out, raster, out_extra, stride=stride, products="[class, prob]", batch=8,
                   threads=1, memory="512MiB", input_extra=extra)


def outputs(out, stem):
    from osgeo import gdal
    gdal.UseExceptions()
    return {p: gdal.Open(f"{out}/{stem}.{p}.tif").ReadAsArray() for p in ("class", "prob")}


def same_outputs(a, b):
    return all(np.array_equal(a[p], b[p]) for p in ("class", "prob"))


def run(wf, *args):
    return subprocess.run([BIN, "run", wf, "-q", *args], capture_output=True, text=True,
                          timeout=600)


def stderr_lines(r):
    """Lines on stderr, less preflight's free-space warning (a full disk
    rightly gets one before the error)."""
    return [ln for ln in r.stderr.splitlines()
            if ln.strip() and "tilewise: warning: output.dir:" not in ln]


def expect_error(r, code, needles, out, what):
    lines = stderr_lines(r)
    check(r.returncode == code, f"{what}: exit {r.returncode} (expected {code})")
    check(len(lines) == 1, f"{what}: one line on stderr ({len(lines)}: {r.stderr.strip()[:300]})")
    for n in needles:
        check(n in r.stderr, f"{what}: message names '{n}'")
    left = finished_products(out) if os.path.isdir(out) else []
    check(not left, f"{what}: no finished-looking output ({left})")


# ------------------------------------------------------------------------

def test_on_error(tmp):
    import damage
    print("input.on_error on a tiled GeoTIFF with two damaged blocks")
    good = f"{tmp}/tiled.tif"
    bx, by = damage.make_tiled(f"{SRC}/sample_data/L7_ETMs.tif", good)
    bad = f"{tmp}/damaged.tif"
    shutil.copy(good, bad)
    damaged = [(3, 2), (1, 4)]  # (block x, block y): one garbled, one cut short
    damage.garble_block(bad, *damaged[0])
    damage.truncate_block_count(bad, *damaged[1], bx)

    workflow(f"{tmp}/good.yaml", good, f"{tmp}/out_good")
    r = run(f"{tmp}/good.yaml")
    if not check(r.returncode == 0, f"undamaged file runs (exit {r.returncode} {r.stderr[:200]})"):
        return
    ref = outputs(f"{tmp}/out_good", "tiled")

    workflow(f"{tmp}/fail.yaml", bad, f"{tmp}/out_fail")
    r = run(f"{tmp}/fail.yaml")
    expect_error(r, EXIT_INPUT, ["damaged.tif", "x=192 y=128"], f"{tmp}/out_fail",
                 "on_error: fail")

    workflow(f"{tmp}/skip.yaml", bad, f"{tmp}/out_skip", extra="  on_error: skip\n")
    r = run(f"{tmp}/skip.yaml")
    if not check(r.returncode == 0, f"on_error: skip: exit 0 (got {r.returncode})"):
        print(r.stderr)
        return
    lines = stderr_lines(r)
    check(len(lines) == len(damaged), f"on_error: skip: one warning per damaged tile ({len(lines)})")
    for x, y in damaged:
        check(any(f"x={x * 64} y={y * 64}" in ln and "damaged.tif" in ln for ln in lines),
              f"on_error: skip: a warning names the tile at x={x * 64} y={y * 64}")
    # The summary counts the unreadable tiles as the nodata they are written
    # as (it said "0 nodata" before).
    check(f"{len(damaged)} nodata ({len(damaged)} unreadable)" in r.stdout,
          f"on_error: skip: the summary counts the unreadable tiles as nodata ({r.stdout[:120]!r})")
    with open(f"{tmp}/out_skip/run.json") as f:
        rep = json.load(f)["inputs"][0]
    check(rep["nodata_cells"] == len(damaged),
          f"run.json nodata_cells = {rep['nodata_cells']} (expected {len(damaged)}: the unreadable "
          "tiles' cells)")
    check(rep["tiles_read_errors"] == len(damaged),
          f"run.json tiles_read_errors = {rep['tiles_read_errors']} (expected {len(damaged)})")
    got = outputs(f"{tmp}/out_skip", "damaged")
    mask = np.zeros(ref["class"].shape, bool)
    for x, y in damaged:
        mask[y, x] = True
    check((got["class"][mask] == 255).all(), "damaged cells are class nodata (255)")
    check((got["prob"][:, mask] == -1).all(), "damaged cells are probability nodata (-1)")
    check(np.array_equal(got["class"][~mask], ref["class"][~mask]),
          "other class cells equal the undamaged run")
    check(np.array_equal(got["prob"][:, ~mask], ref["prob"][:, ~mask]),
          "other probability cells equal the undamaged run")


def mount_tmpfs(d, size):
    os.makedirs(d, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", d],
                       capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip() or f"exit {r.returncode}")


def test_full_disk(tmp, ref):
    print("full disk (2 MiB tmpfs, filled to a few KiB free)")
    disk = f"{tmp}/disk"
    why = mount_tmpfs(disk, "2m")
    if why:
        print(f"  SKIP  full disk: cannot mount a tmpfs ({why})")
        return
    try:
        out = f"{disk}/out"
        wf = f"{tmp}/disk.yaml"
        # DEFLATE: GeoTIFF tiles are 256 x 256 even for this 11 x 11 grid, and
        # uncompressed the probabilities alone would not fit in 2 MiB.
        workflow(wf, f"{SRC}/sample_data/L7_ETMs.tif", out, stride=32,
                 out_extra="  creation_options: [COMPRESS=DEFLATE]\n")
        outcomes = []
        for free_kib in (0, 8, 64, 136, 144, 152, 160, 168, 176, 512):
            shutil.rmtree(out, ignore_errors=True)
            for p in glob.glob(f"{disk}/filler*"):
                os.remove(p)
            st = os.statvfs(disk)
            fill = st.f_bavail * st.f_frsize - free_kib * 1024
            if fill > 0:
                with open(f"{disk}/filler", "wb") as f:
                    f.write(b"\0" * fill)
            r = run(wf)
            what = f"{free_kib} KiB free"
            if r.returncode == 0:
                outcomes.append("ok")
                check(same_outputs(outputs(out, "L7_ETMs"), ref),
                      f"{what}: success, outputs equal the reference")
                continue
            outcomes.append(r.returncode)
            expect_error(r, EXIT_RESOURCE, [], out, what)
            check("No space left" in r.stderr or "full" in r.stderr,
                  f"{what}: message says the disk is full ({r.stderr.strip()[:200]})")
            # Free the space: the same command completes, nothing lost.
            os.remove(f"{disk}/filler")
            r2 = run(wf)
            check(r2.returncode == 0 and same_outputs(outputs(out, "L7_ETMs"), ref),
                  f"{what}: after freeing space the rerun completes equal to the reference")
        print(f"  outcomes by free space: {outcomes}")
        check(EXIT_RESOURCE in outcomes and "ok" in outcomes,
              "some free-space levels make the run fail (exit 4), the larger ones succeed")
    finally:
        subprocess.run(["umount", disk])


def start_and_stop_after_first_chunk(wf, out):
    """Start a run, SIGSTOP it as soon as one chunk is committed. Returns the
    stopped process, or None when it finished before that could be seen."""
    p = subprocess.Popen([BIN, "run", wf, "-q", "--chunk-rows", "1"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    while p.poll() is None:
        if committed_rows(out) >= 1:
            p.send_signal(signal.SIGSTOP)
            return p
        time.sleep(0.002)
    p.communicate()
    return None


def test_input_changes_mid_run(tmp, ref):
    print("input deleted / cut short mid-run")
    src = f"{SRC}/sample_data/L7_ETMs.tif"
    for how in ("deleted", "truncated"):
        raster = f"{tmp}/L7_ETMs.tif"
        shutil.copy2(src, raster)  # src's mtime: the restored copy below has it too
        out = f"{tmp}/out_{how}"
        wf = f"{tmp}/{how}.yaml"
        workflow(wf, raster, out, stride=32)
        p = start_and_stop_after_first_chunk(wf, out)
        if p is None:
            print(f"  SKIP  {how}: the run finished before its first chunk was seen")
            continue
        rows_before = committed_rows(out)
        if how == "deleted":
            os.remove(raster)
        else:
            with open(raster, "r+b") as f:
                f.truncate(os.path.getsize(src) // 3)
        p.send_signal(signal.SIGCONT)
        stdout, stderr = p.communicate(timeout=600)
        r = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
        check(r.returncode >= 0, f"{how}: no crash (exit {r.returncode})")
        if how == "deleted":
            check(r.returncode == 0, f"deleted: the open file is still read, exit 0 "
                  f"(got {r.returncode}: {r.stderr.strip()[:200]})")
            if r.returncode == 0:
                check(same_outputs(outputs(out, "L7_ETMs"), ref),
                      "deleted: outputs equal the reference")
            continue
        expect_error(r, EXIT_INPUT, ["L7_ETMs.tif", "window"], out, "truncated mid-run")
        check(committed_rows(out) >= rows_before,
              f"truncated: the {rows_before} committed row(s) are kept")
        shutil.copy2(src, raster)  # same bytes and mtime: the same raster for resume
        r2 = run(wf, "--chunk-rows", "1")
        check(r2.returncode == 0, f"truncated: rerun on the restored file exits 0 "
              f"({r2.returncode} {r2.stderr.strip()[:200]})")
        if r2.returncode == 0:
            with open(f"{out}/run.json") as f:
                resumed = json.load(f)["inputs"][0]["rows_resumed"]
            check(resumed >= rows_before, f"truncated: rerun resumed {resumed} committed rows")
            check(same_outputs(outputs(out, "L7_ETMs"), ref),
                  "truncated: rerun outputs equal the reference")


def main():
    if not (FIX and SRC and BIN):
        print("TW_FIXTURES/TW_SOURCE_DIR/TW_BIN not set: skipped")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        test_on_error(tmp)
        workflow(f"{tmp}/ref.yaml", f"{SRC}/sample_data/L7_ETMs.tif", f"{tmp}/ref", stride=32)
        r = run(f"{tmp}/ref.yaml")
        if not check(r.returncode == 0, f"reference run (exit {r.returncode})"):
            return 1
        ref = outputs(f"{tmp}/ref", "L7_ETMs")
        test_full_disk(tmp, ref)
        test_input_changes_mid_run(tmp, ref)
    print(f"{len(FAILURES)} failed" if FAILURES else "all passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
