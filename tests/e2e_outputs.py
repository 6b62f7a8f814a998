#!/usr/bin/python3
"""Outputs never destroy inputs, and a folder says what it holds (issue 39.1, 39.3).

* An output over an input: output.dir holding scene.prob.tif given as the
  input, output.name "scene" (before: exit 0, the input replaced by an 11x11
  probability raster); input.path [a.tif, 1.prob.tif] with output.name
  "{index}" (before: the first input's product replaced the second before it
  was read, SIGSEGV). Now run and validate exit 2 before the first tile, one
  line naming the output and the input, the input's bytes unchanged. Also a
  VRT's source, a hard link (same inode, another name) and an input under
  OUT/.tilewise/.
* Stale products: [class, prob, confidence], then [class]: the old prob and
  confidence stay (never removed: the name may be a user's file) and are
  named on stderr and in run.json (inputs[].stale); a third run asking for
  them again lists nothing stale.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2eutil  # noqa: E402
from e2eutil import BIN, SRC  # noqa: E402

FAILURES = []


def check(cond, what):
    print(("  ok    " if cond else "  FAIL  ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def cli(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600)


def refused(wf, out_file, in_file, what, protected):
    """run and validate of wf: exit 2 naming both files, protected unchanged."""
    before = {p: open(p, "rb").read() for p in protected}
    for cmd in ("validate", "run"):
        r = cli(cmd, wf, "-q") if cmd == "run" else cli(cmd, wf)
        line = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        check(r.returncode == 2 and out_file in line and in_file in line,
              f"{what}: {cmd} exits 2 naming {os.path.basename(out_file)} and "
              f"{os.path.basename(in_file)} (rc {r.returncode}: {line})")
    check(all(open(p, "rb").read() == b for p, b in before.items()),
          f"{what}: the input's bytes are unchanged")


def main():
    gdal = e2eutil.gdal_or_skip()
    if gdal is None:
        return 77
    work = tempfile.mkdtemp(prefix="tw-outputs-")
    try:
        small = os.path.join(work, "a.tif")
        gdal.Translate(small, os.path.join(SRC, "sample_data", "L7_ETMs.tif"),
                       srcWin=[0, 0, 160, 160])
        name = lambda n: f"  name: \"{n}\"\n"  # noqa: E731

        # 1. output.dir holds the input, output.name makes its name
        out = os.path.join(work, "o1")
        os.mkdir(out)
        inp = os.path.join(out, "scene.prob.tif")
        shutil.copy(small, inp)
        wf = os.path.join(work, "w1.yaml")
        e2eutil.write_workflow(wf, out, [inp], extra=name("scene"), products="[class, prob]")
        refused(wf, inp, inp, "input scene.prob.tif, output.name scene", [inp])

        # 2. the first input's product is the second input
        out = os.path.join(work, "o2")
        os.mkdir(out)
        second = os.path.join(out, "1.prob.tif")
        shutil.copy(small, second)
        wf = os.path.join(work, "w2.yaml")
        e2eutil.write_workflow(wf, out, [small, second], extra=name("{index}"),
                               products="[class, prob]")
        refused(wf, second, second, "[a.tif, 1.prob.tif] with {index}", [second, small])

        # 3. a VRT whose source is where a product goes
        out = os.path.join(work, "o3")
        os.mkdir(out)
        src = os.path.join(out, "v.class.tif")
        shutil.copy(small, src)
        vrt = os.path.join(work, "v.vrt")
        gdal.BuildVRT(vrt, [src])
        wf = os.path.join(work, "w3.yaml")
        e2eutil.write_workflow(wf, out, [vrt], products="[class]")
        refused(wf, src, vrt, "a VRT's source", [src])

        # 4. a hard link: another name, the same inode
        out = os.path.join(work, "o4")
        os.mkdir(out)
        linked = os.path.join(work, "b.tif")
        shutil.copy(small, linked)
        os.link(linked, os.path.join(out, "b.class.tif"))
        wf = os.path.join(work, "w4.yaml")
        e2eutil.write_workflow(wf, out, [linked], products="[class]")
        refused(wf, os.path.join(out, "b.class.tif"), linked, "a hard link", [linked])

        # 5. an input under OUT/.tilewise/
        out = os.path.join(work, "o5")
        os.makedirs(os.path.join(out, ".tilewise"))
        hidden = os.path.join(out, ".tilewise", "c.tif")
        shutil.copy(small, hidden)
        wf = os.path.join(work, "w5.yaml")
        e2eutil.write_workflow(wf, out, [hidden], products="[class]")
        r = cli("run", wf, "-q")
        check(r.returncode == 2 and ".tilewise/" in r.stderr and "c.tif" in r.stderr,
              f"an input in .tilewise/: exit 2 naming it (rc {r.returncode}: {r.stderr.strip()})")
        check(os.path.exists(hidden), "an input in .tilewise/: still there")

        # 6. stale products
        out = os.path.join(work, "o6")
        wf = os.path.join(work, "w6.yaml")
        e2eutil.write_workflow(wf, out, [small], products="[class, prob, confidence]")
        r = cli("run", wf, "-q")
        check(r.returncode == 0, f"stale: the first run (rc {r.returncode} {r.stderr.strip()})")
        e2eutil.write_workflow(wf, out, [small], products="[class]",
                               extra=f"  creation_options: [COMPRESS=LZW]\n")
        r = cli("run", wf)
        rep = json.load(open(os.path.join(out, "run.json")))
        stale = sorted(os.path.basename(p) for p in rep["inputs"][0].get("stale", []))
        check(r.returncode == 0 and stale == ["a.conf.tif", "a.prob.tif"],
              f"stale: run.json lists a.prob.tif and a.conf.tif ({stale})")
        check("a.prob.tif, a.conf.tif" in r.stderr and "stale" in r.stderr,
              f"stale: stderr names them ({r.stderr.strip().splitlines()[-3:]})")
        check(os.path.exists(os.path.join(out, "a.prob.tif")), "stale: kept, not removed")
        e2eutil.write_workflow(wf, out, [small], products="[class, prob, confidence]")
        r = cli("run", wf, "-q")
        rep = json.load(open(os.path.join(out, "run.json")))
        check(r.returncode == 0 and "stale" not in rep["inputs"][0],
              "stale: a run writing them again lists none")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
