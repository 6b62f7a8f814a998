"""What the end-to-end Python tests share: the paths ctest hands them
(CMakeLists.txt, TW_TEST_ENV), the normalization of the ResNet-18 fixture
on sample_data/L7_ETMs.tif, check(), the workflow writers, and what tests
of interrupted and failed runs look at (committed rows, finished products).
Not a test itself (ctest runs tests/e2e_*.py)."""
import glob
import json
import os
import sys

FIX = os.environ.get("TW_FIXTURES")
SRC = os.environ.get("TW_SOURCE_DIR")
BIN = os.environ.get("TW_BIN")
MEAN = [79.0, 67.5, 64.4, 60.0, 80.0, 60.0]
STD = [14.7, 16.4, 21.6, 15.0, 25.0, 20.0]


def check(cond, what, say_ok=False):
    """Stop the test with FAIL: what unless cond; with say_ok, print ok lines."""
    if not cond:
        sys.exit("FAIL: " + what)
    if say_ok:
        print("ok   " + what)


def gdal_or_skip():
    """GDAL's Python module, ready to raise on errors; None (after saying so)
    when ctest's variables are missing: the caller returns 77 (skipped)."""
    if not (FIX and SRC and BIN):
        print("TW_FIXTURES/TW_SOURCE_DIR/TW_BIN not set: skipped")
        return None
    from osgeo import gdal
    gdal.UseExceptions()
    return gdal


def write_workflow(wf, out, paths, extra="", bands=None, stride=None, products="[class]",
                   batch=None, threads=None, memory="1GiB", input_extra=""):
    """The workflow file wf: the ResNet-18 fixture on paths (a list, or one
    path), tile 64 (stride stride), device cpu, memory, products into out;
    batch and threads when given; input_extra is added to input: (indented
    lines), extra is appended."""
    path = f"[{', '.join(paths)}]" if isinstance(paths, (list, tuple)) else paths
    band_line = f"\n  bands: {bands}" if bands else ""
    stride_line = f"\n  stride: {stride}" if stride else ""
    batch_line = f"\n  batch: {batch}" if batch else ""
    threads_line = f"\n  threads: {threads}" if threads else ""
    with open(wf, "w") as f:
        f.write(f"""input:
  path: {path}{band_line}
{input_extra}model:
  weights: {FIX}/resnet18_6b_7c.safetensors
  mean: {MEAN}
  std: {STD}
tiling:
  tile: 64{stride_line}{batch_line}
runtime:
  device: cpu
  memory: {memory}{threads_line}
output:
  dir: {out}
  products: {products}
{extra}""")


def workflow(work, name, paths, extra="", bands=None, stride=None, products="[class]", **more):
    """WORK/NAME.yaml with products into WORK/NAME (write_workflow; more
    are its other keywords). Returns (workflow path, output directory)."""
    wf, out = os.path.join(work, name + ".yaml"), os.path.join(work, name)
    write_workflow(wf, out, paths, extra, bands, stride, products, **more)
    return wf, out


def committed_rows(out):
    """Output rows the journals under out/.tilewise say are committed."""
    n = 0
    for j in glob.glob(f"{out}/.tilewise/*/journal.*"):
        with open(j) as f:
            for line in f:
                if line.startswith("rows "):
                    r0, r1 = map(int, line.split()[1:3])
                    n += r1 - r0
    return n


def finished_products(out, every_file=False):
    """What a failed run must not leave in out under a final name (not
    hidden, not *.part): a run.json saying ok, and the files GDAL opens;
    with every_file, every other file too (those GDAL opens marked so)."""
    from osgeo import gdal
    found = []
    for path in glob.glob(os.path.join(out, "*")):
        name = os.path.basename(path)
        if name.startswith(".") or name.endswith(".part") or os.path.isdir(path):
            continue
        if name.endswith(".json"):
            with open(path) as f:
                if json.load(f).get("status") == "ok":
                    found.append(name)
            continue
        gdal.PushErrorHandler("CPLQuietErrorHandler")
        opens = gdal.OpenEx(path) is not None
        gdal.PopErrorHandler()
        if every_file:
            found.append(name + (" (GDAL opens it)" if opens else ""))
        elif opens:
            found.append(name)
    return found


def randomize_bn(model, seed):
    """Every BatchNorm2d of a torch model given random affine parameters and
    running statistics (seeded), so that folding them is exercised."""
    import torch
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            n = m.num_features
            m.weight.data = torch.rand(n, generator=g) + 0.5
            m.bias.data = (torch.rand(n, generator=g) - 0.5) * 0.4
            m.running_mean.data = (torch.rand(n, generator=g) - 0.5) * 0.4
            m.running_var.data = torch.rand(n, generator=g) * 1.5 + 0.5
