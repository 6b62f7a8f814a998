"""What the end-to-end Python tests share: the paths ctest hands them
(CMakeLists.txt, TW_TEST_ENV), the normalization of the ResNet-18 fixture
on sample_data/L7_ETMs.tif, and check(). Not a test itself (ctest runs
tests/e2e_*.py)."""
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


def workflow(work, name, paths, extra="", bands=None, stride=None, products="[class]"):
    """WORK/NAME.yaml: the ResNet-18 fixture on paths, tile 64 (stride
    stride), device cpu, 1 GiB, products into WORK/NAME; extra is appended.
    Returns (workflow path, output directory)."""
    wf = os.path.join(work, name + ".yaml")
    band_line = f"\n  bands: {bands}" if bands else ""
    stride_line = f"\n  stride: {stride}" if stride else ""
    with open(wf, "w") as f:
        f.write(f"""input:
  path: [{", ".join(paths)}]{band_line}
model:
  weights: {FIX}/resnet18_6b_7c.safetensors
  mean: {MEAN}
  std: {STD}
tiling:
  tile: 64{stride_line}
runtime:
  device: cpu
  memory: 1GiB
output:
  dir: {os.path.join(work, name)}
  products: {products}
{extra}""")
    return wf, os.path.join(work, name)
