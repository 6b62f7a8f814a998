#!/usr/bin/python3
"""Never a hang, no secret or file bytes shown (issue 39, items 3 and 5).
Every command runs under a time bound: a hung one is killed by the test
and reported as a failure, never left to hang CI.

* A 127.0.0.1 server that accepts and never answers (tests/httpfault.py
  kind=silent) as input.path, or that drips a byte a second: the run ends
  by itself within input.timeout and its retries (exit 4, an outage), and
  SIGTERM stops it within 10 s with exit 75 - at the open, at a STAC item's
  fetch, and mid-run with the readers stuck on stalled range requests.
  `tilewise info` of a silent URL ends too.
* Malformed URLs fail at once: an '@' in a password not written %40 is
  exit 3 in under 5 s, the password not shown; HTTP:// (upper case) reads
  like http://.
* FIFOs as workflow, model, raster, AOI, STAC item and ONNX external data
  are refused before blocking (exit 2 or 3), naming the path.
* A URL fragment's access_token is redacted; validate/info/run on a
  .netrc-like text file as workflow, model, raster or STAC item never echo
  its bytes.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2eutil  # noqa: E402
import httpfault  # noqa: E402
from e2eutil import BIN, FIX, SRC  # noqa: E402

FAILURES = []
SECRET = "hunter2SeCrEt"


def check(cond, what):
    print(("  ok    " if cond else "  FAIL  ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def bounded(args, limit, term_after=None):
    """Run args; SIGTERM after term_after s (if given), SIGKILL at limit s.
    Returns (exit code or None when killed, stderr, seconds, seconds after
    the SIGTERM or None)."""
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    t_term = None
    try:
        if term_after is not None:
            try:
                p.wait(timeout=term_after)
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGTERM)
                t_term = time.monotonic()
        p.wait(timeout=max(0.1, limit - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return None, p.stderr.read(), time.monotonic() - t0, None
    t1 = time.monotonic()
    so, se = p.communicate()
    return p.returncode, se + so, t1 - t0, (t1 - t_term) if t_term else None


def workflow(path, raster, out, input_extra="", extra="", weights=None):
    with open(path, "w") as f:
        f.write(f"""input:
  path: '{raster}'
{input_extra}model:
  weights: {weights or FIX + "/resnet18_6b_7c.safetensors"}
  mean: {e2eutil.MEAN}
  std: {e2eutil.STD}
tiling:
  tile: 64
  batch: 8
runtime:
  device: cpu
  memory: 512MiB
  threads: 1
output:
  dir: {out}
  products: [class]
{extra}""")
    return path


class Server:
    def __init__(self, root):
        self.srv = httpfault.serve(root)
        self.base = f"http://127.0.0.1:{self.srv.server_port}"

    def ctl(self, q=""):
        with urllib.request.urlopen(self.base + "/__ctl?" + q, timeout=10) as r:
            return r.read()


def remote(gdal, tmp):
    root = os.path.join(tmp, "srv")
    os.makedirs(root)
    cog = os.path.join(root, "scene.tif")
    gdal.Translate(cog, os.path.join(SRC, "sample_data", "L7_ETMs.tif"),
                   creationOptions=["TILED=YES", "BLOCKXSIZE=64", "BLOCKYSIZE=64"])
    srv = Server(root)
    url = f"{srv.base}/scene.tif"
    fast = "  retries: 1\n  retry_delay: 0.05\n  timeout: 2\n"

    print("a silent server (accepts, never answers)")
    srv.ctl("kind=silent")
    wf = workflow(os.path.join(tmp, "silent.yaml"), url, os.path.join(tmp, "o_silent"), fast)
    rc, err, t, _ = bounded([BIN, "run", wf, "-q"], 60)
    check(rc == 4 and "scene.tif" in err and "input.timeout" in err,
          f"silent server, no signal: ends by itself, exit 4 naming the URL and input.timeout "
          f"in {t:.1f} s ({rc}: {err.strip()[:200]})")
    wf = workflow(os.path.join(tmp, "silent_d.yaml"), url, os.path.join(tmp, "o_silent_d"))
    rc, err, t, after = bounded([BIN, "run", wf, "-q"], 60, term_after=2)
    check(rc == 75 and after is not None and after <= 10.5,
          f"silent server at open (default keys), SIGTERM: exit 75 within 10 s "
          f"({rc} {after and round(after, 1)} s after: {err.strip()[:200]})")
    rc, err, t, _ = bounded([BIN, "info", url], 60)
    check(rc is not None and rc != 0 and "scene.tif" in err,
          f"info of a silent URL ends by itself (exit {rc} in {t:.1f} s)")

    print("a STAC item on a silent server")
    wf = workflow(os.path.join(tmp, "stac.yaml"), f"{srv.base}/item.json",
                  os.path.join(tmp, "o_stac"), "  assets: [B1]\n")
    rc, err, t, after = bounded([BIN, "run", wf, "-q"], 60, term_after=2)
    check(rc == 75 and after is not None and after <= 10.5,
          f"STAC item fetch, SIGTERM: exit 75 within 10 s ({rc} "
          f"{after and round(after, 1)} s after: {err.strip()[:200]})")

    print("a server that drips a byte a second")
    srv.ctl("kind=drip")
    wf = workflow(os.path.join(tmp, "drip.yaml"), url, os.path.join(tmp, "o_drip"), fast)
    rc, err, t, _ = bounded([BIN, "run", wf, "-q"], 60)
    # GDAL takes the HEAD's size, then the dripped range read is cut: exit 3
    # (the file cannot be read) or 4 (unreachable) - never a hang
    check(rc in (3, 4) and "scene.tif" in err and t < 30,
          f"drip: ends by itself, exit 3 or 4 in {t:.1f} s ({rc}: {err.strip()[:200]})")

    print("stalled mid-run: readers wait on range requests never answered")
    srv.ctl("kind=none&latency=0.2")
    out = os.path.join(tmp, "o_stall")
    wf = workflow(os.path.join(tmp, "stall.yaml"), url, out, extra="")
    p = subprocess.Popen([BIN, "run", wf, "-q", "--chunk-rows", "1"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60 and p.poll() is None and e2eutil.committed_rows(out) < 1:
        time.sleep(0.05)
    check(p.poll() is None, "stall: the run is under way when the server stalls")
    srv.ctl("kind=stall&n=100000&latency=0")
    time.sleep(1.5)
    p.send_signal(signal.SIGTERM)
    t_term = time.monotonic()
    try:
        so, se = p.communicate(timeout=30)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        p.kill()
        so, se = p.communicate()
        rc = None
    after = time.monotonic() - t_term
    srv.ctl("kind=none")
    check(rc == 75 and after <= 10.5,
          f"stall mid-run, SIGTERM: exit 75 within 10 s ({rc} {after:.1f} s after: "
          f"{se.strip()[:200]})")

    print("malformed URLs fail at once")
    bad = f"http://bob:hun@{SECRET}@127.0.0.1:{srv.srv.server_port}/scene.tif"
    wf = workflow(os.path.join(tmp, "at.yaml"), bad, os.path.join(tmp, "o_at"))
    rc, err, t, _ = bounded([BIN, "run", wf, "-q"], 30)
    check(rc == 3 and t < 5 and "%40" in err and SECRET not in err and "hun@" not in err,
          f"'@' in a password: exit 3 in {t:.1f} s, no secret ({rc}: {err.strip()[:200]})")
    upper = url.replace("http://", "HTTP://")
    wf = workflow(os.path.join(tmp, "upper.yaml"), upper, os.path.join(tmp, "o_upper"))
    rc, err, t, _ = bounded([BIN, "run", wf, "-q"], 120)
    check(rc == 0, f"HTTP:// reads like http:// (exit {rc} in {t:.1f} s: {err.strip()[:200]})")

    print("a URL fragment's token is redacted")
    frag = f"{url}#access_token={SECRET}"
    out = os.path.join(tmp, "o_frag")
    srv.ctl("kind=outage")
    wf = workflow(os.path.join(tmp, "frag.yaml"), frag, out, fast)
    rc, err, t, _ = bounded([BIN, "run", wf, "-q"], 60)
    srv.ctl("kind=none")
    leaked = SECRET in err
    if os.path.exists(os.path.join(out, "run.json")):
        with open(os.path.join(out, "run.json")) as f:
            leaked = leaked or SECRET in f.read()
    check(rc not in (0, None) and not leaked and "REDACTED" in err,
          f"#access_token= redacted in stderr and run.json ({rc}: {err.strip()[:200]})")


def local(tmp):
    print("FIFOs are refused before blocking")
    fifo = os.path.join(tmp, "pipe.fifo")
    os.mkfifo(fifo)
    raster = os.path.join(SRC, "sample_data", "L7_ETMs.tif")
    out = os.path.join(tmp, "o_fifo")
    cases = [
        ("workflow", [BIN, "validate", fifo], 2),
        ("workflow (run)", [BIN, "run", fifo, "-q"], 2),
        ("model", [BIN, "validate", workflow(os.path.join(tmp, "fm.yaml"), raster, out,
                                             weights=fifo)], 3),
        ("model (info)", [BIN, "info", fifo], 3),
        ("raster", [BIN, "validate", workflow(os.path.join(tmp, "fr.yaml"), fifo, out)], 3),
        ("AOI", [BIN, "validate", workflow(os.path.join(tmp, "fa.yaml"), raster, out,
                                           f"  aoi: {fifo}\n")], 3),
        ("STAC item", [BIN, "validate", workflow(os.path.join(tmp, "fs.yaml"), fifo, out,
                                                 "  assets: [B1]\n")], 3),
    ]
    # ONNX external data: the model's .data file a FIFO
    onnx_dir = os.path.join(tmp, "onnx")
    os.makedirs(onnx_dir)
    shutil.copy(os.path.join(FIX, "onnx_r18_ext.onnx"), onnx_dir)
    os.mkfifo(os.path.join(onnx_dir, "onnx_r18_ext.data"))
    cases.append(("ONNX external data", [BIN, "info", os.path.join(onnx_dir, "onnx_r18_ext.onnx")],
                  3))
    for what, args, want in cases:
        rc, err, t, _ = bounded(args, 15)
        named = "fifo" in err.lower() or "not a file" in err or "not a regular file" in err
        check(rc == want and named and t < 10,
              f"{what} a FIFO: exit {want} at once naming it ({rc} in {t:.1f} s: "
              f"{err.strip()[-200:]})")

    print("a file's bytes are never shown")
    netrc = os.path.join(tmp, ".netrc")
    with open(netrc, "w") as f:
        f.write(f"machine host login bob password {SECRET}\n")
    item = os.path.join(tmp, "item.json")
    with open(item, "w") as f:
        f.write(f'{{"type": "Feature"}}\nmachine host login bob password {SECRET}\n')
    cases = [
        ("validate .netrc", [BIN, "validate", netrc], 2),
        ("run .netrc", [BIN, "run", netrc, "-q"], 2),
        ("info .netrc", [BIN, "info", netrc], 3),
        ("model .netrc", [BIN, "validate", workflow(os.path.join(tmp, "nm.yaml"), raster, out,
                                                    weights=netrc)], 3),
        ("raster .netrc", [BIN, "validate", workflow(os.path.join(tmp, "nr.yaml"), netrc, out)],
         3),
        ("STAC item .netrc", [BIN, "validate", workflow(os.path.join(tmp, "ns.yaml"), netrc, out,
                                                        "  assets: [B1]\n")], 3),
        ("STAC item JSON + text", [BIN, "validate", workflow(os.path.join(tmp, "nj.yaml"), item,
                                                             out, "  assets: [B1]\n")], 3),
    ]
    for what, args, want in cases:
        rc, err, t, _ = bounded(args, 30)
        check(rc == want and SECRET not in err and "machine" not in err and "bob" not in err,
              f"{what}: exit {want}, no byte of the file shown ({rc}: {err.strip()[-200:]})")


def main():
    gdal = e2eutil.gdal_or_skip()
    if gdal is None:
        return 77
    tmp = tempfile.mkdtemp(prefix="tw_hangs_")
    t0 = time.monotonic()
    try:
        local(tmp)
        remote(gdal, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{len(FAILURES)} failure(s) in {time.monotonic() - t0:.0f} s")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
