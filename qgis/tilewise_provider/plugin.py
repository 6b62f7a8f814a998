"""Registers the tilewise Processing provider with QGIS (GUI and qgis_process)."""
from qgis.core import QgsApplication


class TilewisePlugin:
    def __init__(self, iface=None):
        self.iface = iface
        self.provider = None

    def initProcessing(self):  # noqa: N802 - QGIS calls it (also qgis_process)
        from .provider import TilewiseProvider

        if self.provider is None:
            self.provider = TilewiseProvider()
            QgsApplication.processingRegistry().addProvider(self.provider)

    def initGui(self):  # noqa: N802
        self.initProcessing()

    def unload(self):
        if self.provider is not None:
            QgsApplication.processingRegistry().removeProvider(self.provider)
            self.provider = None
