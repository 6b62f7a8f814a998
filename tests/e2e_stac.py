#!/usr/bin/python3
"""End to end: output.stac, STAC Items and a Collection that real clients open.

The sample raster is cut in two at column 192 (a multiple of the tile, 64,
so each half's tiles are the whole raster's): the left half carries a
TIFFTAG_DATETIME, the right one none (input.datetime gives it). One run over
both halves with output.stac writes an item per half and collection.json;
a run over the whole raster gives the reference class map.

* Every item, the collection and the merged item of a sharded run pass a
  structural check written here from the STAC 1.0.0 item/collection
  specifications and the field tables of the extensions the items declare
  (projection v1.1.0, raster v1.1.0, file v2.1.0, classification v1.1.0,
  mlm v1.3.0): required fields and their types, stac_extensions holding
  the schema URL of every prefix used, links with rel and href, asset hrefs
  that resolve to files whose size and SHA-256 match file:size and
  file:checksum, and the model asset's checksum equal to the weights file's.
* Footprints: the bbox equals the input's corners reprojected to WGS84 by
  OSR here (1e-7 degrees), the geometry is a closed counter-clockwise ring.
* Values: datetimes (TIFFTAG_DATETIME as RFC 3339, input.datetime), proj
  against GDAL's reading of each file, classification colours against the
  class map's colour table, mlm's z-score against the workflow's mean/std.
* GDAL's STACIT driver opens a FeatureCollection of the two items (written
  here from the items as they are; GDAL 3.6 opens hrefs as given, so it is
  opened from the output directory) as one mosaic of the class assets whose
  size and geotransform equal the whole raster's class map, and whose
  pixels do too.
* A STAC item as input (input.assets) links back with rel derived_from and
  gives its datetime; an asset GDAL cannot open is exit 3 saying why, an item
  datetime that is not RFC 3339 exit 2 quoting the key and the value; `tilewise merge` of two shards writes the merged
  products' item (the shards none); a rerun writes the item anew.
* Before the first tile: no datetime known is exit 2 naming the input and
  input.datetime (no output directory made); a bad input.datetime is exit
  2 naming the key. `tilewise info` and `validate` show the STAC outputs.
"""
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2eutil import BIN, FIX, MEAN, SRC, STD, check, gdal_or_skip, workflow  # noqa: E402

EXT = {
    "proj": "https://stac-extensions.github.io/projection/v1.1.0/schema.json",
    "raster": "https://stac-extensions.github.io/raster/v1.1.0/schema.json",
    "file": "https://stac-extensions.github.io/file/v2.1.0/schema.json",
    "classification": "https://stac-extensions.github.io/classification/v1.1.0/schema.json",
    "mlm": "https://stac-extensions.github.io/mlm/v1.3.0/schema.json",
}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\d[Tt]\d\d:\d\d:\d\d(\.\d+)?([Zz]|[+-]\d\d:\d\d)$")
RASTER_TYPES = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64", "cint16", "cint32", "cfloat32", "cfloat64",
                "other"}
WHEN = "2021-06-01T10:30:00Z"
FALLBACK = "2019-09-09T09:09:09+02:00"


def run(*args, cwd=None):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600, cwd=cwd)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def need(obj, key, kind, where):
    check(key in obj, f"{where}: required field {key} missing")
    check(isinstance(obj[key], kind) and not (kind is int and isinstance(obj[key], bool)),
          f"{where}: {key} is {type(obj[key]).__name__}, not {kind}")
    return obj[key]


def check_links(links, where):
    check(isinstance(links, list), f"{where}: links is not a list")
    for link in links:
        need(link, "rel", str, where + " link")
        need(link, "href", str, where + " link")


def check_extensions(doc, where):
    """stac_extensions: a list of URLs holding the schema of every prefix used."""
    exts = need(doc, "stac_extensions", list, where)
    check(all(isinstance(e, str) and e.startswith("https://") for e in exts),
          f"{where}: stac_extensions are not URLs")
    used = set()

    def walk(v):
        if isinstance(v, dict):
            for k, x in v.items():
                if ":" in k and k.split(":")[0] in EXT:
                    used.add(k.split(":")[0])
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
    walk({k: v for k, v in doc.items() if k != "links"})
    for p in used:
        check(EXT[p] in exts, f"{where}: fields {p}:* used without {EXT[p]} in stac_extensions")


def check_class_object(c, where):
    """classification v1.1.0 (value, description required) and v2.0.0 (name
    required, [0-9A-Za-z-_]+); names unique: check_class_list."""
    check(is_int(c.get("value")), f"{where}: class value is not an integer")
    check(isinstance(c.get("description"), str), f"{where}: class description (v1.1.0) missing")
    check(isinstance(c.get("name"), str) and re.match(r"^[0-9A-Za-z-_]+$", c["name"]),
          f"{where}: class name {c.get('name')!r} is not [0-9A-Za-z-_]+")
    if "color_hint" in c:
        check(re.match(r"^[0-9A-Fa-f]{6}$", c["color_hint"]), f"{where}: bad color_hint")
    if "nodata" in c:
        check(isinstance(c["nodata"], bool), f"{where}: nodata is not a boolean")


def check_class_list(classes, where):
    for c in classes:
        check_class_object(c, where)
    names = [c["name"] for c in classes]
    check(len(set(names)) == len(names), f"{where}: class names not unique: {names}")


def check_item(path, weights):
    """The structural check of one item; returns it. weights inside the
    item's folder: a model asset (mlm); else none, tilewise:model."""
    with open(path) as f:
        item = json.load(f)
    where = os.path.basename(path)
    check(need(item, "type", str, where) == "Feature", f"{where}: type is not Feature")
    check(need(item, "stac_version", str, where) == "1.0.0", f"{where}: stac_version")
    check(need(item, "id", str, where) != "", f"{where}: empty id")
    check_extensions(item, where)
    check("geometry" in item, f"{where}: geometry missing")
    geom = item["geometry"]
    check(isinstance(geom, dict) and geom.get("type") == "Polygon", f"{where}: geometry")
    ring = geom["coordinates"][0]
    check(len(ring) >= 4 and ring[0] == ring[-1], f"{where}: the ring is not closed")
    check(all(-180 <= x <= 180 and -90 <= y <= 90 for x, y in ring), f"{where}: not lon/lat")
    area = sum(ring[i][0] * ring[i + 1][1] - ring[i + 1][0] * ring[i][1]
               for i in range(len(ring) - 1))
    check(area > 0, f"{where}: the exterior ring is not counter-clockwise (RFC 7946)")
    bbox = need(item, "bbox", list, where)
    check(len(bbox) == 4 and all(map(is_num, bbox)) and bbox[0] <= bbox[2] and
          bbox[1] <= bbox[3], f"{where}: bbox {bbox}")
    check(min(x for x, _ in ring) == bbox[0] and max(y for _, y in ring) == bbox[3],
          f"{where}: bbox is the geometry's extent")
    props = need(item, "properties", dict, where)
    check(RFC3339.match(need(props, "datetime", str, where)), f"{where}: datetime not RFC 3339")
    check_links(need(item, "links", list, where), where)
    # projection v1.1.0
    check("proj:epsg" in props and (props["proj:epsg"] is None or is_int(props["proj:epsg"])),
          f"{where}: proj:epsg is not an integer or null")
    for scope, obj in [("properties", props)] + list(need(item, "assets", dict, where).items()):
        if "proj:shape" in obj:
            check(len(obj["proj:shape"]) == 2 and all(is_int(v) and v > 0 for v in obj["proj:shape"]),
                  f"{where} {scope}: proj:shape")
        if "proj:transform" in obj:
            check(len(obj["proj:transform"]) in (6, 9) and all(map(is_num, obj["proj:transform"])),
                  f"{where} {scope}: proj:transform")
    check(len(props["proj:bbox"]) == 4, f"{where}: proj:bbox")
    base = os.path.dirname(path)
    inside = os.path.realpath(weights).startswith(os.path.realpath(base) + "/")
    models = [a for a in item["assets"].values() if "mlm:model" in a.get("roles", [])]
    if not inside:
        tm = need(props, "tilewise:model", dict, where)
        check(tm["sha256"] == sha256(weights) and tm["size"] == os.path.getsize(weights) and
              not models and EXT["mlm"] not in item["stac_extensions"] and
              not [k for k in props if k.startswith("mlm:")],
              f"{where}: weights outside the folder: no model asset, no mlm, tilewise:model "
              f"with the weights' SHA-256 and size")
    else:  # mlm v1.3.0
        for k, kind in (("mlm:name", str), ("mlm:architecture", str), ("mlm:tasks", list),
                        ("mlm:input", list), ("mlm:output", list)):
            need(props, k, kind, where)
        for inp in props["mlm:input"]:
            need(inp, "name", str, where + " mlm:input")
            bands = need(inp, "bands", list, where + " mlm:input")
            st = need(inp, "input", dict, where + " mlm:input")
            shape, order = need(st, "shape", list, where), need(st, "dim_order", list, where)
            check(len(shape) == len(order) and all(is_int(v) and (v > 0 or v == -1) for v in shape),
                  f"{where}: mlm:input shape/dim_order")
            need(st, "data_type", str, where)
            vs = inp.get("value_scaling")
            check(vs is None or len(vs) in (1, len(bands)), f"{where}: value_scaling per band")
            for v in vs or []:
                if v["type"] == "z-score":
                    check(is_num(v["mean"]) and is_num(v["stddev"]), f"{where}: z-score fields")
        for out in props["mlm:output"]:
            need(out, "name", str, where + " mlm:output")
            need(out, "tasks", list, where + " mlm:output")
            res = need(out, "result", dict, where + " mlm:output")
            check(len(res["shape"]) == len(res["dim_order"]), f"{where}: mlm:output result")
            check_class_list(out.get("classification:classes", []), where + " mlm:output")
    check(len(models) == (1 if inside else 0), f"{where}: one asset with role mlm:model")
    # assets: href, type, roles; file, raster, classification fields
    for key, a in item["assets"].items():
        w = f"{where} asset {key}"
        href = need(a, "href", str, w)
        need(a, "type", str, w)
        check(all(isinstance(r, str) for r in need(a, "roles", list, w)), f"{w}: roles")
        target = os.path.normpath(os.path.join(base, href))
        check(os.path.isfile(target), f"{w}: href {href} does not resolve to a file")
        check(is_int(a.get("file:size")) and a["file:size"] == os.path.getsize(target),
              f"{w}: file:size {a.get('file:size')} != {os.path.getsize(target)}")
        check(re.match(r"^[a-f0-9]+$", a["file:checksum"]) and
              a["file:checksum"] == "1220" + sha256(target), f"{w}: file:checksum != sha256")
        for b in a.get("raster:bands", []):
            check(b["data_type"] in RASTER_TYPES, f"{w}: raster data_type {b['data_type']}")
            if "nodata" in b:
                check(is_num(b["nodata"]) or b["nodata"] in ("nan", "inf", "-inf"), f"{w}: nodata")
            if "scale" in b:
                check(is_num(b["scale"]), f"{w}: scale")
        if "raster:bands" in a:
            check(len(a["raster:bands"]) >= 1, f"{w}: raster:bands empty")
        classes = a.get("classification:classes")
        if classes is not None:
            check(len(classes) >= 1, f"{w}: classes empty")
            check_class_list(classes, w)
        check(not os.path.isabs(href) and not href.startswith("..") and "://" not in href,
              f"{w}: href {href} is not inside the folder")
    if inside:
        check(os.path.samefile(os.path.join(base, models[0]["href"]), weights) and
              models[0]["file:checksum"] == "1220" + sha256(weights),
              f"{where}: the model asset is the weights file, with its SHA-256")
    return item


def check_collection(path, items):
    with open(path) as f:
        c = json.load(f)
    where = "collection.json"
    check(need(c, "type", str, where) == "Collection", f"{where}: type")
    check(need(c, "stac_version", str, where) == "1.0.0", f"{where}: stac_version")
    for k in ("id", "description", "license"):
        need(c, k, str, where)
    check_extensions(c, where)
    ext = need(c, "extent", dict, where)
    bb = ext["spatial"]["bbox"][0]
    iv = ext["temporal"]["interval"][0]
    check(len(bb) == 4 and len(iv) == 2, f"{where}: extent")
    for it in items:
        b = it["bbox"]
        check(bb[0] <= b[0] and bb[1] <= b[1] and bb[2] >= b[2] and bb[3] >= b[3],
              f"{where}: spatial extent holds {it['id']}")
        check(it["properties"]["datetime"] in iv, f"{where}: temporal extent ends at the items")
        check(it.get("collection") == c["id"], f"{it['id']}: collection is {c['id']}")
        check(any(l["rel"] == "collection" for l in it["links"]), f"{it['id']}: collection link")
    check_links(c["links"], where)
    hrefs = {os.path.normpath(os.path.join(os.path.dirname(path), l["href"]))
             for l in c["links"] if l["rel"] == "item"}
    want = {os.path.join(os.path.dirname(path), it["id"] + ".stac.json") for it in items}
    check(hrefs == want, f"{where}: an item link to each item ({sorted(hrefs)})")
    return c


def main():
    gdal = gdal_or_skip()
    if not gdal:
        return 77
    from osgeo import osr
    weights = f"{FIX}/resnet18_6b_7c.safetensors"
    with tempfile.TemporaryDirectory() as tmp:
        src = f"{SRC}/sample_data/L7_ETMs.tif"
        full = gdal.Open(src)
        W, H = full.RasterXSize, full.RasterYSize
        left, right = f"{tmp}/left.tif", f"{tmp}/right.tif"
        gdal.Translate(left, src, srcWin=[0, 0, 192, H],
                       metadataOptions=["TIFFTAG_DATETIME=2021:06:01 10:30:00"])
        gdal.Translate(right, src, srcWin=[192, 0, W - 192, H])

        # -- before the first tile: no datetime; a bad input.datetime ----------
        wf, out = workflow(tmp, "nodate", [left, right], extra="  stac: true\n")
        r = run("run", wf, "-q")
        check(r.returncode == 2 and "right.tif" in r.stderr and "input.datetime" in r.stderr and
              not os.path.exists(out),
              f"no datetime for right.tif: exit 2 naming it and input.datetime, before any "
              f"output ({r.returncode}: {r.stderr.strip()})", True)
        r = run("run", wf, "-q", "--set", "input.datetime=2021-13-01T00:00:00Z")
        check(r.returncode == 2 and "input.datetime" in r.stderr and "month 13" in r.stderr,
              f"input.datetime 2021-13-01...: exit 2 naming the key ({r.stderr.strip()})", True)

        # -- two halves, one item each and a collection ------------------------
        # the weights inside the output folder: a model asset and mlm; class
        # names that collide once made machine-readable
        wf, out = workflow(tmp, "halves", [left, right], products="[class, prob, confidence]",
                           extra="  stac: true\n",
                           input_extra=f"  datetime: \"{FALLBACK}\"\n")
        os.makedirs(f"{out}/models")
        inner = f"{out}/models/m.safetensors"
        with open(weights, "rb") as f, open(inner, "wb") as g:
            g.write(f.read())
        with open(wf) as f:
            text = f.read()
        with open(wf, "w") as f:
            f.write(text.replace(weights, inner).replace(
                "model:\n", "model:\n  classes: [\"a b\", a_b, \"\u00e9\", \"\u00fc\", nodata, "
                "water, forest]\n"))
        r = run("validate", wf)
        check(r.returncode == 0 and f"left.stac.json: datetime {WHEN} (TIFFTAG_DATETIME)" in r.stdout
              and "collection.json" in r.stdout and f"{out}/items.json" in r.stdout,
              f"validate shows the STAC outputs: {r.stdout}", True)
        r = run("run", wf, "-q")
        check(r.returncode == 0, f"run over both halves: {r.stderr}")
        items = [check_item(f"{out}/{n}.stac.json", inner) for n in ("left", "right")]
        print("ok   both items pass the structural check (fields, extensions, hrefs, sizes, "
              "SHA-256 of every asset and of the weights)")
        model = items[0]["assets"]["model"]
        check(model["href"] == "./models/m.safetensors" and "mlm:model" in model["roles"],
              f"weights inside the folder: the model asset's href is relative, inside it "
              f"({model['href']})", True)
        cl = items[0]["assets"]["class"]["classification:classes"]
        check([c["name"] for c in cl] == ["a_b", "a_b_1", "class_2", "class_3", "nodata_4",
                                         "water", "forest", "nodata"] and
              [c["description"] for c in cl[:4]] == ["a b", "a_b", "\u00e9", "\u00fc"] and
              [c["title"] for c in cl[:4]] == ["a b", "a_b", "\u00e9", "\u00fc"],
              f"class names unique and machine-readable, the names as given in description and "
              f"title ({[c['name'] for c in cl]})", True)
        check_collection(f"{out}/collection.json", items)
        print("ok   collection.json passes the structural check (extents hold the items, "
              "item links, the items link back)")
        check(items[0]["properties"]["datetime"] == WHEN and
              items[1]["properties"]["datetime"] == FALLBACK,
              "datetimes: left's TIFFTAG_DATETIME as RFC 3339, right's from input.datetime", True)
        check(sorted(items[0]["assets"]) == ["class", "confidence", "model", "prob"],
              f"one asset per product written, and the model ({sorted(items[0]['assets'])})", True)

        # footprints against OSR here; proj against GDAL's reading of each file
        wgs = osr.SpatialReference()
        wgs.ImportFromEPSG(4326)
        wgs.SetAxisMappingStrategy(osr.OAMS_TRADITIONAL_GIS_ORDER)
        for name, item in zip((left, right), items):
            ds = gdal.Open(name)
            srs = ds.GetSpatialRef().Clone()
            srs.SetAxisMappingStrategy(osr.OAMS_TRADITIONAL_GIS_ORDER)
            ct = osr.CoordinateTransformation(srs, wgs)
            g = ds.GetGeoTransform()
            corners = [ct.TransformPoint(g[0] + c * g[1], g[3] + r * g[5])[:2]
                       for c in (0, ds.RasterXSize) for r in (0, ds.RasterYSize)]
            want = [min(p[0] for p in corners), min(p[1] for p in corners),
                    max(p[0] for p in corners), max(p[1] for p in corners)]
            check(np.allclose(item["bbox"], want, atol=1e-7, rtol=0),
                  f"{item['id']}: bbox {item['bbox']} = the corners through OSR {want}")
            check(item["properties"]["proj:epsg"] == int(srs.GetAuthorityCode(None)),
                  f"{item['id']}: proj:epsg")
            for key, a in item["assets"].items():
                if key == "model":
                    continue
                d = gdal.Open(f"{out}/{a['href']}")
                t = d.GetGeoTransform()
                check(a["proj:shape"] == [d.RasterYSize, d.RasterXSize] and
                      a["proj:transform"] == [t[1], t[2], t[0], t[4], t[5], t[3]],
                      f"{item['id']} {key}: proj:shape/transform are GDAL's")
                b1 = d.GetRasterBand(1)
                check(a["raster:bands"][0]["nodata"] == b1.GetNoDataValue() and
                      len(a["raster:bands"]) == d.RasterCount, f"{item['id']} {key}: raster:bands")
            cds = gdal.Open(f"{out}/{item['id']}.class.tif")  # kept: its band needs it open
            ct_ = cds.GetRasterBand(1).GetColorTable()
            for c in item["assets"]["class"]["classification:classes"][:-1]:
                e = ct_.GetColorEntry(c["value"])
                check(c["color_hint"] == "%02X%02X%02X" % e[:3], f"color_hint of class {c['value']}")
        print("ok   bbox = corners through OSR (1e-7 deg); proj:epsg, proj:shape/transform, "
              "raster:bands = GDAL's; color_hint = the colour table")
        vs = items[0]["properties"]["mlm:input"][0]["value_scaling"]
        check(np.allclose([v["mean"] for v in vs], MEAN, rtol=1e-6) and
              np.allclose([v["stddev"] for v in vs], STD, rtol=1e-6),
              "mlm value_scaling: z-score with the workflow's mean and std (scale 1)", True)

        # -- GDAL's STACIT: the run's items.json as one mosaic of class assets --
        wf_full, out_full = workflow(tmp, "whole", [src], products="[class]")
        r = run("run", wf_full, "-q")
        check(r.returncode == 0, f"whole run: {r.stderr}")
        ref = gdal.Open(f"{out_full}/L7_ETMs.class.tif")
        with open(f"{out}/items.json") as f:
            fc = json.load(f)
        check(fc["type"] == "FeatureCollection" and fc["features"] == items,
              "items.json: a FeatureCollection of the two items as written", True)
        with open(f"{out}/collection.json") as f:
            links = [l for l in json.load(f)["links"] if l["rel"] == "items"]
        check(len(links) == 1 and links[0]["href"] == "./items.json",
              f"collection.json links items.json (rel items): {links}", True)
        cwd = os.getcwd()
        os.chdir(out)  # GDAL 3.6 opens the hrefs as given: relative to the process
        try:
            mosaic = gdal.Open('STACIT:"items.json":asset=class')
            size = (mosaic.RasterXSize, mosaic.RasterYSize)
            gt = mosaic.GetGeoTransform()
            pix = mosaic.ReadAsArray()
        finally:
            os.chdir(cwd)
        check(size == (ref.RasterXSize, ref.RasterYSize),
              f"STACIT mosaic is {size}, the whole raster's class map "
              f"{(ref.RasterXSize, ref.RasterYSize)}", True)
        check(np.allclose(gt, ref.GetGeoTransform(), rtol=1e-12, atol=1e-9),
              f"STACIT geotransform {gt} = the class map's {ref.GetGeoTransform()}", True)
        check(np.array_equal(pix, ref.ReadAsArray()),
              "STACIT mosaic pixels = the whole raster's class map", True)

        # -- tilewise info ------------------------------------------------------
        r = run("info", f"{out}/left.stac.json")
        size = items[0]["assets"]["class"]["file:size"]
        check(r.returncode == 0 and f"datetime  {WHEN}" in r.stdout and
              f"class: ./left.class.tif, {size} bytes" in r.stdout and "ResNet-18" in r.stdout,
              f"info summarises the item: {r.stdout}", True)
        r = run("info", "--json", f"{out}/collection.json")
        check(r.returncode == 0 and json.loads(r.stdout)["type"] == "stac_collection",
              "info --json of the collection", True)

        # -- a rerun writes the item anew, of the new files ---------------------
        r = run("run", wf, "-q", "--set", "output.products=[class]")
        again = check_item(f"{out}/left.stac.json", inner)
        check(r.returncode == 0 and sorted(again["assets"]) == ["class", "model"] and
              not [n for n in os.listdir(out) if n.endswith(".part")],
              "a rerun with other products rewrites the item (its checks pass), no temporaries",
              True)
        with open(f"{out}/items.json") as f:
            check(json.load(f)["features"] == [again, check_item(f"{out}/right.stac.json", inner)],
                  "the rerun rewrites items.json with the new items", True)

        # -- killed runs: an item with its final name always describes the
        # files next to it (the item is removed before the products are
        # replaced, and written atomically after them); the rerun writes it --
        wf, out = workflow(tmp, "killed", [left], products="[class, prob]",
                           extra="  stac: true\n")
        t0 = time.monotonic()
        r = run("run", wf, "-q")
        took = time.monotonic() - t0
        check(r.returncode == 0, f"killed: first run {r.stderr}")
        states = []
        for frac in (0.5, 0.7, 0.85, 1.0):
            p = subprocess.Popen([BIN, "run", wf, "-q", "--chunk-rows", "1", "--set",
                                  "output.products=[class, confidence]"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(took * frac)
            p.send_signal(signal.SIGKILL)
            p.wait()
            path = f"{out}/left.stac.json"
            listed = []
            if os.path.exists(f"{out}/items.json"):
                with open(f"{out}/items.json") as f:
                    listed = json.load(f)["features"]
            if os.path.exists(path):
                it = check_item(path, weights)  # sizes and SHA-256 match the files there
                states.append("new" if "confidence" in it["assets"] else "old")
                check(listed == [it], f"killed: items.json holds the item there ({states})")
            else:
                states.append("none")
                check(listed == [], f"killed: no item, none in items.json ({states})")
        r = run("run", wf, "-q", "--set", "output.products=[class, confidence]")
        it = check_item(f"{out}/left.stac.json", weights)
        check(r.returncode == 0 and sorted(it["assets"]) == ["class", "confidence"],
              f"4 runs killed (SIGKILL) at 50-100 % of a run's time: an item left describes "
              f"the files there (old, new or none: {states}); the rerun writes it", True)

        # -- an input that came from a STAC item: derived_from, its datetime ----
        crop = f"{tmp}/crop"
        os.makedirs(crop)
        assets = {}
        for b in range(1, 7):
            gdal.Translate(f"{crop}/B{b}.tif", src, srcWin=[0, 0, 128, 128], bandList=[b])
            assets[f"B{b}"] = {"href": f"./B{b}.tif", "type": "image/tiff; application=geotiff"}
        with open(f"{crop}/scene.json", "w") as f:
            json.dump({"type": "Feature", "stac_version": "1.0.0", "id": "scene",
                       "geometry": None, "properties": {"datetime": "2020-05-05T05:05:05Z"},
                       "links": [], "assets": assets}, f)
        wf, out = workflow(tmp, "fromstac", [f"{crop}/scene.json"], extra="  stac: true\n",
                           input_extra="  assets: [B1, B2, B3, B4, B5, B6]\n"
                                       f"  datetime: \"{FALLBACK}\"\n")
        r = run("run", wf, "-q")
        check(r.returncode == 0, f"run of a STAC item: {r.stderr}")
        it = check_item(f"{out}/scene.stac.json", weights)
        links = [l for l in it["links"] if l["rel"] == "derived_from"]
        check(len(links) == 1 and os.path.samefile(os.path.join(out, links[0]["href"]),
                                                   f"{crop}/scene.json"),
              f"derived_from links back to the input item ({links})", True)
        check(it["properties"]["datetime"] == "2020-05-05T05:05:05Z" and
              it["properties"]["tilewise:model"]["bands"] == [f"B{b}" for b in range(1, 7)],
              "the input item's datetime comes first; the model's bands are its asset names",
              True)

        # -- a STAC item input's errors say why ----------------------------------
        def bad_item(name, datetime, b1):
            with open(f"{crop}/{name}.json", "w") as f:
                json.dump({"type": "Feature", "stac_version": "1.0.0", "id": name,
                           "geometry": None, "properties": {"datetime": datetime},
                           "links": [], "assets": {**assets, "B1": {"href": b1}}}, f)
            return workflow(tmp, name, [f"{crop}/{name}.json"], extra="  stac: true\n",
                            input_extra="  assets: [B1, B2, B3, B4, B5, B6]\n")
        with open(f"{crop}/notes.txt", "w") as f:
            f.write("not a raster\n")
        for b1, why in (("./notes.txt", "not recognized as a supported file format"),
                        ("./gone.tif", "No such file or directory")):
            wf, out = bad_item("badasset", "2020-05-05T05:05:05Z", b1)
            r = run("run", wf, "-q")
            check(r.returncode == 3 and f"asset B1 ({crop}/{b1[2:]}) cannot be opened as a "
                  f"raster: " in r.stderr and why in r.stderr,
                  f"an asset GDAL cannot open ({b1}): exit 3 saying why ({r.stderr.strip()})",
                  True)
        wf, out = bad_item("yesterday", "yesterday", "./B1.tif")
        r = run("run", wf, "-q")
        check(r.returncode == 2 and "properties.datetime \"yesterday\" is not RFC 3339" in r.stderr
              and "no datetime" not in r.stderr and "input.datetime" in r.stderr,
              f"an item datetime 'yesterday': exit 2 quoting the key and the value, not 'no "
              f"datetime' ({r.stderr.strip()})", True)

        # -- shards + merge: the merged products' item ---------------------------
        wf, out = workflow(tmp, "shards", [left, right], products="[class, prob]",
                           extra="  stac: true\n",
                           input_extra=f"  datetime: \"{FALLBACK}\"\n")
        for s in ("1/2", "2/2"):
            r = run("run", wf, "-q", "--shard", s)
            check(r.returncode == 0, f"shard {s}: {r.stderr}")
            check(not [n for n in os.listdir(out)
                       if n.endswith(".stac.json") or n in ("collection.json", "items.json")],
                  f"shard {s} writes no item nor collection")
        r = run("merge", out, "-q")
        check(r.returncode == 0, f"merge: {r.stderr}")
        merged = [check_item(f"{out}/{n}.stac.json", weights) for n in ("left", "right")]
        check_collection(f"{out}/collection.json", merged)
        with open(f"{out}/items.json") as f:
            listed = json.load(f)["features"]
        check(sorted(listed, key=lambda i: i["id"]) == merged,
              f"merge writes items.json of the merged items ({[i['id'] for i in listed]})")
        check(merged[0]["properties"]["datetime"] == WHEN and
              merged[1]["properties"]["datetime"] == FALLBACK and
              sorted(merged[0]["assets"]) == ["class", "prob"],
              "merge writes the merged products' items and collection (structural checks, "
              "checksums of the merged files, the datetimes the shards resolved)", True)
    print("e2e_stac: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
