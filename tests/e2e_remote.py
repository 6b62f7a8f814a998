#!/usr/bin/python3
"""Remote inputs (issue 19), everything on 127.0.0.1 with tests/httpfault.py:

* http://: the same bytes as the local-file run, plainly and under 503 and
  429 bursts, connection resets, truncated bodies and 50 ms latency.
* A long outage mid-run: exit 4, one line naming the URL (redacted); the
  same command afterwards resumes from the committed rows, same bytes.
* A presigned URL: its signature/token appear in no output (stdout, stderr
  with text or JSON progress, run.json, --report, the products and their
  TILEWISE_RUN metadata), also when it fails and in the on_error: skip
  warning of a damaged block; the output stem has no query string.
* s3:// through /vsis3/ (AWS_S3_ENDPOINT, AWS_HTTPS=NO,
  AWS_VIRTUAL_HOSTING=FALSE) on the same server as a minimal S3 responder
  (GET/HEAD, SigV4 not checked but required to be present): same bytes; the
  access key and secret appear in no output.
* An object replaced between an interrupted run and its rerun: its chunks
  are not resumed (refused, or discarded with a notice) - never mixed.
* A STAC item of three single-band COG assets classifies like the stacked
  local file (a 3-band ResNet-18 cut from the fixture's conv1).
* validate on a remote input says what reading it costs.
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
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2eutil  # noqa: E402
import httpfault  # noqa: E402
from e2eutil import BIN, FIX, SRC  # noqa: E402

FAILURES = []
SECRETS = ["tWsEcReTkEy0123456789abcdefXYZ", "AKIATWTESTKEY0000001", "sIgNaTuRe0badc0ffee",
           "sEsSiOnToKeN42",
           # percent-encoded and CloudFront forms (issue 27)
           "eNcSiGnAtUrE77", "pOlIcYsEcReT88", "cFsIgNaTuRe99", "kEyPaIrId00", "uSeRpAsS11"]


def check(cond, what):
    print(("  ok    " if cond else "  FAIL  ") + what, flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


def workflow(path, raster, out, extra="", weights=None, bands=6):
    mean, std = e2eutil.MEAN[:bands], e2eutil.STD[:bands]
    with open(path, "w") as f:
        f.write(f"""input:
  path: '{raster}'
  retries: 3
  retry_delay: 0.05
{extra}model:
  weights: {weights or FIX + "/resnet18_6b_7c.safetensors"}
  mean: {mean}
  std: {std}
tiling:
  tile: 64
  batch: 8
runtime:
  device: cpu
  memory: 512MiB
  threads: 1
output:
  dir: {out}
  products: [class, prob]
""")
    return path


def run(wf, *args, env=None, timeout=300):
    return subprocess.run([BIN, "run", wf, "-q", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def products(out, stem):
    from osgeo import gdal
    return {p: gdal.Open(f"{out}/{stem}.{p}.tif").ReadAsArray() for p in ("class", "prob")}


def same(a, b):
    return all(np.array_equal(a[p], b[p]) for p in ("class", "prob"))


def no_secret(out, texts, what):
    """No secret in texts nor in any file under out (products, run.json,
    the parts directory)."""
    hits = [s for s in SECRETS for t in texts if s in (t or "")]
    for path in glob.glob(os.path.join(out, "**"), recursive=True) + \
            glob.glob(os.path.join(out, ".tilewise", "**"), recursive=True):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                data = f.read()
            hits += [f"{s} in {os.path.relpath(path, out)}" for s in SECRETS
                     if s.encode() in data]
    check(not hits, f"{what}: no credential in any output {hits[:3]}")


class Server:
    def __init__(self, root):
        self.srv = httpfault.serve(root)
        self.base = f"http://127.0.0.1:{self.srv.server_port}"

    def ctl(self, q=""):
        with urllib.request.urlopen(self.base + "/__ctl?" + q) as r:
            return json.load(r)


def wait_for_rows(out, proc, n=1, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout and proc.poll() is None:
        rows = 0
        for j in glob.glob(f"{out}/.tilewise/*/journal.*"):
            with open(j) as f:
                rows += sum(1 for ln in f if ln.startswith("rows "))
        if rows >= n:
            return True
        time.sleep(0.05)
    return False


def main():
    gdal = e2eutil.gdal_or_skip()
    if gdal is None:
        return 77
    tmp = tempfile.mkdtemp(prefix="tw_remote_")
    try:
        return body(gdal, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def body(gdal, tmp):
    root = os.path.join(tmp, "srv")
    os.makedirs(os.path.join(root, "bucket"))
    cog = os.path.join(root, "bucket", "scene.tif")
    # 64 x 64 tiles, uncompressed: a tile row of the plan is a block row of
    # the file, so reads are spread over the run (for the outage below).
    tiled = ["TILED=YES", "BLOCKXSIZE=64", "BLOCKYSIZE=64"]
    gdal.Translate(cog, os.path.join(SRC, "sample_data", "L7_ETMs.tif"), creationOptions=tiled)
    srv = Server(root)
    url = f"{srv.base}/bucket/scene.tif"

    print("reference: the local file")
    ref_out = os.path.join(tmp, "ref")
    r = run(workflow(os.path.join(tmp, "ref.yaml"), cog, ref_out))
    check(r.returncode == 0, f"local run exit 0 ({r.stderr.strip()[:300]})")
    ref = products(ref_out, "scene")

    print("http:// under faults")
    for name, q in [("clean", "kind=none"), ("503 every 3rd", "kind=503&every=3"),
                    ("429 burst of 3", "kind=429&n=3"), ("reset every 3rd", "kind=reset&every=3"),
                    ("truncated every 3rd", "kind=truncate&every=3"),
                    ("6 resets in a row (the open's reads)", "kind=reset&n=6"),
                    ("50 ms latency", "kind=none&latency=0.05")]:
        srv.ctl("reset=1&latency=0&" + q)
        out = os.path.join(tmp, "http_" + name.split()[0])
        r = run(workflow(os.path.join(tmp, "h.yaml"), url, out))
        c = srv.ctl("kind=none&latency=0")
        ok = check(r.returncode == 0, f"{name}: exit 0 ({r.stderr.strip()[:300]})")
        if ok:
            check(same(products(out, "scene"), ref),
                  f"{name}: same bytes as the local run ({c['faults']} faults, "
                  f"{c['requests']} requests)")
        if name != "clean" and "latency" not in name:
            check(c["faults"] > 0, f"{name}: faults were injected ({c['faults']})")

    print("an outage from the start: exit 4 at open")
    srv.ctl("reset=1&kind=outage")
    r = run(workflow(os.path.join(tmp, "down.yaml"), url, os.path.join(tmp, "down")))
    # info over the same outage: the library says TILEWISE_ERR_REMOTE (data,
    # API version 4), where the CLI once matched the message's text.
    t0 = time.monotonic()
    i = subprocess.run([BIN, "info", url], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, GDAL_HTTP_MAX_RETRY="1", GDAL_HTTP_RETRY_DELAY="0.05"))
    srv.ctl("kind=none")
    check(r.returncode == 4 and "network error" in r.stderr and "scene.tif" in r.stderr,
          f"outage at open: exit 4 naming the URL ({r.returncode}: {r.stderr.strip()[:200]})")
    check(i.returncode == 3 and "tilewise: network error: " in i.stderr and "scene.tif" in i.stderr,
          f"info in an outage: exit 3, 'network error' ({i.returncode}: {i.stderr.strip()[:200]}; "
          f"{time.monotonic() - t0:.1f} s)")

    print("a long outage mid-run, then resume")
    out = os.path.join(tmp, "outage")
    wf = workflow(os.path.join(tmp, "outage.yaml"), url, out)
    srv.ctl("reset=1&latency=0.3")
    p = subprocess.Popen([BIN, "run", wf, "-q", "--chunk-rows", "1"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    check(wait_for_rows(out, p), "outage: a chunk committed before the outage")
    srv.ctl("kind=outage&latency=0")
    so, se = p.communicate(timeout=120)
    srv.ctl("kind=none")
    lines = [ln for ln in se.splitlines() if ln.strip()]
    check(p.returncode == 4, f"outage: exit {p.returncode} (expected 4)")
    check(len(lines) == 1 and "127.0.0.1" in se and "scene.tif" in se,
          f"outage: one line naming the URL ({se.strip()[:300]})")
    r = run(wf, "--chunk-rows", "1")
    check(r.returncode == 0, f"outage: the same command afterwards exits 0 ({r.stderr[:300]})")
    if r.returncode == 0:
        check(same(products(out, "scene"), ref), "outage: resumed output equals the local run")
        with open(os.path.join(out, "run.json")) as f:
            resumed = json.load(f)["inputs"][0].get("rows_resumed", 0)
        check(resumed > 0, f"outage: the rerun resumed committed rows ({resumed})")

    print("a presigned URL: no signature anywhere")
    signed = (f"{url}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={SECRETS[1]}%2F20261124"
              f"&X-Amz-Signature={SECRETS[2]}&X-Amz-Security-Token={SECRETS[3]}&token={SECRETS[3]}")
    out = os.path.join(tmp, "signed")
    srv.ctl("reset=1&kind=503&every=3")  # GDAL's retry warnings name the URL too
    r = run(workflow(os.path.join(tmp, "signed.yaml"), signed, out))
    check(r.returncode == 0, f"presigned: exit 0 ({r.stderr.strip()[:300]})")
    check(srv.ctl("kind=none")["faults"] > 0, "presigned: faults were injected")
    check(os.path.exists(os.path.join(out, "scene.class.tif")),
          "presigned: outputs named by the object (scene.*), no query string")
    if r.returncode == 0:
        check(same(products(out, "scene"), ref), "presigned: same bytes as the local run")
    check(any(SECRETS[2] in q for q in srv.ctl()["queries"]), "presigned: the server saw the "
          "signature (it was sent)")
    no_secret(out, [r.stdout, r.stderr], "presigned")
    # With progress on stderr (text and JSON) and a run.json elsewhere.
    for mode in ([], ["--progress=json"]):
        shutil.rmtree(out, ignore_errors=True)
        rp = subprocess.run([BIN, "run", os.path.join(tmp, "signed.yaml"), *mode, "--report",
                             os.path.join(tmp, "signed_report.json")], capture_output=True,
                            text=True, timeout=300)
        with open(os.path.join(tmp, "signed_report.json")) as f:
            rep = f.read()
        check(rp.returncode == 0, f"presigned, progress {mode}: exit 0 ({rp.stderr[-300:]})")
        no_secret(out, [rp.stdout, rp.stderr, rep], f"presigned, progress {mode}")
    # A damaged block under on_error: skip: the warning names the URL, redacted.
    sys.path.insert(0, os.path.join(SRC, "tests", "bad_inputs"))
    import damage
    damage.make_tiled(os.path.join(SRC, "sample_data", "L7_ETMs.tif"),
                      os.path.join(root, "bucket", "damaged.tif"))
    damage.garble_block(os.path.join(root, "bucket", "damaged.tif"), 2, 2)
    out = os.path.join(tmp, "signed_skip")
    r = run(workflow(os.path.join(tmp, "signed_skip.yaml"), signed.replace("scene", "damaged"),
                     out, extra="  on_error: skip\n"))
    check(r.returncode == 0 and "warning" in r.stderr and "REDACTED" in r.stderr,
          f"presigned, damaged block, on_error: skip: a warning naming the redacted URL "
          f"({r.stderr.strip()[:200]})")
    no_secret(out, [r.stdout, r.stderr], "presigned, on_error: skip")
    bad = signed.replace("scene.tif", "missing.tif")
    out = os.path.join(tmp, "signed_bad")
    r = run(workflow(os.path.join(tmp, "signed_bad.yaml"), bad, out))
    check(r.returncode == 3 and "missing.tif" in r.stderr and "REDACTED" in r.stderr,
          f"presigned, missing object: exit 3 naming the redacted URL ({r.stderr.strip()[:300]})")
    no_secret(out, [r.stdout, r.stderr], "presigned, missing object")
    v = subprocess.run([BIN, "validate", os.path.join(tmp, "signed.yaml")], capture_output=True,
                       text=True, timeout=120)
    check(v.returncode == 0 and "range requests" in v.stdout,
          f"validate: says what reading costs ({v.stdout.strip()[-300:]} {v.stderr[:200]})")
    no_secret(out, [v.stdout, v.stderr], "validate")

    print("percent-encoded and CloudFront secrets (issue 27)")
    enc = (f"{url}?X%2DAmz%2DSignature={SECRETS[4]}&Expires=1&Policy={SECRETS[5]}"
           f"&Signature={SECRETS[6]}&Key-Pair-Id={SECRETS[7]}")
    out = os.path.join(tmp, "encoded")
    wf = workflow(os.path.join(tmp, "encoded.yaml"), enc, out)
    report = os.path.join(tmp, "encoded_report.json")
    # One shard of two: its parts and the merge manifest stay on disk.
    r = subprocess.run([BIN, "run", wf, "--progress=json", "--shard", "1/2", "--report", report],
                       capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"encoded secrets: shard 1/2 exit 0 ({r.stderr.strip()[-300:]})")
    check(bool(glob.glob(os.path.join(out, ".tilewise", "*", "manifest"))),
          "encoded secrets: the shard left its manifest")
    check(any(SECRETS[4] in q for q in srv.ctl()["queries"]),
          "encoded secrets: the server saw the signature (it was sent)")
    with open(report) as f:
        rep = f.read()
    v = subprocess.run([BIN, "validate", wf], capture_output=True, text=True, timeout=120)
    i = subprocess.run([BIN, "info", "--json", enc], capture_output=True, text=True, timeout=120)
    check(v.returncode == 0 and i.returncode == 0 and "REDACTED" in v.stdout + i.stdout,
          f"encoded secrets: validate and info run and show REDACTED "
          f"({v.returncode}, {i.returncode}: {v.stderr.strip()[:200]} {i.stderr.strip()[:200]})")
    no_secret(out, [r.stdout, r.stderr, rep, v.stdout, v.stderr, i.stdout, i.stderr],
              "encoded secrets (stderr, JSON events, run.json, manifest, validate, info)")
    # GDAL's /vsicurl?url=ENCODED form with user:password (GDAL 3.6 does not
    # open this form: its failure message, JSON event and info must not leak).
    port = srv.srv.server_port
    vsi = (f"/vsicurl?url=http%3A%2F%2Fuser%3A{SECRETS[8]}%40127.0.0.1%3A{port}"
           f"%2Fbucket%2Fscene.tif")
    out = os.path.join(tmp, "vsicurl_q")
    wf = workflow(os.path.join(tmp, "vsicurl_q.yaml"), vsi, out)
    r = subprocess.run([BIN, "run", wf, "--progress=json"], capture_output=True, text=True,
                       timeout=300)
    i = subprocess.run([BIN, "info", vsi], capture_output=True, text=True, timeout=120)
    check("REDACTED" in r.stderr, f"/vsicurl?url=: the message shows REDACTED "
          f"({r.returncode}: {r.stderr.strip()[-300:]})")
    no_secret(out, [r.stdout, r.stderr, i.stdout, i.stderr], "/vsicurl?url= with user:password")

    print("a missing object fails at once (issue 27)")
    missing = os.path.join(tmp, "missing.yaml")
    workflow(missing, f"{srv.base}/bucket/no_such.tif", os.path.join(tmp, "missing"))
    for what, args in [("run", ["run", missing, "-q"]), ("validate", ["validate", missing])]:
        t0 = time.time()
        # input.retries 8 from 0.5 s: retrying would take about two minutes.
        r = subprocess.run([BIN, *args, "--set", "input.retries=8", "--set",
                            "input.retry_delay=0.5"], capture_output=True, text=True, timeout=300)
        dt = time.time() - t0
        check(r.returncode == 3 and dt < 5 and "404" in r.stderr and "no_such.tif" in r.stderr,
              f"404 on {what}: exit 3 in {dt:.2f} s (< 5 s), one message naming the object "
              f"and the 404 ({r.returncode}: {r.stderr.strip()[:300]})")

    print("s3:// through /vsis3/")
    env = dict(os.environ, AWS_S3_ENDPOINT=f"127.0.0.1:{srv.srv.server_port}", AWS_HTTPS="NO",
               AWS_VIRTUAL_HOSTING="FALSE", AWS_ACCESS_KEY_ID=SECRETS[1],
               AWS_SECRET_ACCESS_KEY=SECRETS[0], AWS_REGION="us-east-1",
               AWS_NO_SIGN_REQUEST="NO", AWS_CONFIG_FILE="/nonexistent",
               AWS_SHARED_CREDENTIALS_FILE="/nonexistent")
    out = os.path.join(tmp, "s3")
    wf = workflow(os.path.join(tmp, "s3.yaml"), "s3://bucket/scene.tif", out)
    srv.ctl("reset=1")
    # The secret through --config (GDAL's way), the key id through the environment.
    env_nosecret = {k: v for k, v in env.items() if k != "AWS_SECRET_ACCESS_KEY"}
    r = run(wf, "--config", "AWS_SECRET_ACCESS_KEY", SECRETS[0], env=env_nosecret)
    c = srv.ctl()
    check(r.returncode == 0, f"s3: exit 0 ({r.stderr.strip()[:300]})")
    if r.returncode == 0:
        check(same(products(out, "scene"), ref), "s3: same bytes as the local run")
    check(c["signed"] > 0, f"s3: requests carried a SigV4 signature ({c['signed']})")
    no_secret(out, [r.stdout, r.stderr], "s3")

    print("s3:// object replaced between an interrupted run and its rerun")
    out = os.path.join(tmp, "s3_changed")
    wf = workflow(os.path.join(tmp, "s3c.yaml"), "s3://bucket/scene.tif", out)
    srv.ctl("reset=1&latency=0.3")
    p = subprocess.Popen([BIN, "run", wf, "-q", "--chunk-rows", "1"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    check(wait_for_rows(out, p), "changed: a chunk committed before the interruption")
    p.send_signal(signal.SIGINT)
    p.communicate(timeout=120)
    srv.ctl("latency=0")
    check(p.returncode == 75, f"changed: interrupted run exits 75 ({p.returncode})")
    ident = {}
    for path in glob.glob(os.path.join(out, ".tilewise", "**"), recursive=True):
        if os.path.isfile(path) and os.path.basename(path) == "fingerprint":
            with open(path) as f:
                for ln in f:
                    k, _, v = ln.rstrip("\n").partition(" ")
                    if k == "object[/vsis3/bucket/scene.tif]":
                        ident = dict(f.split("=", 1) for f in v.split())
    check(set(ident) == {"size", "etag", "modified"} and "-" not in ident.values(),
          f"changed: the resume fingerprint holds the object's size, ETag and date ({ident})")
    # A new version of the object: other pixel values, same size and grid.
    new = os.path.join(tmp, "scene_v2.tif")
    gdal.Translate(new, os.path.join(SRC, "sample_data", "L7_ETMs.tif"), creationOptions=tiled,
                   scaleParams=[[0, 255, 255, 0]])
    os.replace(new, cog)
    r = run(wf, "--chunk-rows", "1", env=env)
    if r.returncode == 0:
        with open(os.path.join(out, "run.json")) as f:
            resumed = json.load(f)["inputs"][0].get("rows_resumed", 0)
        check(resumed == 0, f"changed: no chunk of the old version resumed ({resumed} rows)")
        v2_out = os.path.join(tmp, "v2_ref")
        r2 = run(workflow(os.path.join(tmp, "v2.yaml"), cog, v2_out))
        check(r2.returncode == 0 and same(products(out, "scene"), products(v2_out, "scene")),
              "changed: the rerun equals a run on the new version alone")
    else:
        check(r.returncode == 6 and "object[/vsis3/bucket/scene.tif]: etag=" in r.stderr
              and "--restart" in r.stderr,
              f"changed: refused (6), naming the object and its ETag ({r.stderr[:400]})")
    no_secret(out, [r.stdout, r.stderr], "changed")

    print("a STAC item of three single-band COG assets")
    stac_root = os.path.join(root, "stac")
    os.makedirs(stac_root)
    src = os.path.join(SRC, "sample_data", "L7_ETMs.tif")
    for b in (1, 2, 3):
        gdal.Translate(os.path.join(stac_root, f"B{b}.tif"), src, format="COG", bandList=[b],
                       creationOptions=["BLOCKSIZE=128", "COMPRESS=DEFLATE"])
    item = {"type": "Feature", "stac_version": "1.0.0", "id": "l7", "properties": {},
            "geometry": None, "links": [],
            "assets": {f"B{b}": {"href": f"./B{b}.tif", "type": "image/tiff"} for b in (1, 2, 3)}}
    with open(os.path.join(stac_root, "item.json"), "w") as f:
        json.dump(item, f)
    stacked = os.path.join(tmp, "stacked.tif")
    gdal.Translate(stacked, src, bandList=[1, 2, 3])
    import safetensors_io
    sd, _ = safetensors_io.load(f"{FIX}/resnet18_6b_7c.safetensors")
    sd["conv1.weight"] = np.ascontiguousarray(sd["conv1.weight"][:, :3])
    w3 = os.path.join(tmp, "resnet18_3b.safetensors")
    safetensors_io.save(w3, sd, "F32")
    out_l = os.path.join(tmp, "stac_local_ref")
    r = run(workflow(os.path.join(tmp, "s_ref.yaml"), stacked, out_l, weights=w3, bands=3))
    check(r.returncode == 0, f"stacked local file: exit 0 ({r.stderr.strip()[:300]})")
    for name, path in [("a file", os.path.join(stac_root, "item.json")),
                       ("a URL", f"{srv.base}/stac/item.json")]:
        out = os.path.join(tmp, "stac_" + name.split()[-1].lower())
        r = run(workflow(os.path.join(tmp, "stac.yaml"), path, out, weights=w3, bands=3,
                         extra="  assets: [B1, B2, B3]\n"))
        ok = check(r.returncode == 0, f"STAC item as {name}: exit 0 ({r.stderr.strip()[:300]})")
        if ok:
            check(same(products(out, "item"), products(out_l, "stacked")),
                  f"STAC item as {name}: same classes and probabilities as the stacked file")
    r = run(workflow(os.path.join(tmp, "stac_bad.yaml"), os.path.join(stac_root, "item.json"),
                     os.path.join(tmp, "stac_bad"), weights=w3, bands=3,
                     extra="  assets: [B1, B2, B9]\n"))
    check(r.returncode == 2 and "B9" in r.stderr and "B1, B2, B3" in r.stderr,
          f"STAC: an unknown asset is a config error listing the item's assets ({r.stderr[:300]})")

    print("FAILED: " + "; ".join(FAILURES) if FAILURES else "all passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(SRC or ".", "tools"))
    sys.exit(main())
