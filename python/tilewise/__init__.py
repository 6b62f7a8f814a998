"""tilewise for Python: run workflows and classify numpy tiles with libtilewise.

A thin ctypes layer over the public C API (include/tilewise.h); numpy is the
only dependency (Debian's python3-numpy).

    import tilewise
    report = tilewise.run("workflows/sample.yaml", overrides={"tiling.stride": 32})
    m = tilewise.Model("sample_data/demo_resnet18.h5")
    m.info["classes"]                      # ['water', 'dense_vegetation', ...]
    probs = m.classify(tiles)              # (N, bands, T, T) -> (N, K)
    grid = m.classify(image)               # (bands, H, W) -> (K, ceil(H/S), ceil(W/S))
    tilewise.info("scene.tif")["crs"]      # `tilewise info --json FILE`, as a dict
    tilewise.__version__                   # the library's version

Finding libtilewise.so (first that exists): the environment variable
TILEWISE_LIBRARY (a path to the .so); the library of the prefix this package
was installed into (written by `cmake --install` into _libpath.py); a build
folder next to the sources (TILEWISE_BUILD_DIR, else ../../build); the system
loader's search for libtilewise.so.0 (LD_LIBRARY_PATH, ldconfig).

Errors raise tilewise.Error with .message, .status (e.g. "config error"),
.exit_code and .exit_class ("usage", "input", "resource", "interrupted", ...),
the same message and exit code `tilewise run` gives. Each is also the
built-in exception that fits, so `except FileNotFoundError` or `except
ValueError` work as for any Python library:

    Error                               every tilewise failure
      UsageError(ValueError)            a bad argument (exit 2)
      ConfigError(ValueError)           the workflow: syntax, key, type, range (exit 2)
      InputError(ValueError)            a raster unreadable or not fitting the model (exit 3)
      ModelError(ValueError)            a model file unreadable or unsupported (exit 3)
      ResourceError(OSError)            output, device, network (exit 4)
        OutOfMemoryError(MemoryError)   the memory budget or an allocation
        NetworkError(ConnectionError)   a remote input unreachable
      PartsError(FileExistsError)       output.dir holds another configuration's parts (exit 6)
      LockedError(BlockingIOError)      another process runs the same shard (exit 7)
      Interrupted                       cancelled at a commit point; resumable (exit 75)
      InternalError(RuntimeError)       a bug (exit 1)

A file that does not exist (workflow, raster, model) raises the class of its
kind that is also a FileNotFoundError (errno ENOENT; .filename when known).
Ctrl-C during run() sets
the run's stop flag, as SIGINT does for the CLI: the run finishes the chunk of
rows under way, commits it and stops; run() raises KeyboardInterrupt, and with
the same workflow again resumes from the committed rows.
"""

import ctypes
import errno
import json
import os
import threading

import numpy as np

__all__ = ["run", "merge", "validate", "Model", "info", "version", "library_path", "Error",
           "UsageError", "ConfigError", "InputError", "ModelError", "ResourceError",
           "OutOfMemoryError", "NetworkError", "PartsError", "LockedError", "Interrupted",
           "InternalError"]

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


class _Image(ctypes.Structure):
    """tilewise_image (API version 4)."""
    _fields_ = [("pixels", ctypes.c_void_p), ("dtype", ctypes.c_int), ("bands", ctypes.c_int),
                ("width", ctypes.c_int), ("height", ctypes.c_int), ("valid", ctypes.c_void_p),
                ("use_nodata", ctypes.c_int), ("nodata", ctypes.c_double)]


_PROGRESS = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_double, ctypes.c_char_p, ctypes.c_void_p)
_TILES = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.c_char_p, ctypes.c_void_p)
_LOG = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


class _Options(ctypes.Structure):
    """tilewise_run_options (API version 5); its size is checked against the
    library's (tilewise_run_options_init sets it)."""
    _fields_ = [("size", ctypes.c_size_t), ("yaml", ctypes.c_char_p), ("yaml_len", ctypes.c_size_t),
                ("sets", ctypes.POINTER(ctypes.c_char_p)), ("n_sets", ctypes.c_int),
                ("progress", _PROGRESS), ("tiles", _TILES), ("log", _LOG),
                ("user", ctypes.c_void_p), ("stop", ctypes.POINTER(ctypes.c_int)),
                ("log_summary", ctypes.c_int), ("shard_index", ctypes.c_int),
                ("shard_count", ctypes.c_int), ("chunk_rows", ctypes.c_int),
                ("quiet", ctypes.c_int), ("restart", ctypes.c_int),
                ("report_path", ctypes.c_char_p), ("tiff_direct", ctypes.c_int),
                ("cpu_winograd", ctypes.c_int), ("cpu_gemm", ctypes.c_int),
                ("cpu_nhwc", ctypes.c_int), ("_reserved_v2", ctypes.c_uint64),
                ("strict", ctypes.c_int),  # API version 3
                ("shard_from", ctypes.c_char_p)]  # API version 5


class _RunSummary(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("status", ctypes.c_int), ("exit_code", ctypes.c_int),
                ("n_inputs", ctypes.c_int), ("inputs_skipped", ctypes.c_int),
                ("tiles_classified", ctypes.c_int64), ("seconds", ctypes.c_double),
                ("n_classes", ctypes.c_int), ("class_names", ctypes.POINTER(ctypes.c_char_p)),
                ("backend", ctypes.c_char_p), ("output_dir", ctypes.c_char_p),
                ("run_json", ctypes.c_char_p), ("shard_index", ctypes.c_int),
                ("shard_count", ctypes.c_int)]


class _InputSummary(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("path", ctypes.c_char_p), ("skipped", ctypes.c_char_p),
                ("width", ctypes.c_int), ("height", ctypes.c_int), ("grid_width", ctypes.c_int),
                ("grid_height", ctypes.c_int), ("tiles_total", ctypes.c_int64),
                ("tiles_classified", ctypes.c_int64), ("tiles_nodata", ctypes.c_int64),
                ("tiles_read_errors", ctypes.c_int64), ("tiles_outside_aoi", ctypes.c_int64),
                ("rows_resumed", ctypes.c_int), ("seconds", ctypes.c_double),
                ("class_cells", ctypes.POINTER(ctypes.c_int64)), ("nodata_cells", ctypes.c_int64),
                ("n_outputs", ctypes.c_int), ("outputs", ctypes.POINTER(ctypes.c_char_p))]


_U64 = ctypes.c_uint64


class _PlanSummary(ctypes.Structure):
    """tilewise_plan_summary (API version 4)."""
    _fields_ = [("size", ctypes.c_size_t), ("resolved", ctypes.c_int), ("planned", ctypes.c_int),
                ("arch", ctypes.c_char_p), ("model_sha256", ctypes.c_char_p),
                ("bands", ctypes.c_int), ("n_classes", ctypes.c_int), ("features", ctypes.c_int),
                ("tile", ctypes.c_int), ("stride", ctypes.c_int), ("backend", ctypes.c_char_p),
                ("precision", ctypes.c_char_p), ("n_inputs", ctypes.c_int),
                ("batch", ctypes.c_int), ("slots", ctypes.c_int), ("readers", ctypes.c_int),
                ("memory_bytes", _U64), ("estimate_bytes", _U64), ("worst_bytes", _U64),
                ("base_bytes", _U64), ("weights_bytes", _U64), ("slots_bytes", _U64),
                ("read_bytes", _U64), ("workspace_bytes", _U64), ("strip_bytes", _U64),
                ("gdal_cache_bytes", _U64), ("margin_bytes", _U64)]


class _PlanInput(ctypes.Structure):
    """tilewise_plan_input (API version 4)."""
    _fields_ = [("size", ctypes.c_size_t), ("path", ctypes.c_char_p), ("skipped", ctypes.c_char_p),
                ("width", ctypes.c_int), ("height", ctypes.c_int), ("bands", ctypes.c_int),
                ("dtype", ctypes.c_char_p), ("tiles_x", ctypes.c_int), ("tiles_y", ctypes.c_int),
                ("tiles", ctypes.c_int64), ("grid_width", ctypes.c_int),
                ("grid_height", ctypes.c_int), ("aoi_tiles", ctypes.c_int64),
                ("remote", ctypes.c_int), ("remote_bytes", ctypes.c_int64)]


def _struct_dict(st, skip=("size",)):
    """A ctypes struct as a dict, bytes decoded."""
    out = {}
    for name, _ in st._fields_:
        if name in skip:
            continue
        v = getattr(st, name)
        out[name] = v.decode(errors="replace") if isinstance(v, bytes) else v
    return out


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
        "tilewise_api_version": (I, []),
        "tilewise_run_options_init": (None, [ctypes.POINTER(_Options)]),
        "tilewise_run_options_set": (I, [ctypes.POINTER(_Options), S, E]),
        "tilewise_run": (I, [S, ctypes.POINTER(_Options), ctypes.POINTER(P), E]),
        "tilewise_merge": (I, [S, ctypes.POINTER(_Options), ctypes.POINTER(P), E]),
        "tilewise_validate": (I, [S, ctypes.POINTER(_Options), ctypes.POINTER(P), E]),
        "tilewise_validation_text": (S, [P]),
        "tilewise_validation_warnings": (I, [P]),
        "tilewise_validation_warning": (S, [P, I]),
        "tilewise_validation_warning_code": (S, [P, I]),
        "tilewise_validation_plan": (I, [P, ctypes.POINTER(_PlanSummary), E]),
        "tilewise_validation_input": (I, [P, I, ctypes.POINTER(_PlanInput), E]),
        "tilewise_validation_free": (None, [P]),
        "tilewise_report_summary": (I, [P, ctypes.POINTER(_RunSummary), E]),
        "tilewise_report_input": (I, [P, I, ctypes.POINTER(_InputSummary), E]),
        "tilewise_report_json": (S, [P]),
        "tilewise_report_path": (S, [P]),
        "tilewise_report_free": (None, [P]),
        "tilewise_model_open": (I, [S, ctypes.POINTER(S), I, ctypes.POINTER(P), E]),
        "tilewise_model_close": (None, [P]),
        "tilewise_model_info_json": (S, [P]),
        "tilewise_model_classify": (I, [P, ctypes.POINTER(_Tiles), P, P, E]),
        "tilewise_model_classify_image": (I, [P, ctypes.POINTER(_Image), I, P, E]),
        "tilewise_info": (I, [S, ctypes.POINTER(_Options), I, ctypes.POINTER(P), E]),
        "tilewise_string_free": (None, [P]),
    }
    for name, (res, args) in sig.items():
        try:
            f = getattr(lib, name)
        except AttributeError:
            raise ImportError(f"{lib._name} lacks {name}: this package needs API version 5 "
                              "(the library of the same build)") from None
        f.restype = res
        f.argtypes = args
    o = _Options()
    lib.tilewise_run_options_init(ctypes.byref(o))
    if o.size != ctypes.sizeof(_Options):
        raise ImportError(f"{lib._name}: tilewise_run_options is {o.size} bytes, this package "
                          f"knows {ctypes.sizeof(_Options)}")
    return lib


def version():
    """The library's version string ("MAJOR.MINOR.PATCH", as `tilewise
    --version` prints it); also tilewise.__version__."""
    return _load().tilewise_version().decode()


def __getattr__(name):
    # __version__ is the library's (loaded on first use, as everything here).
    if name == "__version__":
        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


class UsageError(Error, ValueError):
    """A bad argument (exit 2)."""


class ConfigError(Error, ValueError):
    """The workflow: YAML syntax, an unknown key, a wrong type or range (exit 2)."""


class InputError(Error, ValueError):
    """A raster that cannot be read or does not fit the model (exit 3)."""


class ModelError(Error, ValueError):
    """A model file that cannot be read, is inconsistent or unsupported (exit 3)."""


class ResourceError(Error, OSError):
    """The output cannot be written, the device fails (exit 4)."""


class OutOfMemoryError(ResourceError, MemoryError):
    """The memory budget is too small, or an allocation failed (exit 4)."""


class NetworkError(ResourceError, ConnectionError):
    """A remote input unreachable after its retries (exit 4)."""


class PartsError(Error, FileExistsError):
    """output.dir holds committed parts of a run with another configuration
    (exit 6): nothing was deleted; run.restart=true discards them."""


class LockedError(Error, BlockingIOError):
    """Another process runs the same shard into the same output (exit 7)."""


class Interrupted(Error):
    """Cancelled (progress returned False): stopped at a commit point; the
    same run again resumes (exit 75)."""


class InternalError(Error, RuntimeError):
    """A bug in tilewise (exit 1): please report it."""


class _InputNotFound(InputError, FileNotFoundError):
    pass


class _ModelNotFound(ModelError, FileNotFoundError):
    pass


class _WorkflowNotFound(ConfigError, FileNotFoundError):
    pass


class _UsageNotFound(UsageError, FileNotFoundError):
    pass


# tilewise_status -> class (include/tilewise.h)
_CLASSES = {-1: UsageError, -2: ConfigError, -3: InputError, -4: ModelError, -5: ResourceError,
            -6: OutOfMemoryError, -7: ResourceError, -8: InternalError, -9: NetworkError,
            -10: PartsError, -11: LockedError, 1: Interrupted}
_NOT_FOUND = {UsageError: _UsageNotFound, ConfigError: _WorkflowNotFound,
              InputError: _InputNotFound, ModelError: _ModelNotFound}


def _is_local(path):
    p = os.fsdecode(path)
    return "://" not in p and not p.startswith("/vsi")


def _error(cls, message, status, exit_code, exit_class, report=None, path=None):
    """The exception for a failure: cls, or its FileNotFoundError kind when
    the file it is about does not exist (path given, or the message says
    so, as strerror(ENOENT) does)."""
    missing = path is not None and _is_local(path) and not os.path.exists(path)
    if cls in _NOT_FOUND and (missing or os.strerror(errno.ENOENT) in message):
        e = _NOT_FOUND[cls](message, status, exit_code, exit_class, report)
        e.errno, e.strerror = errno.ENOENT, os.strerror(errno.ENOENT)
        if path is not None:
            e.filename = os.fspath(path)
        return e
    return cls(message, status, exit_code, exit_class, report)


def _raise(code, err, report=None, path=None):
    lib = _load()
    raise _error(_CLASSES.get(code, Error), err.message.decode(errors="replace"),
                 lib.tilewise_status_name(code).decode(), err.exit_code, err.exit_class.decode(),
                 report, path)


def _usage(message):
    return UsageError(message, "usage error", 2, "usage")


def _items(overrides):
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
        items = [s.decode() if isinstance(s, bytes) else str(s) for s in overrides]
    # The library takes C strings: a NUL would end one silently, and the
    # rest of the value would be lost. Refuse it, naming the override.
    for s in items:
        if "\0" in s:
            shown = s.replace("\0", "\\0")
            raise _usage(f"override '{shown}' holds a NUL character, which no workflow value "
                         f"can hold")
    return items


def _array(items):
    return (ctypes.c_char_p * max(1, len(items)))(*[s.encode() for s in items]), len(items)


def _sets(overrides):
    return _array(_items(overrides))


# ---- runs ----------------------------------------------------------------


def _options(workflow, overrides):
    """tilewise_run_options for a workflow (path, YAML text or dict) and
    overrides; returns (options, name, kept): kept holds the buffers the
    options point into (keep it alive until the call returns)."""
    lib = _load()
    opts = _Options()
    lib.tilewise_run_options_init(ctypes.byref(opts))
    items = _items(overrides)
    run_opts = [s.encode() for s in items if s.startswith("run.")]  # report_path points in
    err = _Error()
    for kv in run_opts:
        rc = lib.tilewise_run_options_set(ctypes.byref(opts), kv, ctypes.byref(err))
        if rc != 0:
            _raise(rc, err)
    sets, n_sets = _array([s for s in items if not s.startswith("run.")])
    opts.sets, opts.n_sets = sets, n_sets
    if isinstance(workflow, dict):
        text, name = json.dumps(workflow).encode(), b"<dict>"
    elif isinstance(workflow, str) and "\n" in workflow:
        text, name = workflow.encode(), b"<string>"
    else:
        text, name = None, os.fsencode(workflow)
    if text is not None:
        opts.yaml, opts.yaml_len = text, len(text)
    return opts, name, (run_opts, sets, text)


def validate(workflow, overrides=None):
    """`tilewise validate`: check the workflow, its inputs and the model
    against each other without running the model. Returns {"text": what the
    command prints (plan and advice), "warnings": [the warning lines],
    "codes": [each warning's code: "output", "no_crs", "values", ...],
    "plan": the plan's numbers (tilewise_plan_summary's fields) with
    "inputs": [each input's (tilewise_plan_input's)]}; raises Error when
    the run could not start."""
    lib = _load()
    opts, name, keep = _options(workflow, overrides)
    err = _Error()
    v = ctypes.c_void_p()
    rc = lib.tilewise_validate(name, ctypes.byref(opts), ctypes.byref(v), ctypes.byref(err))
    try:
        text = lib.tilewise_validation_text(v).decode(errors="replace")
        n = lib.tilewise_validation_warnings(v)
        warnings = [lib.tilewise_validation_warning(v, i).decode(errors="replace")
                    for i in range(n)]
        codes = [lib.tilewise_validation_warning_code(v, i).decode() for i in range(n)]
        plan = {}
        ps = _PlanSummary(size=ctypes.sizeof(_PlanSummary))
        perr = _Error()
        if v and lib.tilewise_validation_plan(v, ctypes.byref(ps), ctypes.byref(perr)) == 0:
            plan = _struct_dict(ps)
            plan["inputs"] = []
            for i in range(ps.n_inputs):
                pi = _PlanInput(size=ctypes.sizeof(_PlanInput))
                if lib.tilewise_validation_input(v, i, ctypes.byref(pi), ctypes.byref(perr)) != 0:
                    _raise(perr.status, perr)
                plan["inputs"].append(_struct_dict(pi))
    finally:
        lib.tilewise_validation_free(v)
    del keep
    if rc != 0:
        _raise(rc, err)
    return {"text": text, "warnings": warnings, "codes": codes, "plan": plan}


def run(workflow, overrides=None, progress=None, log=None, tiles=None):
    """Run a workflow; return the run report (run.json) as a dict.

    workflow: a path to a YAML file, YAML text (a str with a newline), or a
    dict (the workflow's keys). overrides: {"key.path": value} or a list of
    "key.path=value" strings, as `--set`; the run.* keys are the command's
    options (run.shard=I/N, run.chunk_rows=N, run.report=PATH, run.quiet=true,
    run.restart=true). progress: called as progress(fraction, message) from a
    worker thread; returning False cancels (resumable, raises Error with
    exit_class "interrupted"). tiles: called as tiles(done, total, input)
    just before each progress call (tiles of the input under way, this run's
    share). log: called as log(level, message) with the run's notices and
    warnings and the per-input summary lines (level 0 info, 1 warning).
    Ctrl-C stops the run gracefully at a commit point (the stop flag, as SIGINT
    for the CLI) and raises KeyboardInterrupt; run the same workflow again to
    resume.
    """
    lib = _load()
    err = _Error()
    opts, name, keep = _options(workflow, overrides)
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

    def on_tiles(done, total, message, _user):
        if tiles is not None and not cancel.is_set():
            try:
                tiles(done, total, message.decode(errors="replace") if message else "")
            except BaseException as e:  # noqa: B902
                problems.append(e)
                cancel.set()

    def on_log(level, message, _user):
        if log is not None:
            try:
                log(level, message.decode(errors="replace"))
            except BaseException as e:  # noqa: B902
                problems.append(e)

    stop = ctypes.c_int(0)  # sig_atomic_t
    opts.progress, opts.tiles, opts.log = _PROGRESS(on_progress), _TILES(on_tiles), _LOG(on_log)
    opts.stop = ctypes.pointer(stop)
    opts.log_summary = 1
    rep = ctypes.c_void_p()
    out = {}
    done = threading.Event()

    def call():
        try:
            out["rc"] = lib.tilewise_run(name, ctypes.byref(opts), ctypes.byref(rep),
                                         ctypes.byref(err))
        finally:
            done.set()

    # The run happens on a helper thread so that Ctrl-C reaches this one
    # (Python handles signals in the main thread only between bytecodes, never
    # while a foreign call runs); this thread then sets the stop flag.
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
            stop.value = 1
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


def merge(output_dir):
    """`tilewise merge`: after sharded runs (run.shard=I/N) into output_dir,
    check every shard finished and write the final products. Returns the
    files written, input by input: [{"path": input, "outputs": [...]}]; []
    when output_dir is merged already."""
    lib = _load()
    err = _Error()
    rep = ctypes.c_void_p()
    rc = lib.tilewise_merge(os.fsencode(output_dir), None, ctypes.byref(rep), ctypes.byref(err))
    try:
        if rc != 0:
            _raise(rc, err)
        s = _RunSummary(size=ctypes.sizeof(_RunSummary))
        if lib.tilewise_report_summary(rep, ctypes.byref(s), ctypes.byref(err)) != 0:
            _raise(err.status, err)
        inputs = []
        for i in range(s.n_inputs):
            d = _InputSummary(size=ctypes.sizeof(_InputSummary))
            if lib.tilewise_report_input(rep, i, ctypes.byref(d), ctypes.byref(err)) != 0:
                _raise(err.status, err)
            inputs.append({"path": d.path.decode(),
                           "outputs": [d.outputs[k].decode() for k in range(d.n_outputs)]})
        return inputs
    finally:
        lib.tilewise_report_free(rep)


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
            raise _usage(f"{dt} values beyond 2^53 cannot be classified exactly")
        a = a.astype(np.float64)
    elif a.dtype.newbyteorder("=") not in _DTYPES:
        raise _usage(f"pixel type {dt} is not supported (uint8, int8, uint16, int16, uint32, "
                     "int32, float32, float64)")
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
            _raise(rc, err, path=path)
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
        if getattr(self, "_h", None) is None:
            raise _usage("the model is closed")
        return json.loads(self._lib.tilewise_model_info_json(self._h).decode())

    def _check_bands(self, bands, inf):
        if bands != inf["in_bands"]:
            raise _usage(f"{self.path} expects {inf['in_bands']} input bands but the tiles have "
                         f"{bands}")

    def classify_tiles(self, tiles, nodata=None, valid=None, embeddings=False):
        """tiles (N, bands, T, T) -> probabilities (N, K) float32 [and
        embeddings (N, F)]. T must be the model's tile (info["tile"]; open
        the Model with {"tiling.tile": T} for another) and bands its
        in_bands: ValueError (UsageError) otherwise. Tiles with too much
        nodata give NaN rows.
        valid (N, T, T): 1 valid, 0 nodata, 2 outside the image (padding:
        not counted as nodata); any other non-zero value counts as 1."""
        if self._h is None:
            raise _usage("the model is closed")
        a = _as_supported(np.asarray(tiles))
        if a.ndim != 4 or a.shape[2] != a.shape[3]:
            raise _usage(f"expected tiles of shape (N, bands, T, T), got {a.shape}")
        n, bands, t, _ = a.shape
        inf = self.info
        self._check_bands(bands, inf)
        if t != inf["tile"]:
            # The library would classify them, at a scale the model may not
            # have been trained at: a 32 px array given to a 64 px model is
            # far more often a mistake than a wish.
            raise _usage(f"{self.path}: tiles of {t} x {t} pixels, but the model takes "
                         f"{inf['tile']} x {inf['tile']} (its tile size); to classify {t} px "
                         f"tiles, open it with {{'tiling.tile': {t}}}")
        k, f = inf["n_classes"], inf["feature_dim"]
        seg = inf.get("task") == "segmentation"
        if seg and embeddings:
            raise _usage(f"{self.path} is a segmentation model: it has no embeddings")
        probs = np.empty((n, k, t, t) if seg else (n, k), np.float32)
        emb = np.empty((n, f), np.float32) if embeddings else None
        v = None
        if valid is not None:
            v = np.asarray(valid)
            v = np.ascontiguousarray(v if v.dtype == np.uint8 else v != 0, dtype=np.uint8)
            if v.shape != (n, t, t):
                raise _usage(f"valid mask must have shape {(n, t, t)}, got {v.shape}")
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
        too much nodata), and (N, F) embeddings with embeddings=True; a
        segmentation model (info["task"] == "segmentation") gives (N, K, T, T),
        a probability per class and pixel.
        (bands, H, W): an image, cut into tiles of the model's tile size at
        `stride` (default: the tile; must divide it) as `tilewise run` does
        with tiling.edge pad -> (K, ceil(H/S), ceil(W/S)) probabilities, each
        cell the mean over the classified tiles covering it (NaN: none). A
        segmentation model gives (K, H, W), a probability per class and
        pixel, its tiles (stride: any up to the tile, default the model's
        resolved stride) blended as tiling.blend and tiling.margin say (the
        overrides given to Model), as `tilewise run` writes prob.tif.
        nodata: a value marking invalid pixels (in any band); valid: a mask of
        the array's spatial shape (non-zero = valid).
        """
        a = np.asarray(array)
        if a.ndim == 4:
            return self.classify_tiles(a, nodata, valid, embeddings)
        if a.ndim != 3:
            raise _usage(f"expected (bands, H, W) or (N, bands, T, T), got shape {a.shape}")
        if embeddings:
            raise _usage("embeddings are given per tile: pass (N, bands, T, T) tiles")
        if self._h is None:
            raise _usage("the model is closed")
        inf = self.info
        self._check_bands(a.shape[0], inf)
        t = inf["tile"]
        seg = inf.get("task") == "segmentation"
        s = stride or (inf["stride"] if seg else t)
        if seg and not 0 < s <= t:
            raise _usage(f"stride {s} is not in 1..tile {t}")
        if not seg and (s <= 0 or t % s):
            raise _usage(f"stride {s} does not divide tile {t}")
        a = _as_supported(a)
        bands, h, w = a.shape
        v = None
        if valid is not None:
            v = np.ascontiguousarray(np.asarray(valid) != 0, dtype=np.uint8)
            if v.shape != (h, w):
                raise _usage(f"valid mask must have shape {(h, w)}, got {v.shape}")
        # The run's tiling plan and stitcher (pipeline/engine/plan.c, stitch.c) in
        # the library: the same tiles and the same averaged bytes as prob.tif.
        cell = 1 if seg else s  # a segmentation model's cells are pixels
        probs = np.empty((inf["n_classes"], -(-h // cell), -(-w // cell)), np.float32)
        desc = _Image(a.ctypes.data, _DTYPES[a.dtype], bands, w, h,
                      v.ctypes.data if v is not None else None, nodata is not None,
                      float(nodata) if nodata is not None else 0.0)
        err = _Error()
        rc = self._lib.tilewise_model_classify_image(self._h, ctypes.byref(desc), s,
                                                     probs.ctypes.data, ctypes.byref(err))
        if rc != 0:
            _raise(rc, err)
        return probs


def info(path):
    """Describe a raster or a model file: the dict `tilewise info --json
    FILE` prints (the same C function, tilewise_info): "type" ("raster" or
    "model"), for a raster width, height, band_count, crs ("EPSG:31985
    (...)"), geotransform, bands, usable, ...; for a model arch, in_bands,
    classes, parameters, mean, std, tile, sha256, ... Raises FileNotFoundError
    (an InputError) for a missing file and ModelError for a PyTorch
    checkpoint, with the export command."""
    lib = _load()
    err = _Error()
    text = ctypes.c_void_p()
    rc = lib.tilewise_info(os.fsencode(path), None, 1, ctypes.byref(text), ctypes.byref(err))
    if rc != 0:
        _raise(rc, err, path=path)
    try:
        return json.loads(ctypes.string_at(text.value).decode())
    finally:
        lib.tilewise_string_free(text)
