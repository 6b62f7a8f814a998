#!/usr/bin/python3
"""Run a command and print how its resident memory moves over time.

    bench/rss_timeline.py [--every MS] -- COMMAND [ARGS...]

Samples /proc/PID/status of the command (not of its children) every MS
milliseconds (default 2) and prints one "seconds:VmRSS/VmHWM" pair in MiB each
time VmRSS changes, then the peak. Shows which phase of a run sets the peak
(bench/RESULTS.md, "Peak RSS: where it went").
"""
import argparse
import subprocess
import sys
import time


def status_mib(pid):
    rss = hwm = None
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) >> 10
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) >> 10
    return rss, hwm


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--every", type=float, default=2.0, metavar="MS")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command given")
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0, last, peak, out = time.monotonic(), None, 0, []
    while p.poll() is None:
        try:
            rss, hwm = status_mib(p.pid)
        except (OSError, TypeError):
            break  # the process is gone (or a zombie without these lines)
        if rss is not None and rss != last:
            out.append(f"{time.monotonic() - t0:.3f}:{rss}/{hwm}")
            last, peak = rss, max(peak, hwm or 0)
        time.sleep(a.every / 1000.0)
    rc = p.wait()
    print(" ".join(out))
    print(f"peak VmHWM {peak} MiB, exit code {rc}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
