#!/usr/bin/python3
"""LeakSanitizer on whole runs of the tilewise binary (ASan build only).

The sanitizer test run (make test-asan) sets TW_SANITIZED and turns leak
detection off for the suite, because GDAL, oneDNN and libgomp keep global
caches alive until exit. This test turns it back on for a few complete runs,
with only those third-party caches suppressed (tests/lsan.supp says which and
why), so that any buffer tilewise itself forgets to free is a failure:

* the sample workflow (workflows/sample.yaml: demo HDF5 bundle, stride 32,
  class + prob + confidence), plus the tile table with embeddings;
* a sharded run (--shard 1/2, 2/2) and `tilewise merge`;
* error paths: a truncated model, a damaged raster with on_error: fail,
  `tilewise validate` and `tilewise info` on the model and the raster.
Skipped (77) when TW_SANITIZED is not set: a release binary has no LSan.
"""
import os
import shutil
import subprocess
import sys
import tempfile

FIX = os.environ.get("TW_FIXTURES")
SRC = os.environ.get("TW_SOURCE_DIR")
BIN = os.environ.get("TW_BIN")
sys.path.insert(0, os.path.join(SRC or ".", "tests", "bad_inputs"))


def sample_workflow(path, out, raster=None, weights=None, extra_products=""):
    with open(f"{SRC}/workflows/sample.yaml") as f:
        text = f.read()
    text = text.replace("path: sample_data/L7_ETMs.tif",
                        f"path: {raster or SRC + '/sample_data/L7_ETMs.tif'}")
    text = text.replace("weights: sample_data/demo_resnet18.h5",
                        f"weights: {weights or SRC + '/sample_data/demo_resnet18.h5'}")
    text = text.replace("dir: out/sample", f"dir: {out}")
    text = text.replace("device: auto ", "device: cpu  ")
    text = text.replace("products: [class, prob, confidence]",
                        f"products: [class, prob, confidence{extra_products}]")
    with open(path, "w") as f:
        f.write(text)


def leak_control(tmp):
    """LD_PRELOAD value (libasan first, then a library leaking 123 bytes in
    its constructor), or None when it cannot be built."""
    src = f"{tmp}/leak.c"
    with open(src, "w") as f:
        f.write("#include <stdlib.h>\n#include <string.h>\nvoid *volatile tw_leak_sink;\n"
                "__attribute__((constructor)) static void leak(void) {\n"
                "  char *p = malloc(123); memset(p, 1, 123); tw_leak_sink = p; tw_leak_sink = 0;\n}\n")
    try:
        asan = subprocess.run(["cc", "-print-file-name=libasan.so"], capture_output=True,
                              text=True).stdout.strip()
        r = subprocess.run(["cc", "-shared", "-fPIC", "-O0", src, "-o", f"{tmp}/leak.so"],
                           capture_output=True)
    except OSError:
        return None
    if r.returncode != 0 or not os.path.isabs(asan):
        return None
    return f"{asan}:{tmp}/leak.so"


def main():
    if not (FIX and SRC and BIN):
        print("TW_FIXTURES/TW_SOURCE_DIR/TW_BIN not set: skipped")
        return 77
    if not os.environ.get("TW_SANITIZED"):
        print("not a sanitizer build (TW_SANITIZED unset): skipped")
        return 77
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0:fast_unwind_on_malloc=0"
    env["LSAN_OPTIONS"] = (f"suppressions={SRC}/tests/lsan.supp:print_suppressions=1:"
                           "exitcode=23")
    env["OMP_NUM_THREADS"] = "2"
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        import damage
        damaged = f"{tmp}/damaged.tif"
        damage.make_tiled(f"{SRC}/sample_data/L7_ETMs.tif", damaged)
        damage.garble_block(damaged, 3, 2)
        with open(f"{FIX}/resnet18_6b_7c.safetensors", "rb") as f:
            blob = f.read()
        with open(f"{tmp}/trunc.safetensors", "wb") as f:
            f.write(blob[: len(blob) // 2])

        sample_workflow(f"{tmp}/sample.yaml", f"{tmp}/out")
        sample_workflow(f"{tmp}/tiles.yaml", f"{tmp}/out_tiles", extra_products=", embeddings")
        sample_workflow(f"{tmp}/shard.yaml", f"{tmp}/out_shard")
        sample_workflow(f"{tmp}/badmodel.yaml", f"{tmp}/out_bad",
                        weights=f"{tmp}/trunc.safetensors")
        sample_workflow(f"{tmp}/damaged.yaml", f"{tmp}/out_dmg", raster=damaged)
        runs = [
            ("sample workflow", ["run", f"{tmp}/sample.yaml", "-q"], 0),
            ("tile table + embeddings", ["run", f"{tmp}/tiles.yaml", "-q"], 0),
            ("shard 1/2", ["run", f"{tmp}/shard.yaml", "-q", "--shard", "1/2"], 0),
            ("shard 2/2", ["run", f"{tmp}/shard.yaml", "-q", "--shard", "2/2"], 0),
            ("merge", ["merge", f"{tmp}/out_shard"], 0),
            ("validate", ["validate", f"{tmp}/sample.yaml"], 0),
            ("info (model)", ["info", f"{SRC}/sample_data/demo_resnet18.h5"], 0),
            ("info (raster)", ["info", f"{SRC}/sample_data/L7_ETMs.tif"], 0),
            ("truncated model (error path)", ["run", f"{tmp}/badmodel.yaml", "-q"], 3),
            ("damaged block (error path)", ["run", f"{tmp}/damaged.yaml", "-q"], 3),
        ]
        # Positive control: a library that leaks 123 bytes at load must be
        # reported, or LeakSanitizer is not watching these runs at all.
        control = leak_control(tmp)
        if control:
            r = subprocess.run([BIN, "info", f"{SRC}/sample_data/L7_ETMs.tif"], capture_output=True,
                               text=True, env={**env, "LD_PRELOAD": control}, timeout=300)
            seen = "123 byte(s) leaked" in r.stderr
            print(f"{'control: a known leak is seen':32s} {'ok' if seen else 'FAIL'}")
            if not seen:
                print(r.stderr[-3000:])
                failures.append("control")
        else:
            print("control: no C compiler or libasan path: skipped")
        for name, args, code in runs:
            r = subprocess.run([BIN, *args], capture_output=True, text=True, env=env,
                               timeout=900)
            leaked = "LeakSanitizer" in r.stderr or r.returncode == 23
            ok = r.returncode == code and not leaked
            print(f"{name:32s} exit {r.returncode:3d}  {'ok' if ok else 'FAIL'}")
            if not ok:
                print(r.stderr[-6000:])
                failures.append(name)
    print(f"{len(runs) - len(failures)} clean, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
