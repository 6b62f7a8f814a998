#!/usr/bin/python3
"""validate says what run would refuse about the output folder, and merge
names a shard that is still running (issue 40, items 3 and 6):

* committed parts of another configuration in output.dir: validate exits 6
  with the run's own line (the same words run prints), and nothing changes;
* parts whose fingerprint file was deleted: validate exits 6 naming it, as
  run does;
* another run holding the shard's lock (here a POSIX lock this test takes,
  with "pid host" in the file as a run writes it): validate exits 7 with the
  run's line;
* merge while shard 2/2 runs (its lock held, nothing committed yet) says the
  shard is running, not that it "has committed nothing";
* the same folder with the same configuration: validate exits 0.
"""
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tempfile

from e2eutil import BIN, SRC, check, gdal_or_skip, write_workflow


def cli(*args):
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=600)


def last_line(r):
    lines = r.stderr.strip().splitlines()
    return lines[-1] if lines else ""


def tree(out):
    """Every file under out with its size and mtime: validate changes none."""
    res = {}
    for root, _, files in os.walk(out):
        for f in files:
            p = os.path.join(root, f)
            st = os.stat(p)
            res[p] = (st.st_size, st.st_mtime_ns)
    return res


def held(path):
    """Take a POSIX write lock on path and sign it as a run does; the
    open file stays open (the lock with it) until closed."""
    f = open(path, "a+")
    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()} {socket.gethostname()}\n")
    f.flush()
    return f


def main():
    if gdal_or_skip() is None:
        return 77
    work = tempfile.mkdtemp(prefix="tw-folder-")
    try:
        sample = os.path.join(SRC, "sample_data", "L7_ETMs.tif")
        out = os.path.join(work, "out")
        wf = os.path.join(work, "a.yaml")
        write_workflow(wf, out, sample, stride=32, products="[class, prob]", batch=8)
        # Shard 1/2 commits its rows and writes no product: parts stay.
        r = cli("run", wf, "-q", "--shard", "1/2")
        check(r.returncode == 0, f"shard 1/2 runs ({r.stderr.strip()})")

        r = cli("validate", wf)
        check(r.returncode == 0, f"validate with the parts' configuration: exit 0 "
              f"({last_line(r)})", say_ok=True)

        # Another configuration: run refuses (6); validate first, with its words.
        before = tree(out)
        v = cli("validate", wf, "--set", "tiling.stride=64")
        after = tree(out)
        r = cli("run", wf, "-q", "--set", "tiling.stride=64")
        check(r.returncode == 6, f"run with another stride refuses: exit 6 ({last_line(r)})")
        check(v.returncode == 6 and "committed output rows of a run with another configuration"
              in last_line(v) and last_line(v) == last_line(r),
              f"validate exits 6 with run's line (validate: {v.returncode} {last_line(v)!r}; "
              f"run: {last_line(r)!r})", say_ok=True)
        check(before == after, "validate changed nothing in the folder", say_ok=True)

        # The fingerprint deleted: refused naming it, by validate as by run.
        fp = os.path.join(out, ".tilewise", "L7_ETMs", "fingerprint")
        saved = open(fp, "rb").read()
        os.unlink(fp)
        v = cli("validate", wf)
        check(v.returncode == 6 and "fingerprint" in last_line(v) and "is missing" in last_line(v),
              f"no fingerprint: validate exits 6 naming it ({v.returncode}: {last_line(v)!r})",
              say_ok=True)
        check(not os.path.exists(fp), "validate wrote no fingerprint")
        with open(fp, "wb") as f:
            f.write(saved)

        # Another run holds the lock of shard 1/1: validate says run would exit 7.
        lock = os.path.join(out, ".tilewise", "L7_ETMs", "lock.0001-of-0001")
        h = held(lock)
        try:
            v = cli("validate", wf)
            r = cli("run", wf, "-q")
        finally:
            h.close()
        check(r.returncode == 7, f"run while the lock is held: exit 7 ({last_line(r)})")
        check(v.returncode == 7 and "is being run by process" in last_line(v) and
              last_line(v) == last_line(r),
              f"validate exits 7 with run's line ({v.returncode}: {last_line(v)!r})", say_ok=True)

        # merge while shard 2/2 runs (lock held, nothing of it committed yet).
        lock2 = os.path.join(out, ".tilewise", "L7_ETMs", "lock.0002-of-0002")
        h = held(lock2)
        try:
            m = cli("merge", out)
        finally:
            h.close()
        check(m.returncode == 3 and "shard 2/2's, which is running now (process "
              f"{os.getpid()}" in m.stderr and "committed nothing" not in m.stderr,
              f"merge names the running shard ({m.returncode}: {last_line(m)!r})", say_ok=True)
        m = cli("merge", out)
        check(m.returncode == 3 and "which has committed nothing" in m.stderr,
              f"merge with shard 2/2 not running: committed nothing ({last_line(m)!r})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("e2e_folder_state: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
