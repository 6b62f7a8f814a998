"""Makers of damaged rasters for the bad-input and fault tests.

Kept apart from the tests so that both (e2e_bad_inputs.py, e2e_faults.py)
damage files the same way. Only Debian's python3 with GDAL and numpy.
"""
import struct

TAG_TILE_OFFSETS = 324
TAG_TILE_BYTE_COUNTS = 325
TIFF_TYPE_SIZE = {3: 2, 4: 4, 16: 8}  # SHORT, LONG, LONG8


def make_tiled(src, dst, block=64, compress="DEFLATE"):
    """Copy src to a tiled, pixel-interleaved GeoTIFF (one block holds every
    band of a block x block window). Returns (blocks_x, blocks_y)."""
    from osgeo import gdal
    gdal.UseExceptions()
    gdal.Translate(dst, src, creationOptions=[
        "TILED=YES", f"BLOCKXSIZE={block}", f"BLOCKYSIZE={block}", f"COMPRESS={compress}",
        "INTERLEAVE=PIXEL"])
    ds = gdal.Open(dst)
    bx = (ds.RasterXSize + block - 1) // block
    by = (ds.RasterYSize + block - 1) // block
    return bx, by


def block_span(path, bx, by):
    """(offset, byte count) of block (bx, by) as the TIFF's TileOffsets and
    TileByteCounts say (read through GDAL's TIFF metadata domain)."""
    from osgeo import gdal
    gdal.UseExceptions()
    ds = gdal.Open(path)
    b = ds.GetRasterBand(1)
    off = int(b.GetMetadataItem(f"BLOCK_OFFSET_{bx}_{by}", "TIFF"))
    size = int(b.GetMetadataItem(f"BLOCK_SIZE_{bx}_{by}", "TIFF"))
    return off, size


def garble_block(path, bx, by, seed=1):
    """Overwrite the compressed bytes of block (bx, by) with garbage (keeping
    the first two bytes, so that the DEFLATE header still looks right and the
    decoder fails inside the stream)."""
    off, size = block_span(path, bx, by)
    junk = bytes((seed * 7919 + i * 104729) % 251 for i in range(size - 2))
    with open(path, "r+b") as f:
        f.seek(off + 2)
        f.write(junk)


def _ifd_entry(data, tag):
    """(type, count, value-or-offset position) of a tag in the first IFD of a
    classic little-endian TIFF."""
    if data[:4] != b"II*\0":
        raise ValueError("not a classic little-endian TIFF")
    ifd = struct.unpack_from("<I", data, 4)[0]
    n = struct.unpack_from("<H", data, ifd)[0]
    for i in range(n):
        e = ifd + 2 + 12 * i
        t, typ, count = struct.unpack_from("<HHI", data, e)
        if t == tag:
            size = TIFF_TYPE_SIZE[typ] * count
            pos = e + 8 if size <= 4 else struct.unpack_from("<I", data, e + 8)[0]
            return typ, count, pos
    raise KeyError(tag)


def truncate_block_count(path, bx, by, blocks_x):
    """Halve block (bx, by)'s entry in TileByteCounts: the decoder then runs
    out of data in the middle of that block."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    typ, count, pos = _ifd_entry(data, TAG_TILE_BYTE_COUNTS)
    idx = by * blocks_x + bx
    if idx >= count:
        raise IndexError("block outside the TileByteCounts array")
    fmt = {3: "<H", 4: "<I", 16: "<Q"}[typ]
    at = pos + idx * TIFF_TYPE_SIZE[typ]
    old = struct.unpack_from(fmt, data, at)[0]
    struct.pack_into(fmt, data, at, old // 2)
    with open(path, "wb") as f:
        f.write(data)
