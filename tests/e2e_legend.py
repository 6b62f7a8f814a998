#!/usr/bin/python3
"""What of a class map's legend travels when the .tif is moved alone
(README "Legend that travels"), measured with GDAL on copies in another
folder, for GTiff and COG:

* inside the file: the colour table, the band description, the TILEWISE_RUN
  metadata item with the class names; the probability raster's band
  descriptions (class names);
* only in FILE.aux.xml: the category names (GDAL 3.6 stores none in a TIFF);
* `tilewise info` says which case a file is in: keep the .aux.xml next to the
  .tif, or (moved alone) the class names read from TILEWISE_RUN.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from e2eutil import check, gdal_or_skip, SRC, BIN

NAMES = ["water", "dense_vegetation", "sparse_vegetation", "bare_or_built"]


def categories(path):
    """The category names gdalinfo prints (the Python bindings of GDAL 3.6
    return None from GetCategoryNames() for a GTiff band whose names are in
    its .aux.xml, while gdalinfo and the C API see them)."""
    text = subprocess.run(["gdalinfo", path], capture_output=True, text=True, check=True).stdout
    if "Categories:" not in text:
        return []
    lines = text.split("Categories:", 1)[1].splitlines()[1:]
    names = []
    for line in lines:
        k, sep, v = line.strip().partition(": ")
        if not sep or not k.isdigit():
            break
        names.append(v)
    return names


def main():
    gdal = gdal_or_skip()
    if gdal is None:
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in ("GTiff", "COG"):
            out = os.path.join(tmp, fmt)
            subprocess.run([BIN, "run", "workflows/sample.yaml", "-q", "--set", f"output.dir={out}",
                            "--set", "runtime.device=cpu", "--set", f"output.format={fmt}"],
                           check=True, cwd=SRC)
            cls = os.path.join(out, "L7_ETMs.class.tif")
            check(categories(cls) == NAMES, f"{fmt}: gdalinfo shows the categories with the sidecar")
            info = subprocess.run([BIN, "info", cls], capture_output=True, text=True).stdout
            check("keep it next to the .tif" in info, f"{fmt}: info says to keep the .aux.xml ({info[-300:]})",
                  say_ok=True)
            alone = os.path.join(tmp, fmt + "_alone")
            os.makedirs(alone)
            for name in ("L7_ETMs.class.tif", "L7_ETMs.prob.tif"):
                shutil.copy(os.path.join(out, name), alone)
            cls = os.path.join(alone, "L7_ETMs.class.tif")
            ds = gdal.Open(cls)
            b = ds.GetRasterBand(1)
            check(categories(cls) == [], f"{fmt}: gdalinfo shows no categories without the sidecar",
                  say_ok=True)
            ct = b.GetColorTable()
            check(ct is not None and ct.GetColorEntry(0)[:3] == (0, 114, 189),
                  f"{fmt}: the colour table travels", say_ok=True)
            check(b.GetDescription() == "class", f"{fmt}: the band description travels")
            run = json.loads(ds.GetMetadataItem("TILEWISE_RUN"))
            check(run["model"]["classes"] == NAMES, f"{fmt}: TILEWISE_RUN with the class names travels",
                  say_ok=True)
            del ds
            prob = gdal.Open(os.path.join(alone, "L7_ETMs.prob.tif"))
            descs = [prob.GetRasterBand(i + 1).GetDescription() for i in range(prob.RasterCount)]
            check(descs == NAMES, f"{fmt}: the prob raster's band names travel ({descs})", say_ok=True)
            del prob
            info = subprocess.run([BIN, "info", cls], capture_output=True, text=True).stdout
            check("did not come along" in info and ", ".join(NAMES) in info,
                  f"{fmt}: info names the classes from TILEWISE_RUN ({info[-300:]})", say_ok=True)
        # Class names are shown in terminals, band descriptions and legends:
        # a control character (ESC, CR, a newline) is refused, from the
        # workflow (exit 2) and from a bundle (exit 3); before, both ran and
        # the names reached terminals raw.
        r = subprocess.run([BIN, "run", "workflows/sample.yaml", "-q", "--set",
                            f"output.dir={tmp}/esc", "--set",
                            'model.classes=[water, "\\e[31mdense", sparse, bare]'],
                           capture_output=True, text=True, cwd=SRC)
        check(r.returncode == 2 and "control character (byte 0x1b)" in r.stderr
              and "\x1b" not in r.stderr,
              f"model.classes with ESC refused ({r.returncode} {r.stderr.strip()!r})", say_ok=True)
        import h5py
        bundle = os.path.join(tmp, "esc.h5")
        shutil.copy(os.path.join(SRC, "sample_data", "demo_resnet18.h5"), bundle)
        with h5py.File(bundle, "a") as f:
            names = [b"water", b"dense\r\nINFO fake", b"sparse", b"bare"]
            f.attrs["classes"] = names
        r = subprocess.run([BIN, "run", "workflows/sample.yaml", "-q", "--set",
                            f"output.dir={tmp}/esc", "--set", f"model.weights={bundle}"],
                           capture_output=True, text=True, cwd=SRC)
        check(r.returncode == 3 and "class name 2 holds a control character (byte 0x0d)"
              in r.stderr and "\r" not in r.stderr,
              f"a bundle's class name with CR refused ({r.returncode} {r.stderr.strip()!r})",
              say_ok=True)
    print("e2e_legend: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
