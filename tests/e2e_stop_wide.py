#!/usr/bin/python3
"""A stop on a raster 10^7 pixels wide (issue 27): one tile row there is
312,500 tiles (stride 32), which used to be one chunk, finished after the
stop request (393 s measured). Helpers: tests/e2e_stop.py.

The raster: a VRT 10^7 x 64 pixels, 100 copies of L7_ETMs.tif's first 64
rows spread along it, and an AOI over the copies, so that ~1200 of the
312,500 tiles are classified (demo_resnet18, 64 px, stride 32: overlapping
tiles). TILED=NO: DEFLATE on 256-row tiles padded from 2 rows would make
writing the products take longer than the run.

* SIGTERM at 10 % done: exit 75 within 10 s (before: the rest of the row);
  the rerun classifies only the tiles after the stop, and its outputs are
  the uninterrupted run's, byte for byte.
* kill -9 once a periodic checkpoint of the row has been taken (its state
  file appears, TW_CHECKPOINT_S = 5 s into the row): the rerun resumes from
  it and gives the same bytes. (Skipped where the row takes less than 5 s;
  test_stages' test_periodic_checkpoint slows its batches down instead.)
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

import e2e_stop as es
from e2eutil import BIN, FIX, SRC


def main():
    if not (FIX and SRC and BIN):
        print("TW_FIXTURES/TW_SOURCE_DIR/TW_BIN not set: skipped")
        return 77
    l7 = f"{SRC}/sample_data/L7_ETMs.tif"
    weights = f"{SRC}/sample_data/demo_resnet18.h5"
    with tempfile.TemporaryDirectory() as tmp:
        vrt, aoi = f"{tmp}/wide.vrt", f"{tmp}/wide_aoi.gpkg"
        es.make_wide(l7, vrt, aoi, copies=100)
        extra_in, extra_out = f"  aoi: {aoi}\n", "  creation_options: [TILED=NO]\n"
        wf = f"{tmp}/wide.yaml"
        es.write_wf(wf, f"{tmp}/ref", vrt, weights, 64, 32, extra_in, extra_out)
        t0 = time.time()
        r = subprocess.run([BIN, "run", wf, "-q"], capture_output=True, text=True)
        es.check(r.returncode == 0, f"reference run ({time.time() - t0:.1f} s) {r.stderr.strip()}")
        ref = es.outputs(f"{tmp}/ref", "wide")
        n_ref = es.classified(f"{tmp}/ref")

        out = f"{tmp}/stop"
        es.write_wf(wf, out, vrt, weights, 64, 32, extra_in, extra_out)
        es.stop_and_resume("10^7 px wide VRT", wf, out, "wide", ref, n_ref)

        # kill -9 after a periodic checkpoint
        out = f"{tmp}/kill"
        es.write_wf(wf, out, vrt, weights, 64, 32, extra_in, extra_out)
        state = f"{out}/.tilewise/wide/state.0001-of-0001"
        rc, _ = es.stop_run([BIN, "run", wf], sig=signal.SIGKILL,
                            when=lambda: os.path.exists(state))
        if rc == 0:
            # this machine ran the row in less than the 5 s interval: no
            # checkpoint to kill after (test_stages' test_periodic_checkpoint
            # makes its batches slow instead)
            print("skip kill -9 after a checkpoint: the row took less than 5 s here")
            print(f"{0 if es.failures else 1} passed, {1 if es.failures else 0} failed")
            return 1 if es.failures else 0
        es.check(rc == -signal.SIGKILL, f"kill -9 once a checkpoint is taken (exit {rc})")
        r = subprocess.run([BIN, "run", wf, "-q"], capture_output=True, text=True)
        es.check(r.returncode == 0, f"rerun after kill -9: exit {r.returncode} "
                 f"{r.stderr.strip()[-300:]}")
        if r.returncode == 0:
            d = es.differs(es.outputs(out, "wide"), ref)
            es.check(d is None, "kill -9 after a checkpoint, rerun == uninterrupted run" +
                     (f": {d}" if d else ""))
            n = es.classified(out)
            es.check(n < n_ref, f"the rerun after kill -9 classified {n} of {n_ref} tiles: the "
                     "checkpoint was used")

    print(f"{0 if es.failures else 1} passed, {1 if es.failures else 0} failed")
    return 1 if es.failures else 0


if __name__ == "__main__":
    sys.exit(main())
