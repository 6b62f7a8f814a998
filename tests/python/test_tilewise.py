"""pytest tests of the Python package (python/tilewise) over libtilewise.so.

ctest runs them (py_tilewise) with TILEWISE_LIBRARY = the build's library,
PYTHONPATH = python/, and the fixtures of tests/fixtures. What they show:
* tilewise.run writes the bytes `tilewise run` writes (file, YAML text, dict);
* Model.classify on numpy tiles equals the CLI's probabilities (tile table,
  <= 1e-6) and PyTorch's (<= 1e-4), for several pixel types, and an image
  classified whole equals the CLI's prob.tif at stride < tile;
* bad input raises tilewise.Error with the message and the exit class;
* KeyboardInterrupt mid-run stops at a commit point; run again resumes and
  gives the bytes of an uninterrupted run;
* validate gives the CLI's text and its warnings as a list;
* info gives `tilewise info --json`'s dict; __version__ is the library's;
* errors are tilewise.Error and the built-in exception that fits
  (FileNotFoundError, ValueError, OSError, MemoryError); classify refuses a
  tile size or band count the model does not take; a .pth gets the export
  hint from Model, info and `tilewise info`;
* the tiles callback counts up to run.json's tiles_total; shards run with
  run.shard and tilewise.merge gives the CLI's merged bytes.
"""
import _thread
import glob
import json
import os
import shutil
import subprocess
import time

import numpy as np
import pytest

SRC = os.environ.get("TW_SOURCE_DIR", "")
BIN = os.environ.get("TW_BIN", "")
FIX = os.environ.get("TW_FIXTURES", "")
MEAN = [79.0, 67.5, 64.4, 60.0, 80.0, 60.0]
STD = [14.7, 16.4, 21.6, 15.0, 25.0, 20.0]

pytestmark = [
    pytest.mark.skipif(not (SRC and BIN and FIX), reason="run by ctest (TW_* variables)"),
    pytest.mark.skipif(bool(os.environ.get("TW_SANITIZED")),
                       reason="an ASan library cannot be loaded into an uninstrumented python3"),
]

tilewise = pytest.importorskip("tilewise")
SAMPLE = os.path.join(SRC, "sample_data", "L7_ETMs.tif")


def cli(*args, cwd=None):
    r = subprocess.run([BIN, *args], capture_output=True, text=True, cwd=cwd or SRC)
    assert r.returncode == 0, r.stderr
    return r


def tifs(d):
    return {os.path.basename(p): open(p, "rb").read() for p in sorted(glob.glob(d + "/*.tif"))}


def fixture_workflow(out, tile=64, stride=64, products="[prob, tiles]"):
    return f"""input:
  path: {SAMPLE}
model:
  weights: {FIX}/resnet18_6b_7c.safetensors
  mean: {MEAN}
  std: {STD}
tiling:
  tile: {tile}
  stride: {stride}
runtime:
  device: cpu
  memory: 1GiB
output:
  dir: {out}
  products: {products}
"""


def test_two_runs_on_two_threads(tmp_path):
    """Two workflows at once on two Python threads (ctypes lets the GIL go):
    each writes the bytes it writes alone, and its report's allocator
    figures are its own (issue 28.5)."""
    import threading
    flows = {"a": dict(stride=32, products="[class, prob]"),
             "b": dict(stride=64, products="[class, confidence]")}
    batch = {"a": 4, "b": 2}

    def flow(k, out):
        return fixture_workflow(out, **flows[k]).replace(
            "tiling:\n", f"tiling:\n  batch: {batch[k]}\n")
    alone, together = {}, {}
    for k in flows:
        out = str(tmp_path / f"seq_{k}")
        alone[k] = (out, tilewise.run(flow(k, out)))
    threads = []
    for k in flows:
        out = str(tmp_path / f"par_{k}")

        def go(k=k, out=out):
            together[k] = (out, tilewise.run(flow(k, out)))
        threads.append(threading.Thread(target=go))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in flows:
        (a_out, a_rep), (p_out, p_rep) = alone[k], together[k]
        assert tifs(a_out) == tifs(p_out) and len(tifs(a_out)) == 2, k
        for tag in ("weights", "slots", "workspace", "strip", "read"):
            assert (a_rep["memory"]["allocator_peak"][tag] ==
                    p_rep["memory"]["allocator_peak"][tag]), (k, tag)
        assert p_rep["inputs"][0]["steady_state_allocs"] == 0
    assert (together["a"][1]["memory"]["allocator_peak"]["slots"] !=
            together["b"][1]["memory"]["allocator_peak"]["slots"])


def test_two_runs_into_one_folder_on_two_threads(tmp_path):
    """Two threads run the same workflow into one folder with different
    model.weights (issue 39.2): the second is refused as a second process is
    (LockedError, exit 7, the holder named), the first's products are its
    own bytes. Before: the lock was a process's POSIX record lock, the second
    thread took it again; one run failed renaming the other's chunk (exit 4)
    and the other's products mixed both models."""
    import threading
    out = str(tmp_path / "out")
    wf_a = fixture_workflow(out, products="[class, prob]")
    wf_b = wf_a.replace(f"{FIX}/resnet18_6b_7c.safetensors",
                        os.path.join(SRC, "sample_data", "demo_resnet18.h5"))
    sets = {"run.chunk_rows": 2}
    tilewise.run(wf_a, sets)
    want = tifs(out)
    shutil.rmtree(out)
    a_running, b_done, got = threading.Event(), threading.Event(), {}

    def hold(fraction, message):  # called once A holds the folder
        a_running.set()
        b_done.wait(300)

    def go_a():
        got["a"] = tilewise.run(wf_a, sets, progress=hold)
    t = threading.Thread(target=go_a)
    t.start()
    try:
        assert a_running.wait(300)
        with pytest.raises(tilewise.LockedError) as e:
            tilewise.run(wf_b, sets)
    finally:
        b_done.set()
        t.join()
    assert e.value.exit_code == 7 and e.value.exit_class == "locked"
    assert f"is being run by process {os.getpid()} on host" in str(e.value)
    assert got["a"]["status"] == "ok"
    assert tifs(out) == want
    assert json.load(open(os.path.join(out, "run.json")))["status"] == "ok"


def test_budget_is_the_runs_own(tmp_path):
    """runtime.memory is the run's budget, not the host process's (issue
    40.2): a Python process that holds ~600 MiB runs the sample workflow with
    runtime.memory 512MiB (which the CLI fits) with the CLI's auto batch.
    Before, the process's RSS counted as the run's base: refused (exit 4)."""
    os.chdir(SRC)
    sets = {"runtime.device": "cpu", "runtime.memory": "512MiB", "tiling.batch": "auto"}
    flags = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    cli_out = str(tmp_path / "cli")
    cli("run", "workflows/sample.yaml", "-q", "--set", f"output.dir={cli_out}", *flags)
    with open(os.path.join(cli_out, "run.json")) as f:
        want = json.load(f)["memory"]["batch"]
    held = np.ones(600 << 20, dtype=np.uint8)  # written: resident
    out = str(tmp_path / "lib")
    rep = tilewise.run("workflows/sample.yaml", overrides=dict(sets, **{"output.dir": out}))
    assert held[-1] == 1
    with open(os.path.join(out, "run.json")) as f:
        got = json.load(f)["memory"]
    assert rep["status"] == "ok" and got["batch"] == want, (got, want)
    assert got["items"]["base"] == 40 << 20  # the run's own base, not the process's size


def test_run_gives_the_cli_bytes(tmp_path):
    out = str(tmp_path / "out")
    sets = {"output.dir": out, "runtime.device": "cpu"}
    cli("run", "workflows/sample.yaml", "-q", *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")])
    want = tifs(out)
    assert len(want) == 3
    shutil.rmtree(out)
    os.chdir(SRC)  # the workflow's paths are relative, as for the CLI
    seen = []
    rep = tilewise.run("workflows/sample.yaml", overrides=sets,
                       progress=lambda f, m: seen.append(f))
    assert tifs(out) == want
    assert rep["status"] == "ok" and rep["inputs"][0]["tiles_classified"] == 100
    assert seen and seen[-1] == 1.0
    # The same workflow as YAML text and as a dict: the same rasters.
    text = open("workflows/sample.yaml").read()
    for wf in (text, {"input": {"path": "sample_data/L7_ETMs.tif", "bands": [1, 2, 3, 4, 5, 6]},
                      "model": {"weights": "sample_data/demo_resnet18.h5"},
                      "tiling": {"tile": 64, "stride": 32, "batch": "auto", "edge": "pad"},
                      "runtime": {"device": "auto", "memory": "512MiB"},
                      "output": {"dir": "out/sample", "products": ["class", "prob", "confidence"]}}):
        shutil.rmtree(out)
        tilewise.run(wf, overrides=sets)
        assert tifs(out) == want


def torch_probs(tiles):
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(num_classes=7)
    model.conv1 = torch.nn.Conv2d(6, 64, 7, 2, 3, bias=False)
    model.load_state_dict(torch.load(os.path.join(FIX, "resnet18_6b_7c.pth")))
    model = model.double().eval()
    with torch.no_grad():
        return torch.softmax(model(torch.from_numpy(tiles).double()), dim=1).numpy()


def sample_image():
    from osgeo import gdal
    return gdal.Open(SAMPLE).ReadAsArray()  # (6, 352, 349) uint8


def test_classify_equals_cli_and_pytorch(tmp_path):
    h5py = pytest.importorskip("h5py")
    out = str(tmp_path / "out")
    wf = tmp_path / "wf.yaml"
    wf.write_text(fixture_workflow(out))
    cli("run", str(wf), "-q")
    with h5py.File(os.path.join(out, "L7_ETMs.tiles.h5"), "r") as h:
        origin, table = h["origin"][:], h["probabilities"][:]
    img = sample_image()
    H, W = img.shape[1:]
    T = 64
    # The tiles the run read: pad mode, outside pixels marked 2 (padding).
    pad = np.zeros((6, H + T, W + T), img.dtype)
    pad[:, :H, :W] = img
    inside = np.full((H + T, W + T), 2, np.uint8)
    inside[:H, :W] = 1
    tiles = np.stack([pad[:, r:r + T, c:c + T] for r, c in origin])
    valid = np.stack([inside[r:r + T, c:c + T] for r, c in origin])
    m = tilewise.Model(os.path.join(FIX, "resnet18_6b_7c.safetensors"),
                       {"model.mean": MEAN, "model.std": STD, "runtime.device": "cpu"})
    info = m.info
    assert info["n_classes"] == 7 and info["in_bands"] == 6 and info["tile"] == 64
    probs, emb = m.classify(tiles, valid=valid, embeddings=True)
    assert probs.shape == (len(origin), 7) and emb.shape == (len(origin), info["feature_dim"])
    d_cli = np.abs(probs - table).max()
    assert d_cli <= 1e-6, d_cli
    # PyTorch: padding is 0 after normalization.
    norm = (tiles.astype(np.float64) - np.array(MEAN)[:, None, None]) / np.array(STD)[:, None, None]
    norm *= valid[:, None] == 1
    d_torch = np.abs(probs - torch_probs(norm)).max()
    assert d_torch <= 1e-4, d_torch
    print(f"classify vs CLI {d_cli:.1e}, vs PyTorch {d_torch:.1e}")
    # Any GDAL pixel type: the same numbers from the same values.
    for dt in (np.uint16, np.int16, np.int32, np.uint32, np.float32, np.float64, np.int8):
        t = tiles.astype(dt) if dt != np.int8 else (tiles // 2).astype(np.int8)
        ref = probs if dt != np.int8 else m.classify(tiles // 2, valid=valid)
        got = m.classify(t, valid=valid)
        assert np.abs(got - ref).max() <= 1e-6, dt


def test_classify_image_equals_prob_tif(tmp_path):
    out = str(tmp_path / "out")
    wf = tmp_path / "wf.yaml"
    wf.write_text(fixture_workflow(out, stride=32, products="[prob]"))
    cli("run", str(wf), "-q")
    from osgeo import gdal
    want = gdal.Open(os.path.join(out, "L7_ETMs.prob.tif")).ReadAsArray()
    m = tilewise.Model(os.path.join(FIX, "resnet18_6b_7c.safetensors"),
                       {"model.mean": MEAN, "model.std": STD, "runtime.device": "cpu",
                        "runtime.memory": "256MiB"})
    got = m.classify(sample_image(), stride=32)
    assert got.shape == want.shape == (7, 11, 11)
    assert np.abs(got - want).max() <= 1e-6


def _reference_image_probs(m, a, stride, nodata=None, valid=None):
    """An independent numpy reference of tiling.edge pad + the stitcher's
    averaging (the code Model.classify had before it went through the
    library's plan.c/stitch.c): tiles cut here, classified as tiles, their
    probabilities averaged in float32 in raster order."""
    t = m.info["tile"]
    s = stride
    bands, h, w = a.shape
    n_tiles = lambda n: 1 if n <= t else -(-(n - t) // s) + 1  # noqa: E731
    ny, nx = n_tiles(h), n_tiles(w)
    gh, gw = -(-h // s), -(-w // s)
    ph, pw = max((ny - 1) * s + t, h), max((nx - 1) * s + t, w)
    pad = np.zeros((bands, ph, pw), a.dtype)
    pad[:, :h, :w] = a
    vm = np.full((ph, pw), 2, np.uint8)
    vm[:h, :w] = 1 if valid is None else (valid != 0)
    tiles = np.stack([pad[:, i * s:i * s + t, j * s:j * s + t]
                      for i in range(ny) for j in range(nx)])
    vt = np.stack([vm[i * s:i * s + t, j * s:j * s + t] for i in range(ny) for j in range(nx)])
    probs = m.classify_tiles(tiles, nodata=nodata, valid=vt)
    k, c = probs.shape[1], t // s
    acc = np.zeros((gh, gw, k), np.float32)
    cnt = np.zeros((gh, gw), np.uint32)
    for i in range(ny):
        for j in range(nx):
            p = probs[i * nx + j]
            if not np.isnan(p[0]):
                acc[i:i + c, j:j + c] += p
                cnt[i:i + c, j:j + c] += 1
    out = np.full((gh, gw, k), np.nan, np.float32)
    out[cnt == 1] = acc[cnt == 1]
    many = cnt > 1
    out[many] = acc[many] * (np.float32(1) / cnt[many].astype(np.float32))[:, None]
    return out.transpose(2, 0, 1)


def test_classify_image_through_the_library_plan_and_stitcher():
    """Model.classify((bands, H, W)) goes through tilewise_model_classify_image
    (the run's plan.c and stitch.c, API version 4): equal to an independent
    numpy tiling + averaging, with a nodata block, a validity mask, strides
    1/2 and 1/4 of the tile and sizes that are not multiples of the stride."""
    m = tilewise.Model(os.path.join(SRC, "sample_data", "demo_resnet18.h5"),
                       {"runtime.device": "cpu", "runtime.memory": "256MiB"})
    a = sample_image()[:, :150, :133].copy()
    a[:, 20:120, 10:90] = 0  # whole tiles of nodata, and tiles above max_nodata_fraction
    valid = np.ones(a.shape[1:], np.uint8)
    valid[130:, 100:] = 0
    for stride, nodata, v in ((32, 0, None), (16, 0, valid), (64, None, valid)):
        got = m.classify(a, stride=stride, nodata=nodata, valid=v)
        want = _reference_image_probs(m, a, stride, nodata, v)
        assert got.shape == want.shape
        assert np.array_equal(np.isnan(got), np.isnan(want)), stride
        assert np.isnan(got).any() or nodata is None
        assert np.nanmax(np.abs(got - want)) <= 1e-6, stride
    with pytest.raises(tilewise.Error) as e:
        m.classify(a, stride=24)
    assert "does not divide" in e.value.message and e.value.exit_class == "usage"


def test_nodata_tiles_are_nan():
    m = tilewise.Model(os.path.join(SRC, "sample_data", "demo_resnet18.h5"),
                       {"runtime.device": "cpu"})
    tiles = np.full((3, 6, 64, 64), 80, np.uint8)
    tiles[1] = 0                 # all nodata
    tiles[2, :, :40, :] = 0      # 62 % nodata > max_nodata_fraction 0.5
    p = m.classify(tiles, nodata=0)
    assert np.isfinite(p[0]).all() and abs(p[0].sum() - 1) < 1e-5
    assert np.isnan(p[1]).all() and np.isnan(p[2]).all()


def test_bad_input_raises_with_the_message(tmp_path):
    with pytest.raises(tilewise.Error) as e:
        tilewise.Model(str(tmp_path / "missing.h5"))
    assert e.value.exit_class == "input" and e.value.exit_code == 3
    assert "missing.h5" in e.value.message
    m = tilewise.Model(os.path.join(SRC, "sample_data", "demo_resnet18.h5"), {"runtime.device": "cpu"})
    with pytest.raises(tilewise.Error) as e:
        m.classify(np.zeros((1, 3, 64, 64), np.uint8))
    assert "expects 6 input bands but the tiles have 3" in e.value.message
    assert e.value.exit_class == "usage"
    with pytest.raises(tilewise.Error) as e:
        m.classify(np.zeros((1, 6, 64, 64), np.complex64))
    assert "not supported" in e.value.message
    with pytest.raises(tilewise.Error) as e:
        tilewise.Model(os.path.join(SRC, "sample_data", "demo_resnet18.h5"), {"tiling.tiles": 3})
    assert "tiling.tiles" in e.value.message and e.value.exit_code == 2
    os.chdir(SRC)
    with pytest.raises(tilewise.Error) as e:
        tilewise.run("workflows/sample.yaml", {"tiling.stride": 33, "output.dir": str(tmp_path)})
    assert e.value.exit_class == "usage" and "tiling.stride" in e.value.message
    assert "does not divide tile 64" in str(e.value)
    with pytest.raises(tilewise.Error) as e:
        tilewise.run(str(tmp_path / "nope.yaml"))
    assert "nope.yaml" in e.value.message


def test_info_is_the_cli_json():
    """tilewise.info gives the dict `tilewise info --json` prints (the same C
    function), for rasters and models alike."""
    for path in (SAMPLE, os.path.join(FIX, "rast_int16_tiled_nodata.tif"),
                 os.path.join(SRC, "sample_data", "demo_resnet18.h5"),
                 os.path.join(FIX, "resnet18_6b_7c.safetensors")):
        want = json.loads(cli("info", "--json", path).stdout)
        assert tilewise.info(path) == want, path
    r = tilewise.info(SAMPLE)
    assert r["type"] == "raster" and r["crs"].startswith("EPSG:31985")
    assert (r["width"], r["height"], r["band_count"]) == (349, 352, 6)
    d = tilewise.info(os.path.join(SRC, "sample_data", "demo_resnet18.h5"))
    assert d["type"] == "model" and d["classes"][0] == "water" and d["arch"] == "resnet18"
    with pytest.raises(tilewise.InputError) as e:
        tilewise.info(os.path.join(FIX, "not_a_raster.txt"))
    assert isinstance(e.value, ValueError) and "not_a_raster.txt" in e.value.message


def test_model_facts_one_shape():
    """The model's facts have one shape and one name each (issue 35): what
    `tilewise info --json` says of a model file and what Model(path).info
    says agree on each shared fact; info keeps "features" beside
    "feature_dim"."""
    for name in ("demo_resnet18.h5", "demo_resnet50.h5"):
        path = os.path.join(SRC, "sample_data", name)
        d = tilewise.info(path)
        m = tilewise.Model(path, {"runtime.device": "cpu"}).info
        for k in ("arch", "stem", "in_bands", "feature_dim", "head", "sha256"):
            assert k in d and k in m and d[k] == m[k], (name, k, d.get(k), m.get(k))
        assert d["features"] == d["feature_dim"] == m["feature_dim"] > 0
        assert "feat_dim" not in d and "feat_dim" not in m


def test_version():
    v = subprocess.run([BIN, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    assert tilewise.__version__ == tilewise.version() == v.split()[1]
    assert tilewise.__version__.count(".") == 2


def test_errors_are_builtin_exceptions(tmp_path):
    """Each failure is a tilewise.Error and the built-in exception it is:
    a missing file FileNotFoundError, a workflow or argument error
    ValueError, a resource failure OSError (memory: MemoryError)."""
    import errno
    os.chdir(SRC)
    missing = str(tmp_path / "missing.h5")
    for call in (lambda: tilewise.Model(missing), lambda: tilewise.info(missing)):
        with pytest.raises(FileNotFoundError) as e:
            call()
        assert isinstance(e.value, tilewise.Error) and e.value.errno == errno.ENOENT
        assert e.value.filename == missing and "missing.h5" in str(e.value)
    with pytest.raises(FileNotFoundError) as e:
        tilewise.run(str(tmp_path / "nope.yaml"))
    assert isinstance(e.value, tilewise.ConfigError) and e.value.exit_code == 2
    sets = {"output.dir": str(tmp_path / "out"), "runtime.device": "cpu"}
    with pytest.raises(FileNotFoundError) as e:
        tilewise.run("workflows/sample.yaml", dict(sets, **{"input.path": str(tmp_path / "no.tif")}))
    assert isinstance(e.value, tilewise.InputError) and e.value.exit_code == 3
    with pytest.raises(ValueError) as e:
        tilewise.run("workflows/sample.yaml", dict(sets, **{"tiling.stride": 33}))
    assert isinstance(e.value, tilewise.ConfigError) and e.value.exit_class == "usage"
    with pytest.raises(ValueError) as e:
        tilewise.Model(os.path.join(FIX, "bad_missing_fc.safetensors"))
    assert isinstance(e.value, tilewise.ModelError) and e.value.exit_code == 3
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(OSError) as e:
        tilewise.run("workflows/sample.yaml", dict(sets, **{"output.dir": str(afile)}))
    assert isinstance(e.value, tilewise.ResourceError) and not isinstance(e.value, ValueError)
    assert e.value.exit_code == 4 and "afile" in e.value.message
    with pytest.raises(MemoryError) as e:
        tilewise.run("workflows/sample.yaml",
                     dict(sets, **{"runtime.memory": "16MiB", "tiling.batch": 64}))
    assert isinstance(e.value, tilewise.ResourceError) and e.value.exit_code == 4
    # Every one is still a tilewise.Error, with the CLI's status text.
    with pytest.raises(tilewise.Error) as e:
        tilewise.Model(missing)
    assert str(e.value).startswith(e.value.status + ": ")


def test_classify_checks_the_tile(tmp_path):
    m = tilewise.Model(os.path.join(SRC, "sample_data", "demo_resnet18.h5"), {"runtime.device": "cpu"})
    with pytest.raises(ValueError) as e:
        m.classify(np.zeros((2, 6, 32, 32), np.uint8))
    assert "32 x 32" in str(e.value) and "64 x 64" in str(e.value) and "tiling.tile" in str(e.value)
    assert isinstance(e.value, tilewise.Error)
    for shape in ((1, 3, 64, 64), (3, 100, 100)):
        with pytest.raises(ValueError) as e:
            m.classify(np.zeros(shape, np.uint8))
        assert "expects 6 input bands but" in str(e.value) and "have 3" in str(e.value)
    # Opened for 32 px tiles, it takes them.
    m32 = tilewise.Model(os.path.join(SRC, "sample_data", "demo_resnet18.h5"),
                         {"runtime.device": "cpu", "tiling.tile": 32})
    p = m32.classify(np.full((2, 6, 32, 32), 80, np.uint8))
    assert p.shape == (2, 4) and np.allclose(p.sum(axis=1), 1, atol=1e-5)


def test_pytorch_checkpoint_gets_the_export_hint():
    """A .pth given to Model, info and `tilewise info` gets the hint `run` gives."""
    pth = os.path.join(FIX, "resnet18_6b_7c.pth")
    if not os.path.exists(pth):
        pytest.skip("no PyTorch fixture (python3-torch missing)")
    for call in (lambda: tilewise.Model(pth), lambda: tilewise.info(pth)):
        with pytest.raises(tilewise.ModelError) as e:
            call()
        assert "tools/export_model.py" in e.value.message and isinstance(e.value, ValueError)
    r = subprocess.run([BIN, "info", pth], capture_output=True, text=True)
    assert r.returncode == 3 and "tools/export_model.py" in r.stderr, r.stderr


def test_keyboard_interrupt_then_rerun_completes(tmp_path):
    os.chdir(SRC)
    out = str(tmp_path / "out")
    sets = {"output.dir": out, "runtime.device": "cpu", "runtime.memory": "4GiB", "tiling.batch": 4,
            "run.chunk_rows": 1}
    cli("run", "workflows/sample.yaml", "-q", "--chunk-rows", "1",
        *[a for k, v in sets.items() if not k.startswith("run.") for a in ("--set", f"{k}={v}")])
    want = tifs(out)
    shutil.rmtree(out)
    fired = []

    def progress(fraction, message):
        if fraction > 0.3 and not fired:
            fired.append(fraction)
            _thread.interrupt_main()  # what Ctrl-C does
            time.sleep(0.5)           # the main thread sees it before this batch returns

    with pytest.raises(KeyboardInterrupt):
        tilewise.run("workflows/sample.yaml", sets, progress=progress)
    # an interrupted attempt reports in run.failed.json: run.json belongs to a run that finished
    assert not os.path.exists(os.path.join(out, "run.json"))
    rep = json.load(open(os.path.join(out, "run.failed.json")))
    assert rep["status"] == "interrupted" and rep["exit_code"] == 75
    assert not glob.glob(out + "/*.tif"), "nothing under a final name"
    rep = tilewise.run("workflows/sample.yaml", sets)
    assert rep["inputs"][0]["rows_resumed"] > 0
    assert tifs(out) == want


def test_tiles_callback_shards_and_merge(tmp_path):
    os.chdir(SRC)
    out = str(tmp_path / "out")
    sets = {"output.dir": out, "runtime.device": "cpu", "runtime.memory": "4GiB"}
    flags = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    for shard in ("1/2", "2/2"):
        cli("run", "workflows/sample.yaml", "-q", "--shard", shard, *flags)
    cli("merge", "-q", out)
    want = tifs(out)
    assert len(want) == 3
    shutil.rmtree(out)

    seen = []
    rep = tilewise.run("workflows/sample.yaml", dict(sets, **{"run.shard": "1/2"}),
                       tiles=lambda done, total, name: seen.append((done, total, name)))
    total = rep["inputs"][0]["tiles_total"]
    assert rep["shard"] == {"index": 1, "count": 2} and 0 < total < 100
    assert seen[0][0] == 0 and seen[-1][:2] == (total, total) and "L7_ETMs.tif" in seen[-1][2]
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))
    with pytest.raises(tilewise.Error) as e:
        tilewise.merge(out)  # shard 2 has not run
    assert e.value.exit_class == "input" and "rows" in e.value.message
    tilewise.run("workflows/sample.yaml", dict(sets, **{"run.shard": "2/2"}))
    merged = tilewise.merge(out)
    assert [os.path.basename(p) for p in merged[0]["outputs"]] == [
        "L7_ETMs.class.tif", "L7_ETMs.prob.tif", "L7_ETMs.conf.tif"]
    assert tifs(out) == want
    with pytest.raises(tilewise.Error) as e:
        tilewise.run("workflows/sample.yaml", dict(sets, **{"run.shard": "3/2"}))
    assert e.value.exit_class == "usage" and "run.shard" in e.value.message


def test_validate_gives_the_cli_text_and_warnings(tmp_path):
    os.chdir(SRC)
    sets = {"output.dir": str(tmp_path / "out"), "input.scale": 0.001, "runtime.memory": "4GiB"}
    flags = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    want = cli("validate", "workflows/sample.yaml", *flags).stdout
    got = tilewise.validate("workflows/sample.yaml", sets)

    def steady(text):  # the memory lines hold the process's own size
        return [l for l in text.splitlines() if not l.startswith(("memory", "          worst"))]

    assert steady(got["text"]) == steady(want) and len(steady(want)) > 5
    assert len(got["warnings"]) == 6 and all("is input.scale 1 meant" in w for w in got["warnings"])
    assert got["text"].endswith("advice    6 warnings\n")
    # The plan as data (API version 4): what the text says, as numbers.
    assert got["codes"] == ["values"] * 6
    plan = got["plan"]
    assert plan["planned"] == 1 and plan["backend"] in ("cpu", "cuda") and plan["tile"] == 64
    assert f"\nbatch     {plan['batch']} tiles, {plan['slots']} slots of " in got["text"]
    assert plan["estimate_bytes"] <= plan["worst_bytes"] <= plan["memory_bytes"] == 4 << 30
    (inp,) = plan["inputs"]
    assert inp["path"].endswith("L7_ETMs.tif") and inp["skipped"] == "" and inp["aoi_tiles"] == -1
    assert (f"{inp['width']} x {inp['height']}, {inp['bands']} bands {inp['dtype']}; tiles "
            f"{inp['tiles_x']} x {inp['tiles_y']} = {inp['tiles']} ") in got["text"]
    with pytest.raises(tilewise.Error) as e:
        tilewise.validate("workflows/sample.yaml", {"tiling.stride": 33})
    assert e.value.exit_class == "usage" and "tiling.stride" in e.value.message


def test_run_gives_validate_advice_and_strict_refuses(tmp_path):
    """run lists validate's advice in its report; run.strict=true makes it a ValueError
    (ConfigError, exit 2) before the first tile (issue 29.1)."""
    os.chdir(SRC)
    sets = {"output.dir": str(tmp_path / "out"), "runtime.device": "cpu", "input.scale": 100,
            "runtime.memory": "4GiB"}
    rep = tilewise.run("workflows/sample.yaml", sets)
    assert [w["code"] for w in rep["warnings"]] == ["values"] * 6, rep["warnings"]
    with pytest.raises(ValueError) as e:
        tilewise.run("workflows/sample.yaml", dict(sets, **{"output.dir": str(tmp_path / "s"),
                                                           "run.strict": "true"}))
    assert isinstance(e.value, tilewise.ConfigError) and e.value.exit_code == 2
    assert "--strict: 6 warnings before the first tile" in e.value.message
    assert e.value.report and len(e.value.report["warnings"]) == 6



def test_closed_model_and_nul_overrides_raise():
    """Model.info after close() raises (it gave {}), and an override holding
    a NUL is refused naming it (ctypes would cut it at the NUL) (issue 40)."""
    m = tilewise.Model(os.path.join(SRC, "sample_data", "demo_resnet18.h5"),
                       {"runtime.device": "cpu"})
    assert m.info["tile"] == 64
    m.close()
    with pytest.raises(tilewise.UsageError) as e:
        m.info
    assert "closed" in e.value.message
    for overrides in ({"output.dir": "out\0/x"}, ["output.dir=out\0/x"], [b"output.dir=out\0/x"]):
        with pytest.raises(tilewise.UsageError) as e:
            tilewise.validate(os.path.join(SRC, "workflows", "sample.yaml"), overrides)
        assert "NUL" in e.value.message and "output.dir" in e.value.message
    with pytest.raises(tilewise.UsageError) as e:
        tilewise.Model(os.path.join(SRC, "sample_data", "demo_resnet18.h5"),
                       {"runtime.device": "cpu\0x"})
    assert "NUL" in e.value.message and "runtime.device" in e.value.message
