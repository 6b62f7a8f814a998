#!/usr/bin/python3
"""style_polygons.py POLYGONS_FILE NAME... - the QGIS provider's styling of a
class polygons file (qgis/tilewise_provider: load_outputs' PolygonStyle), run
headless by tests/e2e_polygons.py: loads the file as QGIS does, applies the
post-processor the provider attaches, and prints the layer's validity,
feature count and categories (value, label, colour) as JSON."""
import json
import os
import sys

from qgis.core import QgsApplication, QgsCategorizedSymbolRenderer, QgsVectorLayer


def main():
    path, names = sys.argv[1], sys.argv[2:]
    app = QgsApplication([], False)
    app.initQgis()
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "qgis"))
    from tilewise_provider.algorithms import PolygonStyle
    layer = QgsVectorLayer(path, "polygons", "ogr")
    PolygonStyle(names, path).postProcessLayer(layer, None, None)
    r = layer.renderer()
    out = {"valid": layer.isValid(), "features": layer.featureCount(),
           "attribute": r.classAttribute() if isinstance(r, QgsCategorizedSymbolRenderer) else None,
           "categories": [[c.value(), c.label(), c.symbol().color().name()]
                          for c in r.categories()] if isinstance(r, QgsCategorizedSymbolRenderer)
           else []}
    print(json.dumps(out), flush=True)
    # QGIS 3.22 may crash tearing down a layer after exitQgis: the result is out
    del r, layer
    app.exitQgis()
    os._exit(0)


if __name__ == "__main__":
    main()
