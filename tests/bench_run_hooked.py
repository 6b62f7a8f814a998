#!/usr/bin/python3
"""bench/run_hooked (the CUDA backend's allocation-failure test hook, which left
the public API in issue 28) runs a workflow as `tilewise run -q` does: on the CPU,
where the hook has nothing to act on, it writes the CLI's bytes and a run.json
saying ok; without its two arguments it is a usage error (exit 2) and writes
nothing. The GPU side (batch halvings under the hook) is bench/gpu_memory_sweep.py
part 2, on the device machine."""
import glob
import os
import subprocess
import sys
import tempfile

from e2eutil import BIN, SRC, check, write_workflow

HOOKED = sys.argv[1]


def tifs(d):
    return {os.path.basename(p): open(p, "rb").read() for p in sorted(glob.glob(d + "/*.tif"))}


def main():
    if not (BIN and SRC):
        print("TW_BIN/TW_SOURCE_DIR not set: skipped")
        return 77
    import json
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("cli", "hooked"):
            write_workflow(f"{tmp}/{name}.yaml", f"{tmp}/{name}",
                           f"{SRC}/sample_data/L7_ETMs.tif", stride=32, products="[class, prob]")
        r = subprocess.run([BIN, "run", f"{tmp}/cli.yaml", "-q"], capture_output=True, text=True)
        check(r.returncode == 0, f"the CLI's run ({r.stderr.strip()[-300:]})")
        r = subprocess.run([HOOKED, f"{tmp}/hooked.yaml", "1024"], capture_output=True, text=True)
        check(r.returncode == 0, f"run_hooked ran the workflow ({r.stderr.strip()[-300:]})")
        a, b = tifs(f"{tmp}/cli"), tifs(f"{tmp}/hooked")
        # (TILEWISE_RUN holds the byte keys, not output.dir: the files are equal)
        check(len(a) == 2 and a.keys() == b.keys() and all(a[k] == b[k] for k in a),
              "run_hooked wrote the CLI's bytes")
        rep = json.load(open(f"{tmp}/hooked/run.json"))
        check(rep["status"] == "ok" and rep["inputs"][0]["tiles_classified"] > 0,
              "its run.json says ok")
        r = subprocess.run([HOOKED, f"{tmp}/hooked.yaml"], capture_output=True, text=True)
        check(r.returncode == 2 and "usage: run_hooked" in r.stderr, "one argument: usage, exit 2")
        r = subprocess.run([HOOKED, f"{tmp}/hooked.yaml", "12x"], capture_output=True, text=True)
        check(r.returncode == 2, "a size that is not a number: usage, exit 2")
        env = dict(os.environ, TW_CUDA_FAIL_ALLOC_ABOVE="100")
        r = subprocess.run([BIN, "run", f"{tmp}/cli.yaml", "-q"], capture_output=True, text=True,
                           env=env)
        check(r.returncode == 0 and "TW_CUDA_FAIL_ALLOC_ABOVE is not read any more" in r.stderr,
              "the CLI says TW_CUDA_FAIL_ALLOC_ABOVE is gone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
