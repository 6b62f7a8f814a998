#!/usr/bin/python3
"""Bad inputs end to end, one case per row of tests/bad_inputs/README.md.

An error case must give one clear line on stderr naming the file, key or tile,
the documented exit code, no crash (no signal), and no output that looks
finished (no product under its final name that GDAL opens; a run.json, if
any, says the run failed).

Some odd inputs are not errors (all nodata, 1 x 1, smaller than one tile,
NaN/Inf pixels, a 70000 x 70000 raster): those must exit 0, print nothing on
stderr with -q but the one warning validate's advice gives for them (a raster
mostly padding, one without a geotransform), and their outputs are checked
(nodata cells, counts in run.json, finite probabilities).
"""
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

from e2eutil import BIN, FIX, SRC, finished_products

sys.path.insert(0, os.path.join(SRC or ".", "tests", "bad_inputs"))
sys.path.insert(0, os.path.join(SRC or ".", "tools"))

EXIT_OK, EXIT_USAGE, EXIT_INPUT, EXIT_RESOURCE, EXIT_SKIPPED = 0, 2, 3, 4, 5
PREFLIGHT_MAX_S = 15  # a preflight failure comes before any tile: seconds, not minutes
CLASS_NODATA = 255
PROB_NODATA = -1.0


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


# ---------------------------------------------------------------- inputs --

def write_raster(path, arr, like, dtype=None, nodata=None):
    """arr [bands][h][w] as a GeoTIFF with like's georeferencing."""
    from osgeo import gdal, gdal_array
    gdal.UseExceptions()
    b, h, w = arr.shape
    gdt = dtype or gdal_array.NumericTypeCodeToGDALTypeCode(arr.dtype)
    ds = gdal.GetDriverByName("GTiff").Create(path, w, h, b, gdt)
    ds.SetGeoTransform(like.GetGeoTransform())
    ds.SetProjection(like.GetProjection())
    for i in range(b):
        band = ds.GetRasterBand(i + 1)
        band.WriteArray(arr[i])
        if nodata is not None:
            band.SetNoDataValue(nodata)
    ds = None


def raw_safetensors(header, data):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def make_models(tmp, files):
    """Damaged copies of the test model that would otherwise fit the raster."""
    import safetensors_io
    src = f"{FIX}/resnet18_6b_7c.safetensors"
    sd, _ = safetensors_io.load(src)
    with open(src, "rb") as f:
        good = f.read()
    n = struct.unpack("<Q", good[:8])[0]
    hdr = json.loads(good[8:8 + n])
    data = good[8 + n:]

    def save(key, name, blob):
        files[key] = f"{tmp}/{name}"
        with open(files[key], "wb") as f:
            f.write(blob)

    save("text_model", "model.safetensors", b"not a model\n")
    save("truncated_model", "trunc.safetensors", good[: len(good) // 2])
    no_key = {k: v for k, v in sd.items() if k != "layer2.0.downsample.0.weight"}
    save("missing_key", "nokey.safetensors", safetensors_io.encode(no_key))
    wrong = dict(sd)
    w = sd["layer1.0.conv1.weight"]
    wrong["layer1.0.conv1.weight"] = w.reshape(w.shape[0], w.shape[1], 1, -1)
    save("wrong_shape", "shape.safetensors", safetensors_io.encode(wrong))
    h = json.loads(json.dumps(hdr))
    b, e = h["fc.bias"]["data_offsets"]
    h["fc.bias"]["data_offsets"] = [len(data) - (e - b) + 4, len(data) + 4]
    save("past_end", "pastend.safetensors", raw_safetensors(h, data))
    h = json.loads(json.dumps(hdr))
    b, e = h["fc.weight"]["data_offsets"]
    h["fc.bias"]["data_offsets"] = [b, b + 4 * 7]  # inside fc.weight's bytes
    save("overlap", "overlap.safetensors", raw_safetensors(h, data))
    save("header_past_file", "hdrlen.safetensors", struct.pack("<Q", len(good) + 1) + good[8:])
    save("header_huge", "hdrhuge.safetensors", struct.pack("<Q", 1 << 62) + good[8:])
    # a 4-band model: conv1 cut to its first 4 input channels
    four = dict(sd)
    four["conv1.weight"] = sd["conv1.weight"][:, :4].copy()
    save("four_band", "four.safetensors", safetensors_io.encode(four))
    with open(f"{FIX}/resnet18_6b_7c.h5", "rb") as f:
        h5 = f.read()
    save("truncated_h5", "trunc.h5", h5[: len(h5) * 2 // 3])


def make_files(tmp):
    """Damaged and odd inputs made from real files."""
    from osgeo import gdal
    import damage
    gdal.UseExceptions()
    l7 = f"{SRC}/sample_data/L7_ETMs.tif"
    files = {}
    with open(l7, "rb") as f:
        tif = f.read()

    def save(key, name, blob):
        files[key] = f"{tmp}/{name}"
        with open(files[key], "wb") as f:
            f.write(blob)

    save("truncated_tif", "truncated.tif", tif[: len(tif) // 3])
    save("header_only_tif", "header.tif", tif[:200])
    save("text_tif", "notes.tif", b"this is not a raster\n")
    save("bad_magic_tif", "magic.tif", b"II\x2b\x01" + tif[4:])
    save("bad_ifd_tif", "ifd.tif", tif[:4] + struct.pack("<I", len(tif) + 4096) + tif[8:])
    save("a_file", "afile", b"x")
    make_models(tmp, files)

    # a 3-band raster (the model wants 6)
    gdal.Translate(f"{tmp}/rgb.tif", l7, bandList=[1, 2, 3])
    files["rgb"] = f"{tmp}/rgb.tif"

    # one damaged DEFLATE block in the middle of a tiled copy
    files["damaged"] = f"{tmp}/damaged.tif"
    damage.make_tiled(l7, files["damaged"])
    damage.garble_block(files["damaged"], 3, 2)

    ds = gdal.Open(l7)
    a = ds.ReadAsArray()
    files["one"] = f"{tmp}/one.tif"
    write_raster(files["one"], a[:, :1, :1], ds)
    files["small"] = f"{tmp}/small.tif"
    write_raster(files["small"], a[:, :30, :40], ds)
    files["allnd"] = f"{tmp}/allnd.tif"
    write_raster(files["allnd"], np.zeros((6, 100, 130), np.uint8), ds, nodata=0)
    # Float32: tile (0,0) all NaN, tile (0,1) all +Inf, a few -Inf pixels in
    # tile (1,0) (not enough to make it nodata), the rest real values.
    f32 = a[:, :128, :192].astype(np.float32)
    f32[:, :64, :64] = np.nan
    f32[:, :64, 64:128] = np.inf
    f32[2, 70:75, 10:12] = -np.inf
    files["naninf"] = f"{tmp}/naninf.tif"
    write_raster(files["naninf"], f32, ds)

    # 70000 x 70000 (4.9e9 pixels: every pixel offset overflows 32 bits)
    # declared by a VRT without data but the sample scene in its bottom-right
    # corner; everything else is nodata (0).
    files["huge"] = f"{tmp}/huge.vrt"
    W = H = 70000
    with open(files["huge"], "w") as f:
        f.write(f'<VRTDataset rasterXSize="{W}" rasterYSize="{H}">\n')
        for b in range(1, 7):
            f.write(f'  <VRTRasterBand dataType="Byte" band="{b}">\n'
                    f'    <NoDataValue>0</NoDataValue>\n'
                    f'    <SimpleSource><SourceFilename>{l7}</SourceFilename>'
                    f'<SourceBand>{b}</SourceBand>'
                    f'<SrcRect xOff="0" yOff="0" xSize="349" ySize="352"/>'
                    f'<DstRect xOff="{W - 349}" yOff="{H - 352}" xSize="349" ySize="352"/>'
                    f'</SimpleSource>\n  </VRTRasterBand>\n')
        f.write("</VRTDataset>\n")
    return files


# ---------------------------------------------------------------- checks --

def read(path):
    from osgeo import gdal
    gdal.UseExceptions()
    return gdal.Open(path).ReadAsArray()


def report(out, name="run.json"):
    with open(os.path.join(out, name)) as f:
        return json.load(f)


def check_all_nodata(out):
    cls = read(f"{out}/allnd.class.tif")
    prob = read(f"{out}/allnd.prob.tif")
    r = report(out)["inputs"][0]
    problems = []
    if cls.shape != (2, 3) or (cls != CLASS_NODATA).any():
        problems.append(f"class map {cls.shape} not all nodata: {np.unique(cls)}")
    if (prob != PROB_NODATA).any():
        problems.append("probabilities not all nodata")
    if not (r["tiles_nodata"] == r["tiles_total"] == 6 and r["tiles_classified"] == 0):
        problems.append(f"run.json tiles: {r['tiles_nodata']} nodata of {r['tiles_total']}")
    if r["nodata_cells"] != 6:
        problems.append(f"run.json nodata_cells {r['nodata_cells']}, expected 6")
    return problems


def check_single_cell(stem):
    def check(out):
        cls = read(f"{out}/{stem}.class.tif")
        prob = read(f"{out}/{stem}.prob.tif")
        r = report(out)["inputs"][0]
        problems = []
        if cls.shape != (1, 1) or cls[0, 0] == CLASS_NODATA:
            problems.append(f"class map {cls.shape} {cls.ravel()[:4]}")
        if not np.isclose(prob.sum(), 1.0, atol=1e-4):
            problems.append(f"probabilities sum to {prob.sum()}")
        if r["tiles_classified"] != 1 or r["nodata_cells"] != 0:
            problems.append(f"run.json: {r['tiles_classified']} classified, "
                            f"{r['nodata_cells']} nodata cells")
        return problems
    return check


def check_naninf(out):
    cls = read(f"{out}/naninf.class.tif")
    prob = read(f"{out}/naninf.prob.tif")
    r = report(out)["inputs"][0]
    problems = []
    if cls.shape != (2, 3):
        return [f"class map shape {cls.shape}"]
    if cls[0, 0] != CLASS_NODATA or cls[0, 1] != CLASS_NODATA:
        problems.append(f"NaN/Inf tiles not nodata: {cls[0, :2]}")
    if (cls[0, 2] == CLASS_NODATA) or (cls[1] == CLASS_NODATA).any():
        problems.append(f"real tiles came out nodata: {cls}")
    if not np.isfinite(prob).all():
        problems.append("non-finite probabilities")
    if (prob[:, 0, :2] != PROB_NODATA).any():
        problems.append("NaN/Inf tiles have probabilities")
    if r["tiles_nodata"] != 2 or r["tiles_classified"] != 4:
        problems.append(f"run.json: {r['tiles_classified']} classified, {r['tiles_nodata']} nodata")
    return problems


def check_skipped_input(out):
    r = report(out)
    problems = []
    if r.get("inputs_skipped") != 1 or r.get("exit_code") != EXIT_SKIPPED:
        problems.append(f"run.json inputs_skipped {r.get('inputs_skipped')}, "
                        f"exit_code {r.get('exit_code')}")
    skipped = [i for i in r["inputs"] if i.get("skipped")]
    if len(skipped) != 1 or "nothere.tif" not in skipped[0]["path"]:
        problems.append(f"skipped inputs {skipped}")
    if not os.path.exists(f"{out}/L7_ETMs.class.tif"):
        problems.append("the readable input was not classified")
    return problems


def make_out(tmp):
    """An existing output.dir, so that a failed run writes its run.failed.json."""
    os.makedirs(f"{tmp}/out", exist_ok=True)


def check_huge_validate(stdout):
    want = "tiles 1094 x 1094 = 1196836"
    return [] if want in stdout and "70000 x 70000" in stdout else [f"plan lacks '{want}'"]


def check_huge_shard(out):
    r = report(out, "run.shard1094-of-1094.json")
    i = r["inputs"][0]
    problems = []
    if r["status"] != "ok":
        problems.append(f"status {r['status']}")
    # Last tile row: 1094 tiles; the scene covers columns 69651.. so tiles
    # 1088 (45 of 64 columns valid) to 1093 are classified, the rest nodata.
    if (i["tiles_classified"], i["tiles_nodata"]) != (6, 1088):
        problems.append(f"{i['tiles_classified']} classified, {i['tiles_nodata']} nodata; "
                        "expected 6 and 1088")
    if (i["grid_width"], i["grid_height"]) != (1094, 1094):
        problems.append(f"grid {i['grid_width']} x {i['grid_height']}")
    chunks = glob.glob(f"{out}/.tilewise/huge/rows-0001093-0001094.bin")
    if not chunks:
        problems.append("no committed chunk for the last row")
    return problems


# ----------------------------------------------------------------- cases --

def case(name, change=None, args=None, code=EXIT_OK, needle=None, check=None, cmd="run",
         setup=None, preflight=False, warning=None):
    """change: workflow overrides (dict) or a raw YAML text; args: extra
    command-line arguments, or the whole argv after the binary when it starts
    with a subcommand; check(out or stdout) -> list of problems (success cases);
    setup(tmp) -> None or a reason to skip; preflight: the failure must come
    before any tile (run.json, when written, shows 0 tiles; seconds of wall
    time); warning: a success case's one expected warning (validate's advice, which
    run gives too, even with -q), a piece of its one line."""
    return dict(name=name, change=change, args=args, code=code, needle=needle, check=check,
                cmd=cmd, setup=setup, preflight=preflight, warning=warning)


def cases(tmp, files):
    f = files
    return [
        # workflow and command line
        case("workflow file missing", args=["run", f"{tmp}/nope.yaml"], code=EXIT_USAGE,
             needle="nope.yaml"),
        case("YAML syntax error", "input:\n  path: [a, b\nmodel: {\n", code=EXIT_USAGE,
             needle="flow.yaml:"),
        case("YAML tab indentation", "input:\n\tpath: a.tif\n", code=EXIT_USAGE,
             needle="flow.yaml:"),
        case("unknown key", {"tiling.tilesize": "64"}, code=EXIT_USAGE, needle="tiling.tilesize"),
        case("unknown section", {"outptu.dir": "x"}, code=EXIT_USAGE, needle="outptu"),
        case("wrong type", {"tiling.tile": "big"}, code=EXIT_USAGE, needle="tiling.tile"),
        case("wrong type: list expected", {"input.bands": "abc"}, code=EXIT_USAGE,
             needle="input.bands"),
        case("wrong type: map for a number", {"input.scale": "{a: 1}"}, code=EXIT_USAGE,
             needle="input.scale"),
        case("value out of range", {"tiling.max_nodata_fraction": "2"}, code=EXIT_USAGE,
             needle="tiling.max_nodata_fraction"),
        case("unknown enum value", {"tiling.edge": "wrap"}, code=EXIT_USAGE, needle="tiling.edge"),
        case("stride does not divide tile", {"tiling.stride": "48"}, code=EXIT_USAGE,
             needle="stride"),
        case("mean of the wrong length", {"model.mean": "[1, 2, 3]"}, code=EXIT_USAGE,
             needle="mean"),
        case("std of the wrong length", {"model.std": "[1, 2, 3, 4, 5, 6, 7]"}, code=EXIT_USAGE,
             needle="model.std"),
        case("bad memory size", {"runtime.memory": "lots"}, code=EXIT_USAGE,
             needle="runtime.memory"),
        case("--set of an unknown key", {}, ["--set", "tiling.size=3"], code=EXIT_USAGE,
             needle="tiling.size"),
        case("--shard out of range", {}, ["--shard", "3/2"], code=EXIT_USAGE, needle="3/2"),
        case("tiling.tile below 32", {"tiling.tile": "16"}, code=EXIT_USAGE,
             needle="flow.yaml:6: tiling.tile: 16 is out of range (expected 32..4096)"),
        case("--set stride that does not divide the bundle's tile",
             f"input:\n  path: {SRC}/sample_data/L7_ETMs.tif\nmodel:\n"
             f"  weights: {FIX}/resnet18_6b_7c.h5\nruntime:\n  device: cpu\n"
             f"output:\n  dir: {tmp}/out\n", ["--set", "tiling.stride=24"], code=EXIT_USAGE,
             needle="expected a divisor such as 16", setup=make_out, preflight=True),
        case("creation option typo (COMPRES)", {"output.creation_options": "[COMPRES=ZSTD]"},
             code=EXIT_USAGE, needle="COMPRES is not a creation option of GDAL's GTiff driver "
             "(did you mean COMPRESS?)", setup=make_out, preflight=True),
        case("creation option value (COMPRESS=ZSTDX)",
             {"output.creation_options": "[COMPRESS=ZSTDX]"}, code=EXIT_USAGE,
             needle="COMPRESS=ZSTDX: GDAL's GTiff driver accepts COMPRESS = NONE", setup=make_out,
             preflight=True),
        case("COG option with GTiff (BLOCKSIZE)", {"output.creation_options": "[BLOCKSIZE=256]"},
             code=EXIT_USAGE, needle="BLOCKSIZE is not a creation option of GDAL's GTiff driver",
             setup=make_out, preflight=True),
        case("COMPRESS=JPEG with float32 probabilities", {"output.creation_options":
                                                           "[COMPRESS=JPEG]"},
             code=EXIT_USAGE, needle="output.creation_options: a trial write of the outputs "
             "(format GTiff) failed", setup=make_out, preflight=True),
        case("creation option typo: submit --dry-run",
             {"output.creation_options": "[COMPRES=ZSTD]"}, ["submit", "--array", "2", "--dry-run"],
             code=EXIT_USAGE, needle="COMPRES is not a creation option", preflight=True),
        case("creation option typo: validate", {"output.creation_options": "[COMPRES=ZSTD]"},
             cmd="validate", code=EXIT_USAGE, needle="COMPRES", preflight=True),
        # model files
        case("model file missing", {"model.weights": f"{tmp}/missing.safetensors"},
             code=EXIT_INPUT, needle="missing.safetensors"),
        case("model file is text", {"model.weights": f["text_model"]}, code=EXIT_INPUT,
             needle="model.safetensors"),
        case("model file truncated", {"model.weights": f["truncated_model"]}, code=EXIT_INPUT,
             needle="trunc.safetensors"),
        case("weights: a key missing", {"model.weights": f["missing_key"]}, code=EXIT_INPUT,
             needle="layer2.0.downsample.0.weight"),
        case("weights: a wrong shape", {"model.weights": f["wrong_shape"]}, code=EXIT_INPUT,
             needle="layer1.0.conv1.weight"),
        case("safetensors: offsets past the end", {"model.weights": f["past_end"]},
             code=EXIT_INPUT, needle="pastend.safetensors"),
        case("safetensors: overlapping tensors", {"model.weights": f["overlap"]},
             code=EXIT_INPUT, needle="overlap.safetensors"),
        case("safetensors: header longer than the file", {"model.weights": f["header_past_file"]},
             code=EXIT_INPUT, needle="hdrlen.safetensors"),
        case("safetensors: header length 2^62", {"model.weights": f["header_huge"]},
             code=EXIT_INPUT, needle="hdrhuge.safetensors"),
        case("HDF5 bundle truncated", {"model.weights": f["truncated_h5"]}, code=EXIT_INPUT,
             needle="trunc.h5"),
        case("arch disagrees with weights", {"model.arch": "resnet50"}, code=EXIT_INPUT,
             needle="resnet50"),
        case("PyTorch checkpoint as weights", {"model.weights": f"{FIX}/resnet18_6b_7c.pth"},
             code=EXIT_INPUT, needle="convert it with tools/export_model.py", setup=make_out,
             preflight=True),
        # rasters
        case("raster missing", {"input.path": f"{tmp}/nothere.tif"}, code=EXIT_INPUT,
             needle="nothere.tif"),
        case("raster is a text file", {"input.path": f["text_tif"]}, code=EXIT_INPUT,
             needle="notes.tif"),
        case("raster header only", {"input.path": f["header_only_tif"]}, code=EXIT_INPUT,
             needle="header.tif"),
        case("raster: corrupt TIFF magic", {"input.path": f["bad_magic_tif"]}, code=EXIT_INPUT,
             needle="magic.tif"),
        case("raster: IFD offset past the end", {"input.path": f["bad_ifd_tif"]},
             code=EXIT_INPUT, needle="ifd.tif"),
        case("raster truncated mid-data", {"input.path": f["truncated_tif"]}, code=EXIT_INPUT,
             needle="truncated.tif"),
        case("one damaged block (on_error: fail)", {"input.path": f["damaged"]},
             code=EXIT_INPUT, needle="x=192 y=128"),
        case("fewer bands than the model", {"input.path": f["rgb"]}, code=EXIT_INPUT,
             needle="rgb.tif"),
        case("band out of range", {"input.bands": "[1, 2, 3, 4, 5, 9]"}, code=EXIT_INPUT,
             needle="9"),
        case("4-band model, 3-band raster", {"input.path": f["rgb"],
                                              "model.weights": f["four_band"],
                                              "input.bands": "[1, 2, 3, 4]"},
             code=EXIT_INPUT, needle="rgb.tif has 3 bands, but input.bands asks for band 4: the "
             "model", setup=make_out, preflight=True),
        case("a missing input in a list, on_error: fail",
             {"input.path": f"[{SRC}/sample_data/L7_ETMs.tif, {tmp}/nothere.tif]"},
             code=EXIT_INPUT, needle="nothere.tif", setup=make_out, preflight=True),
        case("a missing input in a list, on_error: skip (exit 5)",
             {"input.path": f"[{SRC}/sample_data/L7_ETMs.tif, {tmp}/nothere.tif]",
              "input.on_error": "skip", "output.products": "[class]"},
             code=EXIT_SKIPPED, check=check_skipped_input),
        case("every input of a list missing, on_error: skip",
             {"input.path": f"[{tmp}/nothere.tif, {tmp}/nothere2.tif]",
              "input.on_error": "skip"},
             code=EXIT_INPUT, needle="no input can be opened", setup=make_out, preflight=True),
        case("smaller than a tile, edge: skip",
             {"input.path": f["small"], "tiling.edge": "skip"}, code=EXIT_INPUT,
             needle="small.tif"),
        case("all nodata (success)", {"input.path": f["allnd"], "output.products": "[class, prob]"},
             check=check_all_nodata),
        case("1 x 1 raster, edge: pad (success)",
             {"input.path": f["one"], "output.products": "[class, prob]"},
             check=check_single_cell("one"), warning="100 % of the pixels of its tiles are padding"),
        case("smaller than a tile, edge: pad (success)",
             {"input.path": f["small"], "output.products": "[class, prob]"},
             check=check_single_cell("small"), warning="71 % of the pixels of its tiles are padding"),
        case("NaN/Inf pixels are nodata (success)",
             {"input.path": f["naninf"], "output.products": "[class, prob]"}, check=check_naninf),
        case("70000 x 70000 VRT: validate (success)", {"input.path": f["huge"]}, cmd="validate",
             check=check_huge_validate),
        case("70000 x 70000 VRT: last shard (success)", {"input.path": f["huge"]},
             ["--shard", "1094/1094"], check=check_huge_shard, warning="no geotransform"),
        # outputs and resources
        case("output dir is a file", {"output.dir": f["a_file"]}, code=EXIT_RESOURCE,
             needle="afile"),
        case("output dir is a file: validate", {"output.dir": f["a_file"]}, cmd="validate",
             code=EXIT_RESOURCE, needle="afile exists and is not a directory", preflight=True),
        case("output dir under a file", {"output.dir": f"{f['a_file']}/sub"},
             code=EXIT_RESOURCE, needle="afile/sub"),
        case("output product path is a directory", {}, code=EXIT_RESOURCE,
             needle="L7_ETMs.class.tif", setup=lambda t: os.makedirs(f"{t}/out/L7_ETMs.class.tif")),
        case("output dir not writable", {"output.dir": f"{tmp}/ro/out"}, code=EXIT_RESOURCE,
             needle=f"{tmp}/ro/out", setup=read_only_dir),
        case("memory budget too small", {"runtime.memory": "20MiB"}, code=EXIT_RESOURCE,
             needle="needs"),
        case("no such CUDA device", {"runtime.device": "cuda:3"}, code=EXIT_RESOURCE,
             needle="cuda:3"),
    ]


MOUNTS = []


def read_only_dir(tmp):
    """A directory nobody may write to. As root, permissions do not stop
    writes, so a read-only tmpfs is mounted there; returns a reason to skip
    when neither works."""
    d = f"{tmp}/ro"
    if os.path.ismount(d):
        return None
    os.makedirs(d, exist_ok=True)
    if os.geteuid() != 0:
        os.chmod(d, 0o555)
        return None
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", d],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return f"running as root and mount refused ({r.stderr.strip() or r.returncode})"
    MOUNTS.append(d)
    return None


def run_case(c, tmp):
    out = f"{tmp}/out"
    shutil.rmtree(out, ignore_errors=True)
    if c["setup"]:
        why = c["setup"](tmp)
        if why:
            return "skipped", why, []
    wf = f"{tmp}/flow.yaml"
    if isinstance(c["change"], str):
        text = c["change"]
    else:
        keys = base_workflow(tmp)
        keys.update(c["change"] or {})
        text = to_yaml(keys)
    with open(wf, "w") as fh:
        fh.write(text)
    args = c["args"] or []
    if args and args[0] == "run":
        argv = [BIN, *args]
    elif args and args[0] == "submit":
        argv = [BIN, "submit", wf, *args[1:]]
    elif c["cmd"] == "validate":
        argv = [BIN, "validate", wf, *args]
    else:
        argv = [BIN, "run", wf, "-q", *args]
    import time
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    wall = time.monotonic() - t0
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    problems = []
    if r.returncode < 0:
        problems.append(f"killed by signal {-r.returncode}")
    if r.returncode != c["code"]:
        problems.append(f"exit {r.returncode}, expected {c['code']}")
    if c["preflight"]:
        if wall > PREFLIGHT_MAX_S:
            problems.append(f"took {wall:.1f} s: not a preflight failure")
        rj = os.path.join(out, "run.failed.json")
        if c["cmd"] == "run" and c["setup"] is make_out:
            if os.path.exists(os.path.join(out, "run.json")):
                problems.append("a failed run wrote run.json (it belongs to a finished run)")
            if not os.path.exists(rj):
                problems.append("no run.failed.json in the existing output.dir")
            else:
                with open(rj) as fh:
                    rep_ = json.load(fh)
                if rep_.get("tiles_classified", 0) != 0 or rep_.get("status") == "ok":
                    problems.append(f"run.json: status {rep_.get('status')}, "
                                    f"{rep_.get('tiles_classified')} tiles")
    if c["code"] not in (EXIT_OK, EXIT_SKIPPED):
        if len(lines) != 1:
            problems.append(f"{len(lines)} lines on stderr")
        if c["needle"] not in r.stderr:
            problems.append(f"message lacks '{c['needle']}'")
        left = finished_products(out, every_file=True) if os.path.isdir(out) else []
        if left:
            problems.append(f"left finished-looking outputs {left}")
    else:
        # a skipped input is a warning, said even with -q: one line naming it
        warned = c["code"] == EXIT_SKIPPED and len(lines) == 1 and "warning: skipping input" in \
            lines[0] and "nothere.tif" in lines[0]
        if c["warning"]:
            warned = len(lines) == 1 and "warning:" in lines[0] and c["warning"] in lines[0]
            if not warned:
                problems.append(f"expected one warning with '{c['warning']}'")
        if lines and not warned:
            problems.append(f"{len(lines)} lines on stderr")
        if r.returncode == c["code"] and c["check"]:
            try:
                problems += c["check"](r.stdout if c["cmd"] == "validate" else out)
            except Exception as e:  # a missing output is a failure, not a crash of the test
                problems.append(f"check raised {type(e).__name__}: {e}")
    first = lines[0] if lines else "(no message)"
    return ("FAIL" if problems else "ok"), first, problems + [f"stderr: {r.stderr.strip()}"]


def main():
    if not (FIX and SRC and BIN):
        print("TW_FIXTURES/TW_SOURCE_DIR/TW_BIN not set: skipped")
        return 77
    failures, skipped = [], []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            files = make_files(tmp)
            all_cases = cases(tmp, files)
            for c in all_cases:
                status, first, detail = run_case(c, tmp)
                print(f"{c['name']:42s} {status:7s} {first}")
                if status == "FAIL":
                    print("    " + "\n    ".join(detail))
                    failures.append(c["name"])
                elif status == "skipped":
                    skipped.append(c["name"])
        finally:
            for d in MOUNTS:
                subprocess.run(["umount", d])
    n = len(all_cases)
    print(f"{n - len(failures) - len(skipped)} passed, {len(failures)} failed, "
          f"{len(skipped)} skipped (of {n})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
