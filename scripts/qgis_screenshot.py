"""Run inside QGIS (qgis --code): load a class map styled by the tilewise
provider, show its legend, save a screenshot of the main window, quit.
Environment: TW_CLASS_TIF (the class raster), TW_SHOT (the PNG to write),
TW_PLUGINS (the folder holding tilewise_provider)."""
import os
import sys

from qgis.core import QgsProject, QgsRasterLayer
from qgis.PyQt.QtCore import QTimer
from qgis.utils import iface

sys.path.insert(0, os.environ["TW_PLUGINS"])
from tilewise_provider.algorithms import apply_class_style, legend_of  # noqa: E402

path = os.environ["TW_CLASS_TIF"]
layer = QgsRasterLayer(path, os.path.basename(path)[:-4])
apply_class_style(layer, legend_of(path))
QgsProject.instance().addMapLayer(layer)
iface.mainWindow().resize(1000, 640)
iface.mapCanvas().setExtent(layer.extent())
iface.mapCanvas().refresh()


def shoot():
    iface.mainWindow().grab().save(os.environ["TW_SHOT"])
    os._exit(0)


QTimer.singleShot(6000, shoot)
