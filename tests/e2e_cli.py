#!/usr/bin/python3
"""End to end: the command line a person (or a scheduler) meets.

* --help for every subcommand (and `tilewise help CMD`): exit 0, its own usage
  line, its options; every option a help text names is in the man page, which
  renders with man/groff when they are installed.
* info: a raster's size, band types, nodata, blocks and geotransform equal
  GDAL's (Python bindings), its CRS as "EPSG:31985" with units; a model's
  bands, classes, parameter count and SHA-256 equal what the file holds;
  unreadable files exit 3.
* validate: the plan and advice for a good workflow (no warnings); a wrong
  input.scale, a geographic raster with stretched pixels and a raster
  smaller than a tile (more than half of its tile's pixels padding) give
  warnings but exit 0; a 3-band raster with a 6-band model exits 3 naming
  both sides, and `run` exits 3 without creating the output directory.
* progress: -q prints nothing on stderr; text progress is GDAL's
  0...10...100 - done.; on a terminal it adds tiles/s and the time left;
  --progress=json: every stderr line is a JSON object, per input a start
  event, fractions that never decrease and end at 1, tiles_done up to
  tiles_total, and a final done event whose counts match run.json; every
  failing run (usage, workflow, input, model, resource, locked, interrupted,
  parts of another configuration) ends with one done event carrying the
  exit code and the message, and stderr stays JSON.
"""
import glob
import hashlib
import json
import os
import pty
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from e2eutil import BIN, FIX, SRC, check, gdal_or_skip, workflow


def tw(*args, **kw):
    return subprocess.run([BIN, *args], capture_output=True, text=True, **kw)


def test_help():
    helps = {}
    for cmd, opts in {"run": ["--set", "--shard", "--progress", "-q", "--report", "--chunk-rows"],
                      "validate": ["--set"], "info": ["--json"], "merge": ["OUTPUT_DIR"],
                      "submit": ["--array", "--dry-run", "--sbatch"]}.items():
        r = tw(cmd, "--help")
        check(r.returncode == 0, f"{cmd} --help exits 0 ({r.returncode}: {r.stderr})")
        check(r.stdout.startswith(f"usage: tilewise {cmd}"), f"{cmd} --help: its usage line")
        for o in opts:
            check(o in r.stdout, f"{cmd} --help mentions {o}")
        check(tw("help", cmd).stdout == r.stdout, f"tilewise help {cmd} = {cmd} --help")
        check(tw(cmd, "-h").stdout == r.stdout, f"{cmd} -h = {cmd} --help")
        helps[cmd] = r.stdout
    # -h as the value of an option is not a request for help.
    r = tw("submit", "x.yaml", "--array", "2", "--sbatch", "--help", "--dry-run")
    check(not r.stdout.startswith("usage:"), "submit --sbatch --help is an sbatch option")
    top = tw("--help")
    check(top.returncode == 0 and all(c in top.stdout for c in helps), "--help lists every command")
    check(tw().returncode == 2, "no command: exit 2")
    check(tw("frobnicate").returncode == 2, "unknown command: exit 2")
    r = tw("run", "x.yaml", "--frobnicate")
    check(r.returncode == 2 and "--frobnicate" in r.stderr, "unknown option named, exit 2")
    r = tw("run", "x.yaml", "--progress=loud")
    check(r.returncode == 2 and "text, json or none" in r.stderr, "bad --progress value, exit 2")
    v = tw("--version").stdout.split("\n")
    check(v[0].startswith("tilewise ") and v[1].startswith("GDAL "), "--version: tilewise and GDAL")

    man = open(os.path.join(SRC, "tilewise.1")).read()
    for cmd, text in helps.items():
        check(f"\\fB{cmd}\\fR" in man or f".B {cmd}" in man or f"\\fB{cmd}" in man,
              f"man page documents {cmd}")
        for o in set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-q)\b", text)):
            check(o.replace("-", "\\-") in man or o in man, f"man page documents {cmd} {o}")
    for code in ["75", "4", "3", "2"]:
        check(re.search(r"^\.TP\n\.B " + code + r"\b", man, re.M), f"man page lists exit code {code}")
    if shutil.which("man") and shutil.which("groff"):
        r = subprocess.run(["man", "-l", "-Tutf8", os.path.join(SRC, "tilewise.1")],
                           capture_output=True, text=True, env={**os.environ, "MANWIDTH": "80"})
        check(r.returncode == 0 and "tilewise" in r.stdout and "validate" in r.stdout,
              f"man -l tilewise.1 renders ({r.stderr[:200]})")
        check("warning" not in r.stderr.lower(), f"man page renders without warnings: {r.stderr}")
    else:
        print("man/groff not installed: rendering not checked")


def test_info(gdal):
    path = os.path.join(SRC, "sample_data", "L7_ETMs.tif")
    r = tw("info", path)
    check(r.returncode == 0, f"info raster: {r.stderr}")
    check("EPSG:31985" in r.stdout and "units metre" in r.stdout, "info: CRS as EPSG code + units")
    check("349 x 352 pixels, 6 bands" in r.stdout, "info: size")
    check(len(re.findall(r"^band \d+ +Byte", r.stdout, re.M)) == 6, "info: a line per band")
    for raster in [path, os.path.join(FIX, "rast_int16_tiled_nodata.tif"),
                   os.path.join(FIX, "rast_float32_striped_nodata.tif")]:
        r = tw("info", "--json", raster)
        check(r.returncode == 0, f"info --json {raster}: {r.stderr}")
        j = json.loads(r.stdout)
        ds = gdal.Open(raster)
        check((j["width"], j["height"], j["band_count"]) == (ds.RasterXSize, ds.RasterYSize, ds.RasterCount),
              f"{raster}: size")
        gt = ds.GetGeoTransform(can_return_null=True)
        check(j["geotransform"] == (list(gt) if gt else None), f"{raster}: geotransform")
        check(j["usable"] is True, f"{raster}: usable")
        for b in j["bands"]:
            band = ds.GetRasterBand(b["band"])
            check(b["type"] == gdal.GetDataTypeName(band.DataType), f"{raster} band {b['band']}: type")
            check(b["block"] == band.GetBlockSize(), f"{raster} band {b['band']}: block")
            check(b["nodata"] == band.GetNoDataValue(), f"{raster} band {b['band']}: nodata "
                  f"{b['nodata']} vs {band.GetNoDataValue()}")
    j = json.loads(tw("info", "--json", path).stdout)
    check(j["crs"].startswith("EPSG:31985") and j["crs_kind"] == "projected" and j["crs_units"] == "metre",
          "info --json CRS")
    check(abs(j["pixel_size_m"][0] - 28.5) < 1e-6, "info --json pixel size in metres")

    sys.path.insert(0, os.path.join(SRC, "tools"))
    import safetensors_io
    model = os.path.join(FIX, "resnet18_6b_7c.safetensors")
    tensors = safetensors_io.load(model)
    tensors = tensors[0] if isinstance(tensors, tuple) else tensors
    n_params = sum(int(v.size) for k, v in tensors.items() if "running_" not in k and "num_batches" not in k)
    r = tw("info", "--json", model)
    check(r.returncode == 0, f"info model: {r.stderr}")
    j = json.loads(r.stdout)
    check(j["arch"] == "resnet18" and j["in_bands"] == 6 and j["n_classes"] == 7, f"model info {j}")
    check(j["parameters"] == n_params, f"parameters {j['parameters']} vs {n_params}")
    check(j["sha256"] == hashlib.sha256(open(model, "rb").read()).hexdigest(), "model sha256")
    r = tw("info", os.path.join(SRC, "sample_data", "demo_resnet18.h5"))
    if r.returncode == 0:
        check("mean:" in r.stdout and "std:" in r.stdout and "classes:" in r.stdout,
              "bundle info shows normalization and classes")
    r = tw("info", os.path.join(FIX, "not_a_raster.txt"))
    check(r.returncode == 3 and "not_a_raster.txt" in r.stderr, f"info on a text file: exit 3 ({r.stderr})")
    r = tw("info", "/nonexistent/x.tif")
    check(r.returncode == 3, "info on a missing file: exit 3")
    check(tw("info").returncode == 2, "info without FILE: exit 2")


def test_validate(work, gdal):
    sample = os.path.join(SRC, "sample_data", "L7_ETMs.tif")
    wf, out = workflow(work, "val", [sample])
    r = tw("validate", wf)
    check(r.returncode == 0, f"validate ok: {r.stderr}")
    check("output grid 6 x 6" in r.stdout, "validate prints the plan")
    check(re.search(r"^crs .*EPSG:31985.*pixel 28.5 x 28.5 m", r.stdout, re.M), "validate: CRS line")
    check("advice    0 warnings" in r.stdout and "warning " not in r.stdout, f"no warnings:\n{r.stdout}")
    check(not os.path.exists(out), "validate creates no output")

    r = tw("validate", wf, "--set", "input.scale=0.0001")
    check(r.returncode == 0, "a scale warning does not fail validate")
    warn = [l for l in r.stdout.splitlines() if l.startswith("warning")]
    check(len(warn) == 6 and all("almost constant" in l and "input.scale 1" in l for l in warn),
          f"wrong scale: a warning per band suggesting scale 1:\n{r.stdout}")

    geo = os.path.join(work, "geo_far.tif")
    gdal.Translate(geo, sample, outputSRS="EPSG:4326", outputBounds=[-60, 70, -50, 69])
    r = tw("validate", wf, "--set", f"input.path={geo}")
    check(r.returncode == 0, f"geographic raster validates: {r.stderr}")
    check(re.search(r"^warning .*stretched", r.stdout, re.M), f"stretched pixels warned:\n{r.stdout}")
    check(re.search(r"^warning .*geographic CRS .* spans about \d+ km", r.stdout, re.M),
          "huge geographic tiles warned")

    # A raster smaller than a tile: 41 x 41 in tiles of 64 is 59 % padding (issue 29).
    small = os.path.join(work, "small41.tif")
    gdal.Translate(small, sample, srcWin=[0, 0, 41, 41])
    r = tw("validate", wf, "--set", f"input.path={small}")
    check(r.returncode == 0, f"a mostly-padding tile does not fail validate: {r.stderr}")
    check(re.search(r"^warning .*small41.tif: 41 x 41 pixels in tiles of 64: 59 % .* padding", r.stdout,
                    re.M), f"mostly-padding tiles warned:\n{r.stdout}")
    r = tw("validate", wf)
    check("padding" not in r.stdout, "the sample's edge tiles (17 % padding) are not warned about")

    rgb = os.path.join(work, "rgb.tif")
    gdal.Translate(rgb, sample, bandList=[1, 2, 3])
    wf3, out3 = workflow(work, "mismatch", [rgb])
    r = tw("validate", wf3)
    check(r.returncode == 3, f"validate 3-band raster vs 6-band model: exit 3 ({r.returncode})")
    check("rgb.tif" in r.stderr and "3" in r.stderr and "6" in r.stderr, f"names both sides: {r.stderr}")
    r = tw("run", wf3, "-q")
    check(r.returncode == 3, f"run mismatch: exit 3 ({r.returncode}, {r.stderr})")
    check(not os.path.exists(out3), "run mismatch: no output directory created")
    return rgb


def read_events(stderr):
    events = []
    for line in stderr.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            sys.exit(f"FAIL: stderr line is not JSON: {line!r}")
        check(isinstance(events[-1], dict) and "event" in events[-1], f"an event object: {line}")
    return events


def json_done(args, code, status, needle, **kw):
    """tilewise ARGS --progress=json: exit code, every stderr line a JSON
    object, the last and only done event with that exit code, status and a
    message naming needle. Returns the events."""
    r = tw(*args, "--progress=json", **kw)
    what = " ".join(os.path.basename(a) for a in args)
    check(r.returncode == code, f"{what}: exit {code} ({r.returncode}: {r.stderr})")
    ev = read_events(r.stderr)
    done = [e for e in ev if e["event"] == "done"]
    check(len(done) == 1 and ev[-1] is done[0], f"{what}: one done event, the last line: {ev}")
    d = done[0]
    check(d["exit_code"] == code and d["status"] == status and needle in d["message"],
          f"{what}: done event with exit {code}, {status!r}, a message naming {needle!r}: {d}",
          say_ok=True)
    return ev


def test_json_failures(work, sample):
    """Every way `run --progress=json` fails ends with one done event (issue
    29): usage, workflow, input, model, resource, parts, locked, interrupted."""
    wf, out = workflow(work, "jf", [sample])
    # usage: an unknown option, a bad --shard, a bad --config (before the command's own options)
    json_done(["run", wf, "--frobnicate"], 2, "usage error", "--frobnicate")
    json_done(["run", wf, "--shard", "3/2"], 2, "usage error", "--shard")
    r = tw("run", wf, "--progress=json", "--config")
    ev = read_events(r.stderr)
    check(r.returncode == 2 and ev[-1]["event"] == "done" and "--config" in ev[-1]["message"],
          f"--config without KEY VALUE: a done event: {ev}")
    # the workflow: an unknown key, YAML syntax, a missing required key, no such file
    bad = os.path.join(work, "jf_badkey.yaml")
    with open(wf) as f, open(bad, "w") as g:
        g.write(f.read().replace("input:\n", "input:\n  bogus: 1\n"))
    json_done(["run", bad], 2, "config error", "input.bogus")
    badyaml = os.path.join(work, "jf_syntax.yaml")
    with open(badyaml, "w") as f:
        f.write("input: [\n")
    json_done(["run", badyaml], 2, "config error", "YAML syntax")
    noin = os.path.join(work, "jf_noinput.yaml")
    with open(wf) as f, open(noin, "w") as g:
        g.write("".join(l for l in f if not l.startswith(("input:", "  path:"))))
    json_done(["run", noin], 2, "config error", "input.path is required")
    json_done(["run", os.path.join(work, "nope.yaml")], 2, "config error", "nope.yaml")
    # input, model
    json_done(["run", wf, "--set", f"input.path={work}/missing.tif"], 3, "input error", "missing.tif")
    json_done(["run", wf, "--set", f"model.weights={work}/missing.h5"], 3, "model error", "missing.h5")
    # resource: output.dir is a file
    afile = os.path.join(work, "jf_afile")
    open(afile, "w").close()
    json_done(["run", wf, "--set", f"output.dir={afile}"], 4, "output error", "jf_afile")
    # locked, interrupted, parts: a slow run (stride 4) in the background
    slow = ["--set", "tiling.stride=4", "--chunk-rows", "4"]
    p = subprocess.Popen([BIN, "run", wf, "--progress=json", *slow], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    lock = f"{out}/.tilewise/{os.path.splitext(os.path.basename(sample))[0]}/lock.0001-of-0001"
    deadline = time.time() + 120
    while time.time() < deadline and not (os.path.exists(lock) and os.path.getsize(lock)):
        time.sleep(0.02)
    json_done(["run", wf, *slow], 7, "locked", f"process {p.pid}")
    deadline = time.time() + 120
    while time.time() < deadline and not glob.glob(f"{out}/.tilewise/*/rows-*.bin"):
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=300)
    if p.returncode == 75:
        ev = read_events(err)
        check(ev[-1]["event"] == "done" and ev[-1]["exit_code"] == 75 and ev[-1]["status"] == "interrupted"
              and ev[-1]["message"], f"SIGTERM: a done event with exit 75: {ev[-1]}", say_ok=True)
        json_done(["run", wf, "--set", "tiling.stride=8"], 6, "parts of another run",
                  "tiling.stride")
    else:
        print(f"note: the slow run finished before SIGTERM (exit {p.returncode}); interrupted and "
              "parts not exercised this time")


def test_progress(work, gdal, rgb):
    sample = os.path.join(SRC, "sample_data", "L7_ETMs.tif")
    copy = os.path.join(work, "second.tif")
    shutil.copy(sample, copy)
    wf, out = workflow(work, "prog", [sample, copy])
    r = tw("run", wf, "--set", "tiling.batch=8", "--progress=json")  # 36 tiles: 5 batches
    check(r.returncode == 0, f"json run: {r.stderr}")
    events = read_events(r.stderr)
    rep = json.load(open(os.path.join(out, "run.json")))
    starts = [e for e in events if e["event"] == "start"]
    check([e["input"] for e in starts] == [sample, copy], f"a start event per input: {starts}")
    for inp, res in zip([sample, copy], rep["inputs"]):
        prog = [e for e in events if e["event"] == "progress" and e["input"] == inp]
        check(len(prog) >= 3, f"{inp}: several progress events ({len(prog)})")
        fr = [e["fraction"] for e in prog]
        check(all(a <= b for a, b in zip(fr, fr[1:])) and fr[0] == 0 and fr[-1] == 1,
              f"{inp}: fractions rise from 0 to 1: {fr}")
        done = [e["tiles_done"] for e in prog]
        check(all(a <= b for a, b in zip(done, done[1:])), f"{inp}: tiles_done increases")
        check(all(e["tiles_total"] == res["tiles_total"] for e in prog) and done[-1] == res["tiles_total"],
              f"{inp}: tiles_total = run.json's, reached")
        check(all(abs(e["fraction"] - e["tiles_done"] / e["tiles_total"]) < 1e-5 for e in prog),
              f"{inp}: fraction = tiles_done / tiles_total")
        check(prog[-1]["eta_s"] == 0 and prog[-1]["tiles_per_s"] > 0, f"{inp}: rate and ETA at the end")
    last = events[-1]
    check(last["event"] == "done" and last["status"] == "ok" and last["exit_code"] == 0,
          f"final done event: {last}")
    check(last["tiles_classified"] == rep["tiles_classified"], "done event's tile count = run.json's")
    check(last["report"] == os.path.join(out, "run.json"), "done event names the report")

    # A run that fails ends with a done event carrying the exit code.
    wf3, out3 = workflow(work, "prog_fail", [rgb])
    r = tw("run", wf3, "--progress=json")
    check(r.returncode == 3, f"json failing run: exit 3 ({r.returncode})")
    ev = read_events(r.stderr)
    check(ev and ev[-1]["event"] == "done" and ev[-1]["exit_code"] == 3 and "rgb.tif" in ev[-1]["message"],
          f"failing run's done event: {ev}")

    test_json_failures(work, sample)

    shutil.rmtree(out)
    r = tw("run", wf, "-q")
    check(r.returncode == 0 and r.stderr == "", f"-q: nothing on stderr ({r.stderr!r})")
    shutil.rmtree(out)
    r = tw("run", wf)
    line = "0...10...20...30...40...50...60...70...80...90...100 - done."
    check(r.stderr.count(line) == 2, f"GDAL-style progress per input:\n{r.stderr}")

    # On a terminal: the line is redrawn with tiles/s and the time left.
    shutil.rmtree(out)
    master, slave = pty.openpty()
    p = subprocess.Popen([BIN, "run", wf, "--set", "tiling.batch=8"], stdout=subprocess.DEVNULL,
                         stderr=slave)
    os.close(slave)
    data = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    p.wait()
    os.close(master)
    text = data.decode(errors="replace")
    check(p.returncode == 0, "tty run")
    check(re.search(r"\d+/\d+ tiles, \d+ tiles/s, [\d:?]+ left", text), f"tty: tiles/s and ETA:\n{text!r}")
    check(re.search(r"100 - done\. \d+ tiles in [\d:]+ \(\d+ tiles/s\)", text), f"tty: done line:\n{text!r}")


def main():
    gdal = gdal_or_skip()
    if gdal is None:
        return 77
    work = tempfile.mkdtemp(prefix="tw_cli_")
    test_help()
    test_info(gdal)
    rgb = test_validate(work, gdal)
    test_progress(work, gdal, rgb)
    shutil.rmtree(work)
    print("ok: help + man page, info (raster/model vs GDAL and the file), validate (plan, advice, "
          "mismatch exit 3 with no output), progress (quiet, text, tty, JSON)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
