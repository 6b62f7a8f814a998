#!/usr/bin/python3
"""bench/polygons_rss.py SIZE DIR [NOISE] - a synthetic class map for polygons_rss.c.

DIR/class.tif: SIZE x SIZE Byte (tiled, DEFLATE, nodata 255): blocks of 64 x 64
cells of 7 classes (random per block), a 1/16 band of nodata along the left
edge, and NOISE (default 0.0005) of the cells set to a random class (one- or
few-cell regions). DIR/conf.tif: float32 confidence 0.5 + class/16. Written in
strips of 1024 rows, so a 32768^2 map needs ~200 MB of memory to make."""
import os
import sys

import numpy as np
from osgeo import gdal

gdal.UseExceptions()
size, out = int(sys.argv[1]), sys.argv[2]
noise = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0005
os.makedirs(out, exist_ok=True)
co = ["TILED=YES", "COMPRESS=DEFLATE", "BIGTIFF=YES", "NUM_THREADS=2"]
drv = gdal.GetDriverByName("GTiff")
cls = drv.Create(os.path.join(out, "class.tif"), size, size, 1, gdal.GDT_Byte, co)
conf = drv.Create(os.path.join(out, "conf.tif"), size, size, 1, gdal.GDT_Float32, co)
for ds in (cls, conf):
    ds.SetGeoTransform([500000.0, 10.0, 0.0, 6000000.0, 0.0, -10.0])
    ds.SetProjection("EPSG:32632")
cls.GetRasterBand(1).SetNoDataValue(255)
conf.GetRasterBand(1).SetNoDataValue(-1)
rng = np.random.default_rng(1)
nb = (size + 63) // 64
blocks = rng.integers(0, 7, (nb, nb), dtype=np.uint8)
for y0 in range(0, size, 1024):
    h = min(1024, size - y0)
    ys = (np.arange(y0, y0 + h) // 64)[:, None]
    xs = (np.arange(size) // 64)[None, :]
    a = blocks[ys, xs].copy()
    m = rng.random((h, size)) < noise
    a[m] = rng.integers(0, 7, int(m.sum()), dtype=np.uint8)
    a[:, : size // 16] = 255
    cls.GetRasterBand(1).WriteArray(a, 0, y0)
    c = (0.5 + a.astype(np.float32) / 16).astype(np.float32)
    c[a == 255] = -1
    conf.GetRasterBand(1).WriteArray(c, 0, y0)
cls = conf = None
