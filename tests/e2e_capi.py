#!/usr/bin/python3
"""The public C API as a user gets it: `cmake --install` into a temporary
prefix, a small C client (tests/api/client.c) compiled against the INSTALLED
header with `pkg-config --cflags --libs tilewise`, then:

* the client runs workflows/sample.yaml and writes the same bytes as
  `tilewise run` (every .tif of the output folder), with progress calls,
  through tilewise_run_file (API version 1) and tilewise_run (version 2:
  tiles callback up to the summary's tiles_total, summaries);
* it opens the demo model, classifies tiles in memory (probabilities sum to
  1) and gets a usage error, with its message, for a wrong band count;
* the installed library's soname is libtilewise.so.0 and it exports only
  tilewise_* symbols; the binary, man page, Python package and QGIS plugin
  land where README says.
"""
import glob
import os
import shutil
import subprocess
import sys
import tempfile

from e2eutil import check

SRC = os.environ.get("TW_SOURCE_DIR")
BIN = os.environ.get("TW_BIN")


def sh(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r.stdout


def main():
    if not (SRC and BIN):
        print("TW_SOURCE_DIR/TW_BIN not set: skipped")
        return 77
    if os.environ.get("TW_SANITIZED"):
        print("sanitized build: an ASan library cannot be loaded by an uninstrumented client; skipped")
        return 77
    build = os.path.dirname(BIN)
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "prefix")
        sh(["cmake", "--install", build, "--prefix", prefix])
        pcs = glob.glob(os.path.join(prefix, "lib*", "**", "tilewise.pc"), recursive=True)
        check(len(pcs) == 1, f"one installed tilewise.pc ({pcs})")
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(pcs[0]))
        cflags = sh(["pkg-config", "--cflags", "tilewise"], env=env).split()
        libs = sh(["pkg-config", "--libs", "tilewise"], env=env).split()
        inc = [f[2:] for f in cflags if f.startswith("-I")]
        check(inc and all(i.startswith(prefix) for i in inc), f"-I points into the prefix: {cflags}")
        check(os.path.exists(os.path.join(inc[0], "tilewise.h")), "tilewise.h installed")
        libdir = [f[2:] for f in libs if f.startswith("-L")][0]
        client = os.path.join(tmp, "client")
        sh(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", os.path.join(SRC, "tests/api/client.c"),
            "-o", client, *cflags, *libs, f"-Wl,-rpath,{libdir}"])
        ldd = sh(["ldd", client])
        check(os.path.join(libdir, "libtilewise.so.0") in ldd, "client loads the installed library")

        so = os.path.realpath(os.path.join(libdir, "libtilewise.so"))
        soname = [l for l in sh(["readelf", "-d", so]).splitlines() if "SONAME" in l]
        check(soname and "libtilewise.so.0" in soname[0], f"soname: {soname}")
        syms = [l.split()[-1] for l in sh(["nm", "-D", "--defined-only", so]).splitlines()]
        syms = [s for s in syms if not s.startswith("TILEWISE_0")]
        bad = [s for s in syms if not s.startswith("tilewise_")]
        check(not bad and len(syms) >= 15, f"exports only tilewise_* ({len(syms)}; others: {bad[:5]})")
        r = subprocess.run([os.path.join(prefix, "bin/tilewise"), "--version"],
                           capture_output=True, text=True)
        check(r.returncode == 0 and r.stdout.startswith("tilewise "),
              f"the installed tilewise runs ({r.returncode}: {r.stderr[-300:]})")
        for rel in ["bin/tilewise", "share/man/man1/tilewise.1",
                    "lib/python3/dist-packages/tilewise/__init__.py",
                    "lib/python3/dist-packages/tilewise/_libpath.py",
                    "share/tilewise/qgis/tilewise_provider/__init__.py",
                    "share/tilewise/qgis/tilewise_provider/metadata.txt"]:
            check(os.path.exists(os.path.join(prefix, rel)), f"installed {rel}")

        # The CLI, then the client, into the same folder (the rasters carry
        # the configuration, output.dir included, in their metadata).
        out = os.path.join(tmp, "out")
        sets = [f"output.dir={out}", "runtime.device=cpu", "output.products=[class,prob,confidence]"]
        sh([BIN, "run", "workflows/sample.yaml", "-q"] + [a for s in sets for a in ("--set", s)], cwd=SRC)
        shutil.move(out, out + ".cli")
        r = subprocess.run([client, "run", "workflows/sample.yaml", *sets], capture_output=True,
                           text=True, cwd=SRC)
        print(r.stdout, end="")
        check(r.returncode == 0, f"client run exits 0 ({r.returncode}: {r.stderr})")
        check("progress calls 0" not in r.stdout, "progress was called")
        check(f"report {out}/run.json" in r.stdout, "the report is OUTPUT_DIR/run.json")
        tifs = sorted(os.path.basename(p) for p in glob.glob(os.path.join(out + ".cli", "*.tif")))
        check(len(tifs) == 3, f"three rasters ({tifs})")
        for name in tifs:
            a = open(os.path.join(out + ".cli", name), "rb").read()
            b = open(os.path.join(out, name), "rb").read()
            check(a == b, f"{name}: the client's bytes equal the CLI's ({len(a)} bytes)", say_ok=True)

        # The same through tilewise_run (version 2), into the same folder.
        shutil.rmtree(out)
        r = subprocess.run([client, "run2", "workflows/sample.yaml", *sets], capture_output=True,
                           text=True, cwd=SRC)
        print(r.stdout, end="")
        check(r.returncode == 0, f"client run2 exits 0 ({r.returncode}: {r.stderr})")
        check("last tiles 100/100" in r.stdout and "tiles_total 100, classified 100, 3 outputs"
              in r.stdout, "tiles callback and input summary agree (100 tiles)")
        check(f"exit 0, report {out}/run.json" in r.stdout, "run summary: exit code and report")
        for name in tifs:
            a = open(os.path.join(out + ".cli", name), "rb").read()
            b = open(os.path.join(out, name), "rb").read()
            check(a == b, f"{name}: run2's bytes equal the CLI's", say_ok=True)

        # A config error: message and exit class.
        r = subprocess.run([client, "run", "workflows/sample.yaml", "tiling.stride=33"],
                           capture_output=True, text=True, cwd=SRC)
        check(r.returncode == 2 and "exit 2 usage" in r.stdout and "tiling.stride" in r.stdout,
              f"bad override: exit 2 with the key named ({r.returncode}: {r.stdout})")

        r = subprocess.run([client, "tiles", "sample_data/demo_resnet18.h5"], capture_output=True,
                           text=True, cwd=SRC)
        print(r.stdout, end="")
        check(r.returncode == 0, f"client tiles exits 0 ({r.stderr})")
        sums = [float(l.rsplit("sum ", 1)[1].rstrip(")")) for l in r.stdout.splitlines()
                if l.startswith("tile ")]
        check(len(sums) == 2 and all(abs(s - 1) < 1e-5 for s in sums), f"probabilities sum to 1: {sums}")
        check("expects 6 input bands but the tiles have 7" in r.stdout, "wrong band count named")
    print("e2e_capi: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
