"""tilewise for Python: run workflows and classify numpy tiles with libtilewise.

A thin ctypes layer over the public C API (include/tilewise.h); numpy is the
only dependency (Debian's python3-numpy).

    import tilewise
    report = tilewise.run("workflows/sample.yaml", overrides={"tiling.stride": 32})
    m = tilewise.Model("sample_data/demo_resnet18.h5")
    m.info["classes"]                      # ['water', 'dense_vegetation', ...]
    probs = m.classify(tiles)              # (N, bands, T, T) -> (N, K)
    grid = m.classify(image)               # (bands, H, W) -> (K, ceil(H/S), ceil(W/S))

Finding libtilewise.so (first that exists): the environment variable
TILEWISE_LIBRARY (a path to the .so); the library of the prefix this package
was installed into (written by `cmake --install` into _libpath.py); a build
folder next to the sources (TILEWISE_BUILD_DIR, else ../../build); the system
loader's search for libtilewise.so.0 (LD_LIBRARY_PATH, ldconfig).

Errors raise tilewise.Error with .message, .status (e.g. "config error"),
.exit_code and .exit_class ("usage", "input", "resource", "interrupted", ...),
the same message and exit code `tilewise run` gives. Ctrl-C during run() stops
the run at its next commit point and raises KeyboardInterrupt; run() with the
same workflow again resumes from the committed rows.
"""

import ctypes
import json
import os
import threading

import numpy as np

__all__ = ["run", "Model", "info", "Error", "library_path"]

# ---- the library ---------------------------------------------------------


def _candidates():
    env = os.environ.get("TILEWISE_LIBRARY")
    if env:
        yield env
        return
    try:
        from . import _libpath  # written by cmake --install

        yield _libpath.LIBRARY
    except ImportError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    build = os.environ.get("TILEWISE_BUILD_DIR") or os.path.join(here, "..", "..", "build")
    yield os.path.join(build, "libtilewise.so.0")
    yield "libtilewise.so.0"


_lib = None
library_path = None


def _load():
    global _lib, library_path
    if _lib is not None:
        return _lib
    tried = []
    for cand in _candidates():
        if os.sep in cand and not os.path.exists(cand):
            tried.append(cand)
            continue
        try:
            lib = ctypes.CDLL(cand)
        except OSError as e:
            tried.append(f"{cand} ({e})")
            continue
        library_path = cand
        _lib = _declare(lib)
        return _lib
    raise ImportError("libtilewise.so.0 not found; set TILEWISE_LIBRARY to its path (tried: "
                      + ", ".join(tried) + ")")


class _Error(ctypes.Structure):
    _fields_ = [("status", ctypes.c_int), ("exit_code", ctypes.c_int),
                ("exit_class", ctypes.c_char * 16), ("message", ctypes.c_char * 1024)]


class _Tiles(ctypes.Structure):
    _fields_ = [("pixels", ctypes.c_void_p), ("dtype", ctypes.c_int), ("n", ctypes.c_int),
                ("bands", ctypes.c_int), ("size", ctypes.c_int),
                ("valid", ctypes.c_void_p), ("use_nodata", ctypes.c_int),
                ("nodata", ctypes.c_double)]


_PROGRESS = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_double, ctypes.c_char_p, ctypes.c_void_p)
_LOG = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


def _declare(lib):
    P, I, S = ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p
    E = ctypes.POINTER(_Error)
    sig = {
        "tilewise_version": (S, []),
        "tilewise_status_name": (S, [I]),
        "tilewise_run_file": (I, [S, ctypes.POINTER(S), I, _PROGRESS, _LOG, P,
                                  ctypes.POINTER(P), E]),
        "tilewise_run_yaml": (I, [S, S, ctypes.c_size_t, ctypes.POINTER(S), I, _PROGRESS, _LOG,
                                  P, ctypes.POINTER(P), E]),
        "tilewise_report_json": (S, [P]),
        "tilewise_report_path": (S, [P]),
        "tilewise_report_free": (None, [P]),
        "tilewise_model_open": (I, [S, ctypes.POINTER(S), I, ctypes.POINTER(P), E]),
        "tilewise_model_close": (None, [P]),
        "tilewise_model_info_json": (S, [P]),
        "tilewise_model_classify": (I, [P, ctypes.POINTER(_Tiles), P, P, E]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    return lib


def version():
    """The library's version string."""
    return _load().tilewise_version().decode()


# ---- errors --------------------------------------------------------------


class Error(Exception):
    """A tilewise failure: .message, .status, .exit_code, .exit_class (and
    .report, the run report as a dict, when a run got that far)."""

    def __init__(self, message, status="error", exit_code=1, exit_class="internal", report=None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.exit_code = exit_code
        self.exit_class = exit_class
        self.report = report

    def __str__(self):
        return f"{self.status}: {self.message}"


def _raise(code, err, report=None):
    lib = _load()
    raise Error(err.message.decode(errors="replace"), lib.tilewise_status_name(code).decode(),
                err.exit_code, err.exit_class.decode(), report)


def _sets(overrides):
    """overrides: a dict {"tiling.stride": 32} or a list of "key.path=value"."""
    if overrides is None:
        items = []
    elif isinstance(overrides, dict):
        items = []
        for k, v in overrides.items():
            if isinstance(v, str):
                items.append(f"{k}={v}")
            else:
                items.append(f"{k}={json.dumps(v)}")
    else:
        items = [str(s) for s in overrides]
    arr = (ctypes.c_char_p * max(1, len(items)))(*[s.encode() for s in items])
    return arr, len(items)


# ---- runs ----------------------------------------------------------------


def run(workflow, overrides=None, progress=None, log=None):
    """Run a workflow; return the run report (run.json) as a dict.

    workflow: a path to a YAML file, YAML text (a str with a newline), or a
    dict (the workflow's keys). overrides: {"key.path": value} or a list of
    "key.path=value" strings, as `--set`. progress: called as
    progress(fraction, message) from a worker thread; returning False cancels
    (resumable, raises Error with exit_class "interrupted"). log: called as
    log(level, message) with the per-input summary lines (level 0 info, 1
    warning). Ctrl-C stops the run at a commit point and raises
    KeyboardInterrupt; run the same workflow again to resume.
    """
    lib = _load()
    sets, n_sets = _sets(overrides)
    cancel = threading.Event()
    problems = []

    def on_progress(complete, message, _user):
        if progress is not None and not cancel.is_set():
            try:
                if progress(complete, message.decode(errors="replace") if message else "") is False:
                    cancel.set()
            except BaseException as e:  # noqa: B902 - re-raised in the caller's thread
                problems.append(e)
                cancel.set()
        return 0 if cancel.is_set() else 1

    def on_log(level, message, _user):
        if log is not None:
            try:
                log(level, message.decode(errors="replace"))
            except BaseException as e:  # noqa: B902
                problems.append(e)

    cb_p, cb_l = _PROGRESS(on_progress), _LOG(on_log)
    err = _Error()
    rep = ctypes.c_void_p()
    out = {}

    done = threading.Event()

    def call():
        try:
            call_library()
        finally:
            done.set()

    def call_library():
        if isinstance(workflow, dict):
            text = json.dumps(workflow).encode()
            out["rc"] = lib.tilewise_run_yaml(b"<dict>", text, len(text), sets, n_sets, cb_p,
                                              cb_l, None, ctypes.byref(rep), ctypes.byref(err))
        elif isinstance(workflow, str) and "\n" in workflow:
            text = workflow.encode()
            out["rc"] = lib.tilewise_run_yaml(b"<string>", text, len(text), sets, n_sets, cb_p,
                                              cb_l, None, ctypes.byref(rep), ctypes.byref(err))
        else:
            path = os.fsencode(workflow)
            out["rc"] = lib.tilewise_run_file(path, sets, n_sets, cb_p, cb_l, None,
                                              ctypes.byref(rep), ctypes.byref(err))

    # The run happens on a helper thread so that Ctrl-C reaches this one
    # (Python handles signals in the main thread only between bytecodes, never
    # while a foreign call runs); the progress callback then asks to stop.
    t = threading.Thread(target=call, name="tilewise-run", daemon=True)
    t.start()
    interrupted = False
    # An Event, not Thread.join: a KeyboardInterrupt inside join() can leave
    # Python 3.11 believing the thread has ended while it still runs.
    while True:
        try:
            if done.wait(0.1):
                break
        except KeyboardInterrupt:
            # Keep waiting: the run stops at its next commit point.
            interrupted = True
            cancel.set()
    report = None
    if rep.value:
        text = lib.tilewise_report_json(rep)
        lib.tilewise_report_free(rep)
        if text:
            report = json.loads(text.decode())
    rc = out.get("rc", -8)
    if interrupted:
        raise KeyboardInterrupt("tilewise run stopped at a commit point; run it again to resume")
    if problems:
        raise problems[0]
    if rc != 0:
        _raise(rc, err, report)
    return report


# ---- models --------------------------------------------------------------

_DTYPES = {np.dtype(np.uint8): 1, np.dtype(np.uint16): 2, np.dtype(np.int16): 3,
           np.dtype(np.uint32): 4, np.dtype(np.int32): 5, np.dtype(np.float32): 6,
           np.dtype(np.float64): 7, np.dtype(np.int8): 14}


def _as_supported(a):
    """A C-contiguous array of a type the library reads (GDAL's types)."""
    dt = a.dtype
    if dt == np.bool_:
        a = a.astype(np.uint8)
    elif dt == np.float16:
        a = a.astype(np.float32)  # exact
    elif dt in (np.dtype(np.int64), np.dtype(np.uint64)):
        if a.size and np.abs(a.astype(np.float64)).max() > 2 ** 53:
            raise Error(f"{dt} values beyond 2^53 cannot be classified exactly", "usage error", 2,
                        "usage")
        a = a.astype(np.float64)
    elif a.dtype.newbyteorder("=") not in _DTYPES:
        raise Error(f"pixel type {dt} is not supported (uint8, int8, uint16, int16, uint32, "
                    "int32, float32, float64)", "usage error", 2, "usage")
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("="))


class Model:
    """A model file opened as a run would open it.

    overrides: workflow keys that concern the model and its inputs, as for
    run(): {"runtime.device": "cpu", "runtime.memory": "1GiB",
    "input.scale": 0.0001, "model.mean": [...], "tiling.tile": 64,
    "tiling.max_nodata_fraction": 0.5, ...}.
    """

    def __init__(self, path, overrides=None):
        lib = _load()
        sets, n_sets = _sets(overrides)
        err = _Error()
        h = ctypes.c_void_p()
        rc = lib.tilewise_model_open(os.fsencode(path), sets, n_sets, ctypes.byref(h),
                                     ctypes.byref(err))
        if rc != 0:
            _raise(rc, err)
        self._h = h
        self._lib = lib
        self.path = os.fspath(path)

    def close(self):
        if getattr(self, "_h", None):
            self._lib.tilewise_model_close(self._h)
            self._h = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def info(self):
        """arch, bands, in_bands, classes, n_classes, feature_dim, tile, stride,
        scale, mean, std, sha256, backend, batch, memory."""
        return json.loads(self._lib.tilewise_model_info_json(self._h).decode())

    def classify_tiles(self, tiles, nodata=None, valid=None, embeddings=False):
        """tiles (N, bands, T, T) -> probabilities (N, K) float32 [and
        embeddings (N, F)]. Tiles with too much nodata give NaN rows.
        valid (N, T, T): 1 valid, 0 nodata, 2 outside the image (padding:
        not counted as nodata); any other non-zero value counts as 1."""
        if self._h is None:
            raise Error("the model is closed", "usage error", 2, "usage")
        a = _as_supported(np.asarray(tiles))
        if a.ndim != 4 or a.shape[2] != a.shape[3]:
            raise Error(f"expected tiles of shape (N, bands, T, T), got {a.shape}", "usage error",
                        2, "usage")
        n, bands, t, _ = a.shape
        inf = self.info
        k, f = inf["n_classes"], inf["feature_dim"]
        probs = np.empty((n, k), np.float32)
        emb = np.empty((n, f), np.float32) if embeddings else None
        v = None
        if valid is not None:
            v = np.asarray(valid)
            v = np.ascontiguousarray(v if v.dtype == np.uint8 else v != 0, dtype=np.uint8)
            if v.shape != (n, t, t):
                raise Error(f"valid mask must have shape {(n, t, t)}, got {v.shape}",
                            "usage error", 2, "usage")
        desc = _Tiles(a.ctypes.data, _DTYPES[a.dtype], n, bands, t,
                      v.ctypes.data if v is not None else None, nodata is not None,
                      float(nodata) if nodata is not None else 0.0)
        err = _Error()
        rc = self._lib.tilewise_model_classify(self._h, ctypes.byref(desc), probs.ctypes.data,
                                               emb.ctypes.data if emb is not None else None,
                                               ctypes.byref(err))
        if rc != 0:
            _raise(rc, err)
        return (probs, emb) if embeddings else probs

    def classify(self, array, nodata=None, valid=None, embeddings=False, stride=None):
        """Classify a numpy array of any GDAL pixel type.

        (N, bands, T, T): N tiles -> (N, K) probabilities (NaN for tiles with
        too much nodata), and (N, F) embeddings with embeddings=True.
        (bands, H, W): an image, cut into tiles of the model's tile size at
        `stride` (default: the tile; must divide it) as `tilewise run` does
        with tiling.edge pad -> (K, ceil(H/S), ceil(W/S)) probabilities, each
        cell the mean over the classified tiles covering it (NaN: none).
        nodata: a value marking invalid pixels (in any band); valid: a mask of
        the array's spatial shape (non-zero = valid).
        """
        a = np.asarray(array)
        if a.ndim == 4:
            return self.classify_tiles(a, nodata, valid, embeddings)
        if a.ndim != 3:
            raise Error(f"expected (bands, H, W) or (N, bands, T, T), got shape {a.shape}",
                        "usage error", 2, "usage")
        if embeddings:
            raise Error("embeddings are given per tile: pass (N, bands, T, T) tiles",
                        "usage error", 2, "usage")
        t = self.info["tile"]
        s = stride or t
        if s <= 0 or t % s:
            raise Error(f"stride {s} does not divide tile {t}", "usage error", 2, "usage")
        bands, h, w = a.shape
        # tiling.edge pad (pipeline/plan.c): tiles at a*s for a < n, the last
        # reaching past the edge; pixels outside the image are padding.
        ny, nx = _n_tiles(h, t, s), _n_tiles(w, t, s)
        gh, gw = -(-h // s), -(-w // s)
        ph, pw = max((ny - 1) * s + t, h), max((nx - 1) * s + t, w)
        pad = np.zeros((bands, ph, pw), a.dtype)
        pad[:, :h, :w] = a
        vm = np.full((ph, pw), 2, np.uint8)  # 2: outside the image
        vm[:h, :w] = 1 if valid is None else (np.asarray(valid) != 0)
        tiles = np.empty((ny * nx, bands, t, t), a.dtype)
        vt = np.empty((ny * nx, t, t), np.uint8)
        for i in range(ny):
            for j in range(nx):
                tiles[i * nx + j] = pad[:, i * s:i * s + t, j * s:j * s + t]
                vt[i * nx + j] = vm[i * s:i * s + t, j * s:j * s + t]
        probs = self.classify_tiles(tiles, nodata=nodata, valid=vt)
        # The stitcher's averaging (pipeline/stitch.c), in float32 and in
        # raster order, so that the numbers are the run's to the bit.
        k = probs.shape[1]
        acc = np.zeros((gh, gw, k), np.float32)
        cnt = np.zeros((gh, gw), np.uint32)
        c = t // s
        for i in range(ny):
            for j in range(nx):
                p = probs[i * nx + j]
                if np.isnan(p[0]):
                    continue
                acc[i:i + c, j:j + c] += p
                cnt[i:i + c, j:j + c] += 1
        out = np.full((gh, gw, k), np.nan, np.float32)
        one = cnt == 1
        out[one] = acc[one]
        many = cnt > 1
        inv = np.float32(1) / cnt[many].astype(np.float32)
        out[many] = acc[many] * inv[:, None]
        return np.ascontiguousarray(out.transpose(2, 0, 1))


def _n_tiles(n, t, s):
    """Tiles along an axis of n pixels, tile t, stride s, tiling.edge pad."""
    return 1 if n <= t else -(-(n - t) // s) + 1


def info(path):
    """Describe a model file (dict, as Model(path).info) or a raster (GDAL's
    JSON description, when the GDAL Python bindings are installed)."""
    try:
        with Model(path, {"runtime.device": "cpu"}) as m:
            d = m.info
            d["kind"] = "model"
            return d
    except Error as e:
        model_err = e
    try:
        from osgeo import gdal
    except ImportError:
        raise model_err
    gdal.UseExceptions()
    try:
        d = gdal.Info(os.fspath(path), format="json")
    except RuntimeError:
        raise model_err
    d["kind"] = "raster"
    return d
