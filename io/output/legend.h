/* legend.h - where a class map's legend lives, for `tilewise info`.
 *
 * A class map (one Byte band with a colour table) written as GTiff or COG
 * keeps its colour table, band description and the TILEWISE_RUN metadata
 * item (the run's configuration, class names included) inside the .tif, but
 * GDAL 3.6 stores category names only in the FILE.aux.xml sidecar: a .tif
 * moved alone shows its colours without names. tw_legend_note says which
 * case a file is in, in one line.
 */
#ifndef TW_LEGEND_H
#define TW_LEGEND_H

#include <stdbool.h>
#include <stddef.h>

/* One line about the legend of the raster at path into buf (size bytes):
 * where its class names come from and what to keep together. Returns false
 * (buf untouched) when path is not a class map (one band with a colour table)
 * or cannot be opened. Opens the file with GDAL (quietly); thread-safe. */
bool tw_legend_note(const char *path, char *buf, size_t size);

#endif
