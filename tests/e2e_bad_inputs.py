#!/usr/bin/python3
"""Bad inputs end to end: each case gives one clear line on stderr naming the
file, key or tile, the documented exit code, no crash (no signal), and no
output that looks finished (no product under its final name; a run.json, if
any, says the run failed). The table of cases is tests/bad_inputs/README.md.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

FIX = os.environ.get("TW_FIXTURES")
SRC = os.environ.get("TW_SOURCE_DIR")
BIN = os.environ.get("TW_BIN")

EXIT_USAGE, EXIT_INPUT, EXIT_RESOURCE = 2, 3, 4


def base_workflow(tmp):
    return {
        "input.path": f"{SRC}/sample_data/L7_ETMs.tif",
        "model.weights": f"{FIX}/resnet18_6b_7c.safetensors",
        "tiling.tile": "64",
        "runtime.device": "cpu",
        "runtime.memory": "512MiB",
        "output.dir": f"{tmp}/out",
    }


def to_yaml(keys):
    """Flat 'a.b' keys into a two-level YAML text (values written verbatim)."""
    groups = {}
    for k, v in keys.items():
        g, _, rest = k.partition(".")
        groups.setdefault(g, []).append((rest, v))
    lines = []
    for g, items in groups.items():
        lines.append(f"{g}:")
        for k, v in items:
            lines.append(f"  {k}: {v}")
    return "\n".join(lines) + "\n"


def make_files(tmp):
    """Damaged inputs made from real files."""
    files = {}
    with open(f"{SRC}/sample_data/L7_ETMs.tif", "rb") as f:
        tif = f.read()
    files["truncated_tif"] = f"{tmp}/truncated.tif"
    with open(files["truncated_tif"], "wb") as f:
        f.write(tif[: len(tif) // 3])
    files["header_only_tif"] = f"{tmp}/header.tif"
    with open(files["header_only_tif"], "wb") as f:
        f.write(tif[:200])
    files["text_tif"] = f"{tmp}/notes.tif"
    with open(files["text_tif"], "w") as f:
        f.write("this is not a raster\n")
    files["text_model"] = f"{tmp}/model.safetensors"
    with open(files["text_model"], "w") as f:
        f.write("not a model\n")
    with open(f"{FIX}/resnet18_6b_7c.safetensors", "rb") as f:
        st = f.read()
    files["truncated_model"] = f"{tmp}/trunc.safetensors"
    with open(files["truncated_model"], "wb") as f:
        f.write(st[: len(st) // 2])
    files["a_file"] = f"{tmp}/afile"
    with open(files["a_file"], "w") as f:
        f.write("x")
    # a 3-band raster (the model wants 6)
    from osgeo import gdal
    gdal.UseExceptions()
    gdal.Translate(f"{tmp}/rgb.tif", f"{SRC}/sample_data/L7_ETMs.tif", bandList=[1, 2, 3])
    files["rgb"] = f"{tmp}/rgb.tif"
    return files


def cases(tmp, files):
    """(name, workflow overrides or raw text, extra args, exit code, must-contain)."""
    return [
        ("workflow file missing", None, ["run", f"{tmp}/nope.yaml"], EXIT_USAGE, "nope.yaml"),
        ("YAML syntax error", "input:\n  path: [a, b\nmodel: {\n", None, EXIT_USAGE, ":"),
        ("unknown key", {"tiling.tilesize": "64"}, None, EXIT_USAGE, "tiling.tilesize"),
        ("wrong type", {"tiling.tile": "big"}, None, EXIT_USAGE, "tiling.tile"),
        ("stride does not divide tile", {"tiling.stride": "48"}, None, EXIT_USAGE, "stride"),
        ("mean of the wrong length", {"model.mean": "[1, 2, 3]"}, None, EXIT_USAGE, "mean"),
        ("bad memory size", {"runtime.memory": "lots"}, None, EXIT_USAGE, "runtime.memory"),
        ("model file missing", {"model.weights": f"{tmp}/missing.safetensors"}, None, EXIT_INPUT,
         "missing.safetensors"),
        ("model file is text", {"model.weights": files["text_model"]}, None, EXIT_INPUT,
         "model.safetensors"),
        ("model file truncated", {"model.weights": files["truncated_model"]}, None, EXIT_INPUT,
         "trunc.safetensors"),
        ("arch disagrees with weights", {"model.arch": "resnet50"}, None, EXIT_INPUT, "resnet50"),
        ("raster missing", {"input.path": f"{tmp}/nothere.tif"}, None, EXIT_INPUT, "nothere.tif"),
        ("raster is a text file", {"input.path": files["text_tif"]}, None, EXIT_INPUT, "notes.tif"),
        ("raster header only", {"input.path": files["header_only_tif"]}, None, EXIT_INPUT,
         "header.tif"),
        ("raster truncated mid-data", {"input.path": files["truncated_tif"]}, None, EXIT_INPUT,
         "truncated.tif"),
        ("fewer bands than the model", {"input.path": files["rgb"]}, None, EXIT_INPUT, "rgb.tif"),
        ("band out of range", {"input.bands": "[1, 2, 3, 4, 5, 9]"}, None, EXIT_INPUT, "9"),
        ("output dir is a file", {"output.dir": files["a_file"]}, None, EXIT_RESOURCE, "afile"),
        ("memory budget too small", {"runtime.memory": "20MiB"}, None, EXIT_RESOURCE, "needs"),
        ("no such CUDA device", {"runtime.device": "cuda:3"}, None, EXIT_RESOURCE, "cuda:3"),
        ("--set of an unknown key", {}, ["--set", "tiling.size=3"], EXIT_USAGE, "tiling.size"),
        ("--shard out of range", {}, ["--shard", "3/2"], EXIT_USAGE, "3/2"),
    ]


def finished_products(outdir):
    found = []
    for path in glob.glob(os.path.join(outdir, "*")):
        name = os.path.basename(path)
        if name.endswith(".part") or name.startswith("."):
            continue
        if name.endswith(".json"):
            with open(path) as f:
                if json.load(f).get("status") == "ok":
                    found.append(name)
            continue
        found.append(name)
    return found


def main():
    if not (FIX and SRC and BIN):
        print("TW_FIXTURES/TW_SOURCE_DIR/TW_BIN not set: skipped")
        return 77
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        files = make_files(tmp)
        for name, change, args, code, needle in cases(tmp, files):
            shutil.rmtree(f"{tmp}/out", ignore_errors=True)
            wf = f"{tmp}/flow.yaml"
            if isinstance(change, str):
                text = change
            else:
                keys = base_workflow(tmp)
                keys.update(change or {})
                text = to_yaml(keys)
            with open(wf, "w") as f:
                f.write(text)
            if args and args[0] == "run":
                argv = [BIN, *args]
            else:
                argv = [BIN, "run", wf, "-q", *(args or [])]
            r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            lines = [l for l in r.stderr.splitlines() if l.strip()]
            problems = []
            if r.returncode < 0:
                problems.append(f"killed by signal {-r.returncode}")
            if r.returncode != code:
                problems.append(f"exit {r.returncode}, expected {code}")
            if len(lines) != 1:
                problems.append(f"{len(lines)} lines on stderr")
            if needle not in r.stderr:
                problems.append(f"message lacks '{needle}'")
            left = finished_products(f"{tmp}/out") if os.path.isdir(f"{tmp}/out") else []
            if left:
                problems.append(f"left finished-looking outputs {left}")
            status = "ok" if not problems else "FAIL: " + "; ".join(problems)
            print(f"{name:34s} exit {r.returncode}  {lines[0] if lines else '(no message)'}")
            if problems:
                print(f"    {status}\n    stderr: {r.stderr.strip()}")
                failures.append(name)
        n_cases = len(cases(tmp, files))
    print(f"{n_cases - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
