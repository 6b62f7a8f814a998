"""tilewise:classify and tilewise:run_workflow, over the tilewise Python package.

Both run what `tilewise run` runs (the same library, the same bytes): progress
goes to the Processing dialog (the bar, and the tiles done of the input under
way as its text), Cancel stops the run at its next commit point
(run the algorithm again with the same parameters to resume), the warnings of
`tilewise validate` are shown before the run starts, and the class raster is
loaded with its colours and class names, the probability raster with its band
names, the class polygons (products: polygons) categorised by class with the
class map's colours and names.
"""
import contextlib
import json
import os
import sys

from qgis.core import (
    QgsProcessingAlgorithm,
    QgsProcessingContext,
    QgsProcessingException,
    QgsProcessingLayerPostProcessorInterface,
    QgsProcessingOutputFile,
    QgsProcessingOutputFolder,
    QgsProcessingOutputRasterLayer,
    QgsProcessingOutputVectorLayer,
    QgsProcessingParameterEnum,
    QgsProcessingParameterFile,
    QgsProcessingParameterFolderDestination,
    QgsProcessingParameterNumber,
    QgsProcessingParameterRasterLayer,
    QgsProcessingParameterString,
)

HERE = os.path.dirname(os.path.abspath(__file__))
# Installed: PREFIX/share/tilewise/qgis/tilewise_provider; in the sources: qgis/tilewise_provider.
PREFIX = os.path.normpath(os.path.join(HERE, "..", "..", "..", ".."))
SOURCES = os.path.normpath(os.path.join(HERE, "..", ".."))

DEVICES = ["auto", "cpu", "cuda"]
PRECISIONS = ["fp32", "tf32", "fp16", "bf16", "int8"]
# (new products go at the end: saved models and scripts name them by index)
PRODUCTS = ["class", "prob", "confidence", "embeddings", "tiles", "tiles_gpkg", "polygons",
            "embedding_raster"]


def number_list(text, what, whole=False):
    """'1, 2,3' (commas or spaces) as a list of numbers; [] for an empty text;
    a QgsProcessingException naming the parameter for anything else."""
    items = [t for t in text.replace(",", " ").split() if t]
    try:
        return [int(t) if whole else float(t) for t in items]
    except ValueError:
        raise QgsProcessingException(
            f"{what}: expected {'whole numbers' if whole else 'numbers'} separated by commas, "
            f"got '{text}'") from None


def tilewise_module():
    """The tilewise Python package: importable as is, else the one installed
    in this plugin's prefix, else the one in the source tree."""
    try:
        import tilewise

        return tilewise
    except ImportError:
        pass
    for cand in (os.path.join(PREFIX, "lib", "python3", "dist-packages"),
                 os.path.join(SOURCES, "python")):
        if os.path.exists(os.path.join(cand, "tilewise", "__init__.py")):
            sys.path.insert(0, cand)
            import tilewise

            return tilewise
    raise QgsProcessingException("the tilewise Python package is not installed (cmake --install)")


@contextlib.contextmanager
def no_sidecars():
    """GDAL's PAM off in this thread while QGIS opens INPUT: loading a
    multiband raster as a layer computes its statistics (the default
    contrast stretch reads every pixel of a small raster), and GDAL would
    save them beside the user's file as INPUT.aux.xml when the layer closes.
    tilewise reads INPUT in its own thread, where nothing changes; a
    thread-local option leaves QGIS's other threads alone."""
    from osgeo import gdal

    old = gdal.GetThreadLocalConfigOption("GDAL_PAM_ENABLED", None)
    gdal.SetThreadLocalConfigOption("GDAL_PAM_ENABLED", "NO")
    try:
        yield
    finally:
        gdal.SetThreadLocalConfigOption("GDAL_PAM_ENABLED", old)


class RasterInput(QgsProcessingParameterRasterLayer):
    """INPUT: a raster layer parameter whose value check (qgis_process and
    the dialog open the file as a layer there, before the algorithm runs)
    writes nothing beside the file (no_sidecars)."""

    def checkValueIsAcceptable(self, value, context=None):  # noqa: N802
        with no_sidecars():
            return super().checkValueIsAcceptable(value, context)


def push_validate_warnings(workflow, sets, feedback):
    """tilewise.validate's warnings (the advice of `tilewise validate`) as
    Processing warnings. A workflow that cannot start is left to the run,
    which raises with the message."""
    tw = tilewise_module()
    try:
        advice = tw.validate(workflow, overrides=sets)
    except tw.Error:
        return
    for line in advice["warnings"]:
        feedback.pushWarning(line)


def legend_of(path, report=None):
    """Class names of a class raster: from the run report, else from the
    TILEWISE_RUN metadata item the raster carries inside the file."""
    if report:
        names = report.get("config", {}).get("model", {}).get("classes")
        if names:
            return names
    try:
        from osgeo import gdal

        ds = gdal.Open(path)
        meta = json.loads(ds.GetMetadataItem("TILEWISE_RUN") or "{}")
        return meta.get("model", {}).get("classes", [])
    except Exception:  # noqa: BLE001 - no legend is not an error
        return []


_KEEP = []  # post-processors must outlive the algorithm run


class ClassStyle(QgsProcessingLayerPostProcessorInterface):
    """A paletted renderer with exactly the model's classes: the file's colour
    table colours, the class names as labels (QGIS would otherwise list all
    256 colour table entries)."""

    def __init__(self, names):
        super().__init__()
        self.names = list(names)

    def postProcessLayer(self, layer, context, feedback):  # noqa: N802
        apply_class_style(layer, self.names)


def apply_class_style(layer, names):
    from qgis.PyQt.QtGui import QColor
    from qgis.core import QgsPalettedRasterRenderer

    colors = {int(i.value): i.color for i in layer.dataProvider().colorTable(1)}
    classes = [QgsPalettedRasterRenderer.Class(k, colors.get(k, QColor("black")), name)
               for k, name in enumerate(names)]
    layer.setRenderer(QgsPalettedRasterRenderer(layer.dataProvider(), 1, classes))
    layer.triggerRepaint()


class PolygonStyle(QgsProcessingLayerPostProcessorInterface):
    """The class polygons categorised by their `class` field: one category per
    class, the colours of the layer's CLASS_COLORS metadata (the class map's),
    the class names as labels."""

    def __init__(self, names, path):
        super().__init__()
        self.names = list(names)
        self.path = path

    def postProcessLayer(self, layer, context, feedback):  # noqa: N802
        apply_polygon_style(layer, self.names, polygon_colors(self.path))


def polygon_colors(path):
    """The class colours a polygons file carries ('#rrggbb' per class)."""
    try:
        from osgeo import ogr

        ds = ogr.Open(path)
        text = ds.GetLayerByName("classes").GetMetadataItem("CLASS_COLORS") or ""
        return [c for c in text.split(",") if c]
    except Exception:  # noqa: BLE001 - no colours: QGIS picks some
        return []


def apply_polygon_style(layer, names, colors):
    from qgis.PyQt.QtGui import QColor
    from qgis.core import QgsCategorizedSymbolRenderer, QgsRendererCategory, QgsSymbol

    cats = []
    for k, name in enumerate(names):
        sym = QgsSymbol.defaultSymbol(layer.geometryType())
        if k < len(colors):
            sym.setColor(QColor(colors[k]))
        cats.append(QgsRendererCategory(k, sym, name))
    layer.setRenderer(QgsCategorizedSymbolRenderer("class", cats))
    layer.triggerRepaint()


def run_tilewise(workflow, sets, feedback):
    """tilewise.run with the dialog's progress and Cancel."""
    tw = tilewise_module()

    def progress(fraction, message):
        feedback.setProgress(100.0 * fraction)
        return not feedback.isCanceled()

    shown = {}

    def tiles(done, total, name):
        # The dialog's text under the bar: the input and its tile count, at
        # most once a percent (QGIS repaints on every call).
        step = (os.path.basename(name), done * 100 // total if total else 0)
        if shown.get("step") != step:
            shown["step"] = step
            feedback.setProgressText(f"{step[0]}: {done}/{total} tiles")

    def log(level, message):
        if level == 0:
            feedback.pushInfo(message)
        else:
            feedback.pushWarning(message)

    try:
        return tw.run(workflow, overrides=sets, progress=progress, log=log, tiles=tiles)
    except tw.Error as e:
        if e.exit_class == "interrupted":
            raise QgsProcessingException(
                f"cancelled at a commit point ({e.message}); run the algorithm again with the "
                "same parameters to resume") from None
        raise QgsProcessingException(f"tilewise {e.status}: {e.message}") from None


def load_outputs(report, context, results):
    """Load each input's class and probability rasters and its class polygons into the
    project."""
    names = legend_of(None, report)
    for res in report.get("inputs", []):
        for path in res.get("outputs", []):
            base = os.path.basename(path)
            if base.endswith(".class.tif"):
                key, style = "CLASS", ClassStyle(names)
            elif base.endswith(".prob.tif"):
                key, style = "PROB", None
            elif base.endswith(".conf.tif"):
                key, style = "CONFIDENCE", None
            elif base.endswith(".emb.tif"):
                key, style = "EMBEDDING_RASTER", None
            elif base.endswith(".class.gpkg") or base.endswith(".class.fgb"):
                key, style = "POLYGONS", PolygonStyle(names, path)
            else:
                continue
            results.setdefault(key, path)
            if context.project() is None:
                continue
            details = QgsProcessingContext.LayerDetails(base.rsplit(".", 1)[0], context.project(),
                                                        key)
            if style is not None:
                _KEEP.append(style)
                details.setPostProcessor(style)
            context.addLayerToLoadOnCompletion(path, details)


class _Base(QgsProcessingAlgorithm):
    def group(self):
        return ""

    def groupId(self):  # noqa: N802
        return ""

    def createInstance(self):  # noqa: N802
        return type(self)()

    def _outputs(self):
        self.addOutput(QgsProcessingOutputRasterLayer("CLASS", "Class map"))
        self.addOutput(QgsProcessingOutputRasterLayer("PROB", "Probabilities"))
        self.addOutput(QgsProcessingOutputRasterLayer("CONFIDENCE", "Confidence"))
        self.addOutput(QgsProcessingOutputVectorLayer("POLYGONS", "Class polygons"))
        self.addOutput(QgsProcessingOutputRasterLayer("EMBEDDING_RASTER", "Embeddings per cell"))
        self.addOutput(QgsProcessingOutputFile("REPORT", "Run report (run.json)"))


class ClassifyAlgorithm(_Base):
    def name(self):
        return "classify"

    def displayName(self):  # noqa: N802
        return "Classify a raster with a ResNet"

    def shortHelpString(self):  # noqa: N802
        return ("Classifies INPUT tile by tile with the model file (HDF5 bundle, safetensors "
                "or ONNX) in bounded memory and writes a class map (colours and class names), "
                "probabilities (one band per class) and what PRODUCTS asks into OUTPUT_FOLDER. "
                "A segmentation model (FCN, DeepLabV3, U-Net) gives a class per pixel, on the "
                "input's grid, its overlapping tiles blended (cosine weights; tiling.blend and "
                "tiling.margin through 'Run a tilewise workflow'). "
                "TILE 0 takes the model's tile size, STRIDE 0 the model's default (a classifier: "
                "the tile; a segmentation model: half a tile of overlap). BANDS, SCALE, MEAN and "
                "STD are input.bands, input.scale, model.mean and model.std (empty: the model "
                "file's, else all bands, 1, none). Cancel stops at a commit "
                "point: run again with the same parameters to resume.")

    def initAlgorithm(self, config=None):  # noqa: N802
        self.addParameter(RasterInput("INPUT", "Input raster"))
        self.addParameter(QgsProcessingParameterFile(
            "MODEL", "Model file",
            fileFilter="Models (*.h5 *.hdf5 *.safetensors *.onnx);;All files (*)"))
        self.addParameter(QgsProcessingParameterNumber(
            "TILE", "Tile size (pixels; 0 = the model's)", QgsProcessingParameterNumber.Integer,
            0, minValue=0))
        self.addParameter(QgsProcessingParameterNumber(
            "STRIDE",
            "Stride (pixels; 0 = the model's default; a classifier's must divide the tile)",
            QgsProcessingParameterNumber.Integer, 0, minValue=0))
        self.addParameter(QgsProcessingParameterString(
            "BANDS", "Bands (1-based, in the model's order, e.g. 3,2,1; empty: the model's or all)",
            optional=True))
        self.addParameter(QgsProcessingParameterNumber(
            "SCALE", "Scale (x = (value * scale - mean) / std; empty: the model's or 1)",
            QgsProcessingParameterNumber.Double, None, optional=True, minValue=0.0))
        self.addParameter(QgsProcessingParameterString(
            "MEAN", "Mean per band (after scale; empty: the model's)", optional=True))
        self.addParameter(QgsProcessingParameterString(
            "STD", "Std per band (after scale; empty: the model's)", optional=True))
        self.addParameter(QgsProcessingParameterEnum("DEVICE", "Device", DEVICES, defaultValue=0))
        self.addParameter(QgsProcessingParameterEnum("PRECISION", "Precision", PRECISIONS,
                                                     defaultValue=0))
        self.addParameter(QgsProcessingParameterEnum("PRODUCTS", "Products", PRODUCTS,
                                                     allowMultiple=True, defaultValue=[0, 1]))
        self.addParameter(QgsProcessingParameterFolderDestination("OUTPUT_FOLDER",
                                                                  "Output folder"))
        self._outputs()

    # Processing opens INPUT as a layer when it checks its value, the
    # parameters, the CRSs and when the algorithm runs: each time without
    # writing beside it (no_sidecars).
    def checkParameterValues(self, parameters, context):  # noqa: N802
        with no_sidecars():
            return super().checkParameterValues(parameters, context)

    def validateInputCrs(self, parameters, context):  # noqa: N802
        with no_sidecars():
            return super().validateInputCrs(parameters, context)

    def processAlgorithm(self, parameters, context, feedback):  # noqa: N802
        with no_sidecars():
            layer = self.parameterAsRasterLayer(parameters, "INPUT", context)
        if layer is None:
            raise QgsProcessingException("INPUT is not a raster layer")
        if layer.providerType() != "gdal":
            raise QgsProcessingException(f"INPUT must be a GDAL raster (is {layer.providerType()})")
        model = self.parameterAsFile(parameters, "MODEL", context)
        tile = self.parameterAsInt(parameters, "TILE", context)
        stride = self.parameterAsInt(parameters, "STRIDE", context)
        device = DEVICES[self.parameterAsEnum(parameters, "DEVICE", context)]
        precision = PRECISIONS[self.parameterAsEnum(parameters, "PRECISION", context)]
        products = [PRODUCTS[i] for i in self.parameterAsEnums(parameters, "PRODUCTS", context)]
        folder = self.parameterAsString(parameters, "OUTPUT_FOLDER", context)
        workflow = {"input": {"path": [layer.source()]},
                    "model": {"weights": os.path.abspath(model)},
                    "tiling": {},
                    "runtime": {"device": device, "precision": precision},
                    "output": {"dir": os.path.abspath(folder), "products": products or ["class"]}}
        if tile:
            workflow["tiling"]["tile"] = tile
        if stride:
            workflow["tiling"]["stride"] = stride
        if not workflow["tiling"]:
            del workflow["tiling"]
        bands = number_list(self.parameterAsString(parameters, "BANDS", context) or "", "BANDS",
                            whole=True)
        if bands:
            workflow["input"]["bands"] = bands
        if parameters.get("SCALE") not in (None, ""):
            workflow["input"]["scale"] = self.parameterAsDouble(parameters, "SCALE", context)
        for key, name in (("MEAN", "mean"), ("STD", "std")):
            values = number_list(self.parameterAsString(parameters, key, context) or "", key)
            if values:
                workflow["model"][name] = values
        push_validate_warnings(workflow, [], feedback)
        report = run_tilewise(workflow, [], feedback)
        results = {"OUTPUT_FOLDER": folder,
                   "REPORT": os.path.join(workflow["output"]["dir"], "run.json")}
        load_outputs(report, context, results)
        return results


class RunWorkflowAlgorithm(_Base):
    def name(self):
        return "run_workflow"

    def displayName(self):  # noqa: N802
        return "Run a tilewise workflow"

    def shortHelpString(self):  # noqa: N802
        return ("Runs a workflow YAML file as `tilewise run` does. OVERRIDES: key.path=value, "
                "one per line (or separated by ';'), as --set (e.g. tiling.stride=32); "
                "run.chunk_rows=N and run.shard=I/N as the command's options. Cancel stops at a "
                "commit point: run again to resume.")

    def initAlgorithm(self, config=None):  # noqa: N802
        self.addParameter(QgsProcessingParameterFile(
            "WORKFLOW", "Workflow file", fileFilter="Workflows (*.yaml *.yml);;All files (*)"))
        self.addParameter(QgsProcessingParameterString("OVERRIDES", "Overrides (key.path=value)",
                                                       multiLine=True, optional=True))
        self.addOutput(QgsProcessingOutputFolder("OUTPUT_FOLDER", "Output folder"))
        self._outputs()

    def processAlgorithm(self, parameters, context, feedback):  # noqa: N802
        wf = self.parameterAsFile(parameters, "WORKFLOW", context)
        text = self.parameterAsString(parameters, "OVERRIDES", context) or ""
        sets = [s.strip() for line in text.splitlines() for s in line.split(";") if s.strip()]
        push_validate_warnings(wf, sets, feedback)
        report = run_tilewise(wf, sets, feedback)
        out_dir = report.get("config", {}).get("output", {}).get("dir", "")
        results = {"OUTPUT_FOLDER": out_dir, "REPORT": os.path.join(out_dir, "run.json")}
        load_outputs(report, context, results)
        return results
