#!/usr/bin/python3
"""The documents against the program (issue 40): what README.md, tilewise.1
and `--help` say is checked against the code and against runs.

* README's "all keys" workflow is valid YAML (a loader that refuses
  duplicate keys), names every key of core/keys.c's table (a key that cannot
  go with the others, input.assets, commented out), and `tilewise validate`
  accepts it with only its paths pointed at the sample data;
* every option of each subcommand's `--help` is in the man page's synopsis
  and the other way round; the man page's and README's file lists name every
  product suffix the code writes; the JSON progress events README and the
  man page document are exactly those workflows/main.c emits (KEYS.md
  against the key table: tests/test_keys.c);
* what README says runs: merged shards are one run's rasters byte for byte;
  ONNX small-stem and headless graphs are read; a C client outside the system
  prefix builds and runs with the README's two lines;
* the smaller items: `--set output.name={parent}_{stem}` names the files, an
  unquoted one in a file is a YAML error with a hint to quote it; `info` of a
  STAC collection separates its label; a headless run's summary and run.json
  show no stand-in class; validate shows a small output in KiB, never
  "0.0 MiB"; a safetensors file with a `backbone.` prefix is refused naming
  the prefix and tools/export_model.py.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2eutil  # noqa: E402
from e2eutil import BIN, FIX, SRC, check  # noqa: E402

SAMPLE = None  # set in main()
EXIT_USAGE, EXIT_MODEL = 2, 3


def tw(*args, cwd=None, env=None):
    return subprocess.run([BIN, *args], capture_output=True, text=True, cwd=cwd, env=env)


def read(rel):
    with open(os.path.join(SRC, rel), encoding="utf-8") as f:
        return f.read()


def strict_loader(yaml):
    """A SafeLoader that refuses a key given twice in one mapping."""
    class Strict(yaml.SafeLoader):
        pass

    def mapping(loader, node, deep=False):
        seen = set()
        for k, _ in node.value:
            key = loader.construct_object(k, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key '{key}'", k.start_mark)
            seen.add(key)
        return loader.construct_mapping(node, deep)

    Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return Strict


def table_keys():
    """The workflow keys of core/keys.c's table."""
    keys = re.findall(r'\[TW_KEY_\w+\]\s*=\s*\{\s*"([a-z_]+\.[a-z_]+)"', read("core/keys.c"))
    check(len(keys) > 30, f"core/keys.c: {len(keys)} keys found")
    return set(keys)


def readme_keys_block(work, gdal):
    import yaml
    readme = read("README.md")
    m = re.search(r"A workflow \(all keys[^\n]*\n(?:[^\n]+\n)*?\n```yaml\n(.*?)```", readme, re.S)
    check(m is not None, "README.md: the all-keys ```yaml block")
    block = m.group(1)
    try:
        wf = yaml.load(block, Loader=strict_loader(yaml))
    except yaml.YAMLError as e:
        check(False, f"README's all-keys block is not valid YAML: {e}")
    given = {f"{s}.{k}" for s, keys in wf.items() for k in keys}
    # a key that cannot go with the others is there commented out, in its section
    section, commented = None, set()
    for line in block.splitlines():
        if re.match(r"^[a-z]+:", line):
            section = line.split(":")[0]
        c = re.match(r"^\s+#\s*([a-z_]+):", line)
        if c and section:
            commented.add(f"{section}.{c.group(1)}")
    want = table_keys()
    check(given | commented == want and not given & commented,
          f"README's all-keys block: missing {sorted(want - given - commented)}, unknown "
          f"{sorted((given | commented) - want)}", True)
    # only the paths pointed at this machine's files
    aoi = os.path.join(work, "area.geojson")
    ds = gdal.Open(SAMPLE)
    gt, w, h = ds.GetGeoTransform(), ds.RasterXSize, ds.RasterYSize
    x0, y0, x1, y1 = gt[0], gt[3], gt[0] + w * gt[1] / 2, gt[3] + h * gt[5] / 2
    json.dump({"type": "FeatureCollection", "crs": {"type": "name", "properties": {
        "name": ds.GetSpatialRef().GetAuthorityName(None) + ":" +
        ds.GetSpatialRef().GetAuthorityCode(None)}},
        "features": [{"type": "Feature", "properties": {}, "geometry": {
            "type": "Polygon", "coordinates": [[[x0, y0], [x1, y0], [x1, y1], [x0, y1],
                                                [x0, y0]]]}}]}, open(aoi, "w"))
    text = block
    for key, value in [("path", SAMPLE), ("weights", os.path.join(SRC, wf["model"]["weights"])),
                       ("aoi", aoi), ("dir", os.path.join(work, "keys_out"))]:
        text, n = re.subn(rf"^(  {key}: )\S+", lambda mm: mm.group(1) + value, text, count=1,
                          flags=re.M)
        check(n == 1, f"README block: {key} rewritten")
    path = os.path.join(work, "readme_keys.yaml")
    open(path, "w").write(text)
    r = tw("validate", path, "--set", "runtime.device=cpu")
    check(r.returncode == 0, f"validate README's all-keys block: exit {r.returncode}: {r.stderr}"
          f"{r.stdout}", True)
    # and it runs as written (the CPU: the test machine has no GPU)
    r = tw("run", path, "-q", "--set", "runtime.device=cpu")
    out = os.path.join(work, "keys_out")
    check(r.returncode == 0 and os.path.exists(os.path.join(out, "L7_ETMs.class.tif")),
          f"run README's all-keys block: exit {r.returncode}: {r.stderr[-600:]}", True)


def options_of(text):
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[qh])\b", text))


def help_options(cmd):
    """The options a subcommand's --help lists: its usage line and the lines
    of its option list (not the examples inside their descriptions)."""
    r = tw(cmd, "--help")
    check(r.returncode == 0, f"{cmd} --help: exit {r.returncode}")
    lines = r.stdout.splitlines()
    opts = options_of(lines[0].split(cmd, 1)[1])
    for line in lines[1:]:
        m = re.match(r"^  (-[^ ]+(?:, -[^ ]+)?)", line)
        if m:
            opts |= options_of(m.group(1))
    return opts


def man_synopsis():
    man = read("tilewise.1")
    syn = man.split(".SH SYNOPSIS\n", 1)[1].split(".SH ", 1)[0].replace("\\-", "-")
    per, glob_opts = {}, set()
    for entry in syn.split(".br\n"):
        words = re.findall(r"[^\s\"\[\]|]+", entry)
        if words[:2] == [".B", "tilewise"] and len(words) > 2 and words[2] in (
                "run", "validate", "info", "merge", "submit"):
            per[words[2]] = options_of(entry)
        elif "COMMAND" in entry:
            glob_opts |= options_of(entry)
    return per, glob_opts


def help_and_man():
    per, glob_opts = man_synopsis()
    check(sorted(per) == ["info", "merge", "run", "submit", "validate"],
          f"man synopsis commands: {sorted(per)}")
    check({"--config", "--help"} <= glob_opts, f"man synopsis: any command's {glob_opts}")
    alias = {"--quiet": "-q", "-h": "--help"}
    for cmd, man in per.items():
        helped = {alias.get(o, o) for o in help_options(cmd)}
        man = {alias.get(o, o) for o in man} | glob_opts
        check(helped == man, f"{cmd}: --help lists {sorted(helped - man)} the man synopsis lacks; "
              f"the man synopsis {sorted(man - helped)} --help lacks", True)
        # and the parser knows each one
        parser = read("workflows/main.c") + read("workflows/submit.c")
        for o in helped:
            check(f'"{o}"' in parser or f'"{o}="' in parser, f"{cmd} {o}: not in the parser")
    # every man page OPTIONS entry is some command's
    man = read("tilewise.1").replace("\\-", "-")
    entries = re.findall(r"^\.TP\n\.B[IR]? (-[^ \n]+)", man, re.M)
    every = set().union(*per.values(), glob_opts, {"--version", "-h"})
    for e in entries:
        o = re.match(r"(--?[a-z][a-z-]*)", e.strip('"')).group(1)
        check(o in every, f"man OPTIONS entry {o}: in no synopsis")


def product_files():
    """Every file name a run writes beside scene.tif, from the code."""
    m = re.search(r"tw_products\[TW_PRODUCT_COUNT\] = \{(.*?)\n\};", read("core/products.c"), re.S)
    check(m is not None, "core/products.c: tw_products[]")
    suffixes = set(re.findall(r'"(\.[a-z.0-9]+)"', m.group(1)))
    check(len(suffixes) >= 8, f"product suffixes {sorted(suffixes)}")
    return {"scene" + s for s in suffixes} | {"scene.stac.json", "collection.json", "run.json",
                                              "run.failed.json"}


def file_lists():
    names = product_files()
    man = read("tilewise.1").replace("\\-", "-")
    files = man.split(".SH OUTPUT FILES", 1)[1].split(".SH ", 1)[0]
    entries = re.findall(r"^\.TP\n\.I[R]? ([^\n]+)", files, re.M)
    named = set()
    for e in entries:
        named |= set(re.findall(r"[a-z_]+(?:\.[a-z0-9]+)+", e))
    check(names <= named, f"man page OUTPUT FILES: no .TP entry for {sorted(names - named)}", True)
    readme = read("README.md")
    table = readme.split("### Outputs", 1)[1].split("\n### ", 1)[0]
    missing = [n for n in names if f"`{n}`" not in table]
    check(not missing, f"README's Outputs: {missing} not named", True)


def json_events():
    emitted = set(re.findall(r'new_event\("(\w+)"\)', read("workflows/main.c")))
    check(emitted >= {"start", "progress", "done"}, f"main.c emits {emitted}")
    for doc in ("README.md", "tilewise.1"):
        documented = set(re.findall(r'\{"event":"(\w+)"', read(doc)))
        check(documented == emitted, f"{doc} documents the JSON events {sorted(documented)}, "
              f"workflows/main.c emits {sorted(emitted)}", True)


def workflow(work, name, extra_output="", model=None, products="[class]", stride=64,
             bands=None, path=None, model_extra=""):
    out = os.path.join(work, name)
    wf = os.path.join(work, name + ".yaml")
    model = model or os.path.join(SRC, "sample_data", "demo_resnet18.h5")
    band_line = f"\n  bands: {bands}" if bands else ""
    open(wf, "w").write(f"""input:
  path: {path or SAMPLE}{band_line}
model:
  weights: {model}
{model_extra}tiling:
  tile: {32 if 'onnx' in model else 64}
  stride: {stride}
runtime:
  device: cpu
  memory: 1GiB
output:
  dir: {out}
  products: {products}
{extra_output}""")
    return wf, out


def name_template(work):
    wf, out = workflow(work, "names")
    r = tw("run", wf, "-q", "--set", "output.name={parent}_{stem}")
    check(r.returncode == 0 and os.path.exists(os.path.join(out, "sample_data_L7_ETMs.class.tif")),
          f"--set output.name={{parent}}_{{stem}}: exit {r.returncode} {r.stderr} "
          f"{os.listdir(out) if os.path.isdir(out) else ''}", True)
    wf2, _ = workflow(work, "names_file", "  name: {parent}_{stem}\n")
    r = tw("validate", wf2)
    check(r.returncode == EXIT_USAGE and "quote it" in r.stderr and "names_file.yaml" in r.stderr,
          f"unquoted name template in a file: exit {r.returncode}, {r.stderr.strip()}", True)


def stac_collection(work):
    coll = {"type": "Collection", "stac_version": "1.0.0", "id": "tilewise-out_cog",
            "extent": {"spatial": {"bbox": [[1, 2, 3, 4]]},
                       "temporal": {"interval": [["2020-01-01T00:00:00Z", None]]}}}
    os.makedirs(os.path.join(work, "coll"))
    path = os.path.join(work, "coll", "collection.json")
    json.dump(coll, open(path, "w"))
    r = tw("info", path)
    check(r.returncode == 0 and r.stdout.startswith("collection tilewise-out_cog (STAC"),
          f"info collection: {r.stdout.splitlines()[:1]}", True)


def headless(work):
    wf, out = workflow(work, "headless", model=os.path.join(FIX, "onnx_headless.onnx"),
                       products="[embeddings, embedding_raster]", stride=32, bands="[1, 2, 3]",
                       model_extra="  mean: [80, 70, 60]\n  std: [15, 15, 20]\n")
    r = tw("run", wf, "-q")
    check(r.returncode == 0 and "classes:" not in r.stdout and "class_0" not in r.stdout,
          f"headless run's summary: exit {r.returncode} {r.stdout} {r.stderr}", True)
    rj = json.load(open(os.path.join(out, "run.json")))
    check(rj["inputs"][0]["class_cells"] == {}, f"headless run.json class_cells "
          f"{rj['inputs'][0]['class_cells']}", True)
    for name, want in [("onnx_headless.onnx", "head:       none"),
                       ("onnx_small_stem.onnx", "stem:       small")]:
        r = tw("info", os.path.join(FIX, name))
        check(r.returncode == 0 and want in r.stdout, f"ONNX {name}: {want}", True)


def small_outputs(work, gdal):
    tiny = os.path.join(work, "tiny.tif")
    gdal.Translate(tiny, SAMPLE, srcWin=[0, 0, 64, 64])
    wf, _ = workflow(work, "tiny", path=tiny, stride=16)
    r = tw("validate", wf)
    line = next((x for x in r.stdout.splitlines() if x.startswith("outputs")), "")
    check(r.returncode == 0 and "0.0 MiB" not in line
          and re.search(r"at most [0-9.]+ (KiB|bytes) on disk", line),
          f"validate of a 64 x 64 raster: {line}", True)


def prefixed_safetensors(work):
    sys.path.insert(0, os.path.join(SRC, "tools"))
    import safetensors_io
    tensors, meta = safetensors_io.load(os.path.join(FIX, "resnet18_6b_7c.safetensors"))
    path = os.path.join(work, "backbone.safetensors")
    safetensors_io.save(path, {"backbone." + k: v for k, v in tensors.items()}, metadata=meta)
    r = tw("info", path)
    check(r.returncode == EXIT_MODEL and "'backbone.conv1.weight'" in r.stderr
          and "prefix ('backbone.')" in r.stderr and "tools/export_model.py" in r.stderr
          and path in r.stderr, f"prefixed safetensors: exit {r.returncode}: {r.stderr.strip()}",
          True)
    h5 = os.path.join(work, "stripped.h5")
    e = subprocess.run([sys.executable, os.path.join(SRC, "tools", "export_model.py"), path,
                        "-o", h5], capture_output=True, text=True)
    check(e.returncode == 0 and tw("info", h5).returncode == 0,
          f"the hinted export_model.py command: {e.stderr}", True)


def merged_shards(work):
    wf, one = workflow(work, "one", products="[class, prob, confidence]", stride=32)
    r = tw("run", wf, "-q")
    check(r.returncode == 0, f"one run: {r.stderr}")
    sh = os.path.join(work, "sh")
    for i in (1, 2):
        r = tw("run", wf, "-q", "--shard", f"{i}/2", "--chunk-rows", "2", "--set",
               f"output.dir={sh}")
        check(r.returncode == 0, f"shard {i}: {r.stderr}")
    r = tw("merge", sh)
    check(r.returncode == 0, f"merge: {r.stderr}")
    tifs = sorted(os.path.basename(p) for p in glob.glob(one + "/*.tif"))
    check(len(tifs) == 3, f"rasters {tifs}")
    for t in tifs:
        check(open(os.path.join(one, t), "rb").read() == open(os.path.join(sh, t), "rb").read(),
              f"merged {t} is the one run's, byte for byte", True)


def c_client(work):
    """README's two lines for a PREFIX outside the system's."""
    readme = read("README.md")
    m = re.search(r"```sh\n(export PKG_CONFIG_PATH=PREFIX\S+)[^\n]*\n(cc app\.c [^\n]+)\n```",
                  readme)
    check(m is not None, "README: the C client's PKG_CONFIG_PATH and cc lines")
    build = os.getcwd()
    if not os.path.exists(os.path.join(build, "cmake_install.cmake")) or not shutil.which("cc"):
        print("no build directory or compiler here: the C client lines not run")
        return
    if os.environ.get("TW_SANITIZED"):
        # a plain cc client cannot load the sanitized library (ASan's runtime
        # must come first); the release pass runs these lines
        print("sanitized build: the C client lines not run")
        return
    prefix = os.path.join(work, "prefix")  # no space: pkg-config output is split by the shell
    r = subprocess.run(["cmake", "--install", build, "--prefix", prefix], capture_output=True,
                       text=True)
    check(r.returncode == 0, f"cmake --install: {r.stderr}")
    pcs = glob.glob(prefix + "/lib*/**/tilewise.pc", recursive=True)
    check(len(pcs) == 1, f"installed tilewise.pc: {pcs}")
    pcdir = os.path.dirname(pcs[0])
    app = os.path.join(work, "app.c")
    open(app, "w").write('#include <stdio.h>\n#include <tilewise.h>\n'
                         'int main(void) { printf("%s\\n", tilewise_version()); return 0; }\n')
    lines = [m.group(1).replace("PREFIX/lib/pkgconfig", f"'{pcdir}'"), m.group(2)]
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    r = subprocess.run(["bash", "-ec", "\n".join(lines)], cwd=work, capture_output=True,
                       text=True, env=env)
    check(r.returncode == 0, f"README's cc line: {r.stderr}")
    r = subprocess.run([os.path.join(work, "a.out")], capture_output=True, text=True, env=env)
    check(r.returncode == 0 and r.stdout.strip() == tw("--version").stdout.split()[1],
          f"the client built with README's lines runs: {r.stdout} {r.stderr}", True)


def main():
    global SAMPLE
    gdal = e2eutil.gdal_or_skip()
    if gdal is None:
        return 77
    SAMPLE = os.path.join(SRC, "sample_data", "L7_ETMs.tif")
    with tempfile.TemporaryDirectory(prefix="tw_docs_") as work:
        help_and_man()
        file_lists()
        json_events()
        readme_keys_block(work, gdal)
        name_template(work)
        stac_collection(work)
        small_outputs(work, gdal)
        prefixed_safetensors(work)
        headless(work)
        merged_shards(work)
        c_client(work)
    print("e2e_docs: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
