#!/usr/bin/python3
"""The QGIS Processing provider, headless, as installed by `cmake --install`
(QT_QPA_PLATFORM=offscreen, QGIS_PLUGINPATH = the installed plugin's parent
folder, a throw-away HOME whose QGIS profile enables the plugin):

* `qgis_process list` shows tilewise:classify and tilewise:run_workflow;
* `qgis_process run tilewise:classify` on the sample writes the bytes of the
  class (and probability) raster `tilewise run` writes for the same workflow,
  and nothing beside the input (no INPUT.aux.xml of statistics);
* from PyQGIS (tests/qgis/drive_provider.py; qgis_process cannot cancel): a
  run cancelled through its QgsProcessingFeedback stops at a commit point
  ("interrupted" in run.json), the same run again resumes (rows_resumed > 0)
  and gives the uninterrupted run's bytes; the class layer loads with exactly
  the model's classes, names and colours; the probability layer's bands are
  named after the classes; validate's warnings arrive as Processing warnings.

Debian 12's /usr/bin/qgis_process wrapper passes --noversioncheck, which QGIS
3.22's qgis_process rejects ("Command --noversioncheck not known!"): the test
runs /usr/bin/qgis_process.bin when the wrapper fails.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

from e2eutil import check

SRC = os.environ.get("TW_SOURCE_DIR")
BIN = os.environ.get("TW_BIN")


def main():
    if not (SRC and BIN):
        print("TW_SOURCE_DIR/TW_BIN not set: skipped")
        return 77
    if os.environ.get("TW_SANITIZED"):
        print("sanitized build: QGIS cannot load an ASan library; skipped")
        return 77
    qp = shutil.which("qgis_process")
    if not qp:
        print("qgis_process not installed (Debian: qgis, python3-qgis; scripts/setup.sh): skipped")
        return 77
    build = os.path.dirname(BIN)
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "prefix")
        subprocess.run(["cmake", "--install", build, "--prefix", prefix], check=True,
                       capture_output=True)
        plugins = os.path.join(prefix, "share", "tilewise", "qgis")
        home = os.path.join(tmp, "home")
        ini = os.path.join(home, ".local/share/QGIS/QGIS3/profiles/default/QGIS/QGIS3.ini")
        os.makedirs(os.path.dirname(ini))
        with open(ini, "w") as f:
            f.write("[PythonPlugins]\ntilewise_provider=true\n")
        env = dict(os.environ, HOME=home, QT_QPA_PLATFORM="offscreen", QGIS_PLUGINPATH=plugins,
                   XDG_RUNTIME_DIR=os.path.join(tmp, "xdg"), PYTHONDONTWRITEBYTECODE="1")
        os.makedirs(env["XDG_RUNTIME_DIR"], mode=0o700)
        env.pop("TILEWISE_LIBRARY", None)  # the installed package finds its own library

        def qgis_process(*args):
            r = subprocess.run([qp, *args], capture_output=True, text=True, env=env, cwd=tmp)
            if "--noversioncheck not known" in r.stdout + r.stderr and os.path.exists(qp + ".bin"):
                r = subprocess.run([qp + ".bin", *args], capture_output=True, text=True, env=env,
                                   cwd=tmp)
            return r

        r = qgis_process("list")
        check("tilewise:classify" in r.stdout and "tilewise:run_workflow" in r.stdout,
              f"qgis_process list shows the provider ({r.stdout[-300:]} {r.stderr[-500:]})",
              say_ok=True)

        # The CLI on the workflow tilewise:classify builds, then qgis_process.
        # A copy, in a folder of its own: anything written beside it shows.
        os.makedirs(os.path.join(tmp, "in"))
        sample = os.path.join(tmp, "in", "L7_ETMs.tif")
        shutil.copy(os.path.join(SRC, "sample_data", "L7_ETMs.tif"), sample)
        model = os.path.join(SRC, "sample_data", "demo_resnet18.h5")
        out = os.path.join(tmp, "out")
        wf = os.path.join(tmp, "classify.yaml")
        with open(wf, "w") as f:
            json.dump({"input": {"path": [sample]}, "model": {"weights": model},
                       "tiling": {"stride": 32}, "runtime": {"device": "cpu", "precision": "fp32"},
                       "output": {"dir": out, "products": ["class", "prob"]}}, f)
        subprocess.run([BIN, "run", wf, "-q"], check=True, cwd=tmp)
        want = {n: open(os.path.join(out, n), "rb").read()
                for n in ("L7_ETMs.class.tif", "L7_ETMs.prob.tif")}
        shutil.rmtree(out)
        r = qgis_process("run", "tilewise:classify", "--", f"INPUT={sample}", f"MODEL={model}",
                         "STRIDE=32", "DEVICE=1", "PRECISION=0", "PRODUCTS=0,1",
                         f"OUTPUT_FOLDER={out}")
        check(r.returncode == 0, f"qgis_process run tilewise:classify ({r.stdout[-800:]} {r.stderr[-800:]})")
        check(f"CLASS:\t{out}/L7_ETMs.class.tif" in r.stdout, "CLASS output reported")
        # Loading a multiband raster as a layer computes its statistics, which
        # GDAL saved as INPUT.aux.xml beside the user's file (issue 29).
        beside = sorted(os.listdir(os.path.dirname(sample)))
        check(beside == ["L7_ETMs.tif"], f"nothing written beside INPUT ({beside})", say_ok=True)
        for name, data in want.items():
            got = open(os.path.join(out, name), "rb").read()
            check(got == data, f"qgis_process wrote the CLI's {name} ({len(data)} bytes)", say_ok=True)

        # BANDS, SCALE, MEAN, STD and the embedding raster: the CLI's bytes for
        # the workflow that says the same.
        norm = {"bands": [6, 5, 4, 3, 2, 1], "scale": 0.5,
                "mean": [20.0, 22.5, 25.0, 27.5, 30.0, 32.5], "std": [9.0, 8.0, 7.0, 6.0, 5.0, 4.0]}
        out4 = os.path.join(tmp, "out4")
        with open(wf, "w") as f:
            json.dump({"input": {"path": [sample], "bands": norm["bands"], "scale": norm["scale"]},
                       "model": {"weights": model, "mean": norm["mean"], "std": norm["std"]},
                       "tiling": {"stride": 32}, "runtime": {"device": "cpu", "precision": "fp32"},
                       "output": {"dir": out4, "products": ["class", "embedding_raster"]}}, f)
        subprocess.run([BIN, "run", wf, "-q"], check=True, cwd=tmp)
        want4 = {n: open(os.path.join(out4, n), "rb").read()
                 for n in ("L7_ETMs.class.tif", "L7_ETMs.emb.tif")}
        shutil.rmtree(out4)
        join = lambda v: ",".join(str(x) for x in v)  # noqa: E731
        r = qgis_process("run", "tilewise:classify", "--", f"INPUT={sample}", f"MODEL={model}",
                         "STRIDE=32", "DEVICE=1", "PRECISION=0", "PRODUCTS=0,7",
                         f"BANDS={join(norm['bands'])}", f"SCALE={norm['scale']}",
                         f"MEAN={join(norm['mean'])}", f"STD={join(norm['std'])}",
                         f"OUTPUT_FOLDER={out4}")
        check(r.returncode == 0, f"tilewise:classify with BANDS/SCALE/MEAN/STD ({r.stderr[-800:]})")
        check(f"EMBEDDING_RASTER:\t{out4}/L7_ETMs.emb.tif" in r.stdout,
              "EMBEDDING_RASTER output reported")
        for name, data in want4.items():
            got = open(os.path.join(out4, name), "rb").read()
            check(got == data, f"BANDS/SCALE/MEAN/STD: the CLI's {name}", say_ok=True)
        r = qgis_process("run", "tilewise:classify", "--", f"INPUT={sample}", f"MODEL={model}",
                         "DEVICE=1", "MEAN=1,x", f"OUTPUT_FOLDER={out4}")
        check(r.returncode != 0 and "MEAN: expected numbers separated by commas, got '1,x'" in
              r.stdout + r.stderr, "a bad MEAN is refused naming it")

        # Cancel and resume, layers, warnings: PyQGIS.
        out2 = os.path.join(tmp, "out2")
        subprocess.run([BIN, "run", "workflows/sample.yaml", "-q", "--chunk-rows", "1",
                        "--set", f"output.dir={out2}", "--set", "tiling.batch=4",
                        "--set", "runtime.device=cpu"], check=True, cwd=SRC)
        want2 = open(os.path.join(out2, "L7_ETMs.class.tif"), "rb").read()
        shutil.rmtree(out2)
        r = subprocess.run([sys.executable, os.path.join(SRC, "tests/qgis/drive_provider.py"),
                            "workflows/sample.yaml", out2, os.path.join(tmp, "out3")],
                           capture_output=True, text=True, env=env, cwd=SRC)
        check(r.returncode == 0, f"drive_provider.py ({r.stderr[-1500:]})")
        res = json.loads(r.stdout.strip().splitlines()[-1])
        print(json.dumps(res, indent=1)[:3000])
        check(res["cancelled"] and "commit point" in res["cancelled"], "Cancel raised at a commit point",
              say_ok=True)
        check(res["first_status"] == "interrupted", "the cancelled run's report says interrupted")
        check(res["second_status"] == "ok" and res["rows_resumed"] > 0,
              f"the rerun resumed {res['rows_resumed']} rows", say_ok=True)
        n = res["tiles_total"]
        check(res["last_progress_text"] == f"L7_ETMs.tif: {n}/{n} tiles",
              f"the dialog's text counts the rerun's tiles ({res['last_progress_text']})",
              say_ok=True)
        got = open(os.path.join(out2, "L7_ETMs.class.tif"), "rb").read()
        check(got == want2, "the resumed class raster has the uninterrupted CLI run's bytes", say_ok=True)
        cls = res["layers"].get("L7_ETMs.class.tif", {})
        check(cls.get("classes") == [[0.0, "water", "#0072bd"], [1.0, "dense_vegetation", "#228b22"],
                                     [2.0, "sparse_vegetation", "#e69f00"],
                                     [3.0, "bare_or_built", "#cc2529"]],
              f"class layer: the four classes with names and colours ({cls})", say_ok=True)
        prob = res["layers"].get("L7_ETMs.prob.tif", {})
        check(prob.get("bands", [""])[0].endswith("water") and len(prob["bands"]) == 4,
              f"prob layer band names ({prob})", say_ok=True)
        check(any("is input.scale 1 meant" in w for w in res["scale_warnings"]),
              f"validate's warnings pushed ({res['scale_warnings'][:2]})", say_ok=True)
    print("e2e_qgis: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
