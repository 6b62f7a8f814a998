"""Drives the installed tilewise Processing provider from PyQGIS (headless), for
tests/e2e_qgis.py: what qgis_process cannot do (cancel a run, see warnings,
load the outputs into a project). Prints one JSON object on stdout.

usage: python3 drive_provider.py WORKFLOW OUT_DIR SCALE_OUT_DIR
  WORKFLOW       a workflow file (its output.dir is overridden)
  OUT_DIR        the cancelled-then-resumed run's output folder
  SCALE_OUT_DIR  a run with input.scale=0.001, whose validate warnings are
                 collected
QGIS_PLUGINPATH must name the folder holding tilewise_provider.
"""
import json
import os
import sys

from qgis.core import (QgsApplication, QgsPalettedRasterRenderer, QgsProcessingContext,
                       QgsProcessingException, QgsProcessingFeedback, QgsProject)


class Feedback(QgsProcessingFeedback):
    """Records warnings; cancels itself once progress passes cancel_at."""

    def __init__(self, cancel_at=None):
        super().__init__()
        self.cancel_at = cancel_at
        self.warnings = []
        self.max_progress = 0.0
        self.texts = []

    def pushWarning(self, text):  # noqa: N802
        self.warnings.append(text)
        super().pushWarning(text)

    def setProgressText(self, text):  # noqa: N802
        self.texts.append(text)
        super().setProgressText(text)

    def setProgress(self, p):  # noqa: N802
        self.max_progress = max(self.max_progress, p)
        if self.cancel_at is not None and p >= self.cancel_at:
            self.cancel()
        super().setProgress(p)


def main():
    wf, out, scale_out = sys.argv[1:4]
    app = QgsApplication([], False)
    app.initQgis()
    sys.path.insert(0, "/usr/share/qgis/python/plugins")
    from processing.core.Processing import Processing
    Processing.initialize()
    plugin_dir = os.environ["QGIS_PLUGINPATH"]
    sys.path.insert(0, plugin_dir)
    import tilewise_provider
    plugin = tilewise_provider.classFactory(None)
    plugin.initProcessing()
    import processing

    result = {}
    overrides = f"output.dir={out}\ntiling.batch=4; run.chunk_rows=1\nruntime.device=cpu"
    params = {"WORKFLOW": wf, "OVERRIDES": overrides}
    fb = Feedback(cancel_at=30)
    try:
        processing.run("tilewise:run_workflow", params, feedback=fb)
        result["cancelled"] = None
    except QgsProcessingException as e:
        result["cancelled"] = str(e)
    result["progress_seen"] = fb.max_progress
    # a cancelled attempt reports in run.failed.json: run.json belongs to a finished run
    with open(os.path.join(out, "run.failed.json")) as f:
        result["first_status"] = json.load(f)["status"]

    # Rerun: resumes; the outputs load into the project with their legend.
    context = QgsProcessingContext()
    context.setProject(QgsProject.instance())
    fb = Feedback()
    res = processing.run("tilewise:run_workflow", params, context=context, feedback=fb)
    with open(os.path.join(out, "run.json")) as f:
        rep = json.load(f)
    result["second_status"] = rep["status"]
    result["tiles_total"] = rep["inputs"][0]["tiles_total"]
    result["last_progress_text"] = fb.texts[-1] if fb.texts else None
    result["rows_resumed"] = rep["inputs"][0]["rows_resumed"]
    result["class_output"] = res.get("CLASS")
    # Layers to load on completion: what the Processing dialog loads.
    for path, details in context.layersToLoadOnCompletion().items():
        from qgis.core import QgsRasterLayer
        layer = QgsRasterLayer(path, details.name)
        QgsProject.instance().addMapLayer(layer)
        if details.postProcessor():
            details.postProcessor().postProcessLayer(layer, context, fb)
    layers = {}
    for layer in QgsProject.instance().mapLayers().values():
        info = {"bands": [layer.bandName(i) for i in range(1, layer.bandCount() + 1)]}
        r = layer.renderer()
        if isinstance(r, QgsPalettedRasterRenderer):
            info["classes"] = [(c.value, c.label, c.color.name()) for c in r.classes()]
        layers[os.path.basename(layer.source())] = info
    result["layers"] = layers

    # validate's advice as Processing warnings, before the run.
    fb = Feedback()
    processing.run("tilewise:run_workflow",
                   {"WORKFLOW": wf, "OVERRIDES": f"output.dir={scale_out}\ninput.scale=0.001\n"
                                                 "runtime.device=cpu"}, feedback=fb)
    result["scale_warnings"] = fb.warnings
    print(json.dumps(result))
    app.exitQgis()


if __name__ == "__main__":
    main()
