"""The tilewise Processing provider: tilewise:classify and tilewise:run_workflow."""
from qgis.core import QgsProcessingProvider

from .algorithms import ClassifyAlgorithm, RunWorkflowAlgorithm


class TilewiseProvider(QgsProcessingProvider):
    def id(self):
        return "tilewise"

    def name(self):
        return "tilewise"

    def longName(self):  # noqa: N802
        return "tilewise (ResNet classification of rasters, tile by tile, in bounded memory)"

    def loadAlgorithms(self):  # noqa: N802
        self.addAlgorithm(ClassifyAlgorithm())
        self.addAlgorithm(RunWorkflowAlgorithm())
