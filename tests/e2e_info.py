#!/usr/bin/python3
"""`tilewise info` as data rendered twice (issue 28.2): the text and the
JSON form come from one set of facts, so they agree, on inputs where they
once could drift:

* rasters made here with GDAL (the reference): a NaN and a -inf nodata
  (JSON null, text "nan"/"-inf"), a band description with a quote, a tab
  and UTF-8 (JSON gives GDAL's bytes back), a rotated geotransform in
  degrees (JSON's 17 digits are GDAL's doubles; the text's "rotated" terms
  and "about X x Y m" are the JSON's numbers);
* the JSON's members in their documented order, and none of the facts only
  the text shows ("_..."), at any depth;
* ONNX models: "tilewise applies the softmax" exactly when the graph (read
  with the onnx module) does not end in Softmax; the stem line's kernel and
  stride are conv1's (its weight's shape in the graph);
* a STAC item (CRS and grid lines from proj:epsg/proj:shape, not in the
  JSON) and a collection with an open end ("" in JSON, "open" in text).
"""
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2eutil  # noqa: E402
from e2eutil import BIN, FIX, check  # noqa: E402

RASTER_KEYS = ["type", "path", "driver", "width", "height", "band_count", "crs", "crs_kind",
               "crs_units", "geotransform", "pixel_size_m", "layout", "compression", "usable",
               "bands"]
BAND_KEYS = ["band", "type", "block", "nodata", "description", "color", "overviews"]


def info(path):
    t = subprocess.run([BIN, "info", path], capture_output=True, text=True)
    j = subprocess.run([BIN, "info", "--json", path], capture_output=True, text=True)
    check(t.returncode == 0 and j.returncode == 0, f"info {path}: {t.stderr}{j.stderr}")
    return t.stdout, json.loads(j.stdout)


def no_private(v, where):
    if isinstance(v, dict):
        for k, m in v.items():
            check(not k.startswith("_"), f"{where}: text-only member {k} in the JSON")
            no_private(m, where)
    elif isinstance(v, list):
        for m in v:
            no_private(m, where)


def rasters(gdal, osr, np, work):
    desc = 'a "q"\tb é'
    gt = (10.0, 0.001, 0.0002, 50.0, 0.0003, -0.001)
    for name, nodata in [("nan", float("nan")), ("ninf", float("-inf"))]:
        path = os.path.join(work, f"{name}.tif")
        ds = gdal.GetDriverByName("GTiff").Create(path, 20, 10, 2, gdal.GDT_Float32)
        ds.SetGeoTransform(gt)
        srs = osr.SpatialReference()
        srs.ImportFromEPSG(4326)
        ds.SetProjection(srs.ExportToWkt())
        for b in (1, 2):
            band = ds.GetRasterBand(b)
            band.WriteArray(np.arange(200, dtype=np.float32).reshape(10, 20))
            band.SetNoDataValue(nodata)
            band.SetDescription(desc)
        ds = None
        text, j = info(path)
        check(list(j)[:len(RASTER_KEYS)] == RASTER_KEYS, f"{name}: raster members {list(j)}")
        check(list(j["bands"][0]) == BAND_KEYS, f"{name}: band members {list(j['bands'][0])}")
        no_private(j, name)
        check(j["geotransform"] == list(gt), f"{name}: geotransform {j['geotransform']}")
        lines = re.findall(r"^band (\d+) +(.*)$", text, re.M)
        check(len(lines) == 2, f"{name}: a text line per band")
        for (n, line), b in zip(lines, j["bands"]):
            check(b["nodata"] is None, f"{name}: JSON nodata null")
            shown = "nan" if name == "nan" else "-inf"
            check(f"nodata {shown}," in line, f"{name}: text nodata {shown}: {line}")
            check(b["description"] == desc, f"{name}: description {b['description']!r}")
            check(f'"{desc}"' in line, f"{name}: text description: {line}")
        m = re.search(r"^pixel: .*\(rotated: (\S+), (\S+)\) degree \(about (\S+) x (\S+) m\)$",
                      text, re.M)
        check(m is not None, f"{name}: pixel line: {text}")
        check((float(m.group(1)), float(m.group(2))) == (gt[2], gt[4]), f"{name}: rotation")
        px = j["pixel_size_m"]
        check(m.group(3) == f"{px[0]:.4g}" and m.group(4) == f"{px[1]:.4g}",
              f"{name}: about {m.group(3)} x {m.group(4)} m vs JSON {px}")


def onnx_models():
    import onnx
    from onnx import numpy_helper
    for name in ["onnx_r18_other", "onnx_small_stem", "onnx_r50_o17"]:  # other: ends in Softmax
        path = os.path.join(FIX, name + ".onnx")
        g = onnx.load(path, load_external_data=False).graph
        text, j = info(path)
        no_private(j, name)
        softmax = g.node[-1].op_type == "Softmax"
        check(("(tilewise applies the softmax)" in text) == (not softmax),
              f"{name}: softmax {softmax}: {text}")
        conv1 = next(n for n in g.node if n.op_type == "Conv")
        w = next(numpy_helper.to_array(i) for i in g.initializer if i.name == conv1.input[1])
        stride = next((list(a.ints)[0] for a in conv1.attribute if a.name == "strides"), 1)
        k = w.shape[2]
        check(f"(conv1 {k}x{k} stride {stride}," in text, f"{name}: stem {k} {stride}: {text}")
        check(f"stem:       {j['stem']} " in text, f"{name}: stem name")


def stac(work):
    item = {"type": "Feature", "stac_version": "1.0.0", "id": "s", "bbox": [1, 2, 3, 4],
            "properties": {"datetime": "2021-06-01T10:30:00Z", "proj:epsg": 32633,
                           "proj:shape": [10, 20]},
            "assets": {"a": {"href": "./a.tif", "type": "image/tiff", "file:size": 7}},
            "links": [{"rel": "root", "href": "./r.json"}, {"rel": "self", "href": "./s.json"}]}
    path = os.path.join(work, "s.stac.json")
    json.dump(item, open(path, "w"))
    text, j = info(path)
    no_private(j, "item")
    check("crs       EPSG:32633; grid 20 x 10\n" in text, f"item: crs line: {text}")
    check([(a["key"], a["size"]) for a in j["assets"]] == [("a", 7)], f"item: assets {j}")
    check("asset     a: ./a.tif, 7 bytes (image/tiff)\n" in text, f"item: asset line: {text}")
    check(len(j["links"]) == 2 and "link      self: ./s.json\n" in text and "root" not in text,
          "item: links (root only in the JSON)")
    coll = {"type": "Collection", "stac_version": "1.0.0", "id": "c",
            "extent": {"spatial": {"bbox": [[1, 2, 3, 4]]},
                       "temporal": {"interval": [["2020-01-01T00:00:00Z", None]]}}}
    os.makedirs(os.path.join(work, "c"))
    path = os.path.join(work, "c", "collection.json")
    json.dump(coll, open(path, "w"))
    text, j = info(path)
    check((j["start"], j["end"]) == ("2020-01-01T00:00:00Z", ""), f"collection: {j}")
    check("time      2020-01-01T00:00:00Z .. open\n" in text, f"collection: time line: {text}")


def main():
    gdal = e2eutil.gdal_or_skip()
    if gdal is None:
        return 77
    from osgeo import osr
    import numpy as np
    with tempfile.TemporaryDirectory() as work:
        rasters(gdal, osr, np, work)
        onnx_models()
        stac(work)
    print("e2e_info: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
