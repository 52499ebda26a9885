# SPDX-License-Identifier: Apache-2.0
"""
bench_proc_stats.py - what /proc says of a process under load, for the reports' CPU,
context-switch, memory and descriptor figures: its threads, CPU seconds, voluntary switches,
resident memory by kind of mapping, the machine's busy share; and `perf trace -s` summaries.
"""

import os
import re
import threading
import time

MIB = 1024 * 1024


class TidWatcher(threading.Thread):
    """Collects the thread ids of a process while it runs (threads started meanwhile count)."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid = pid
        self.tids = set()
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            try:
                self.tids.update(int(t) for t in os.listdir("/proc/%d/task" % self.pid))
            except OSError:
                pass
            self.halt.wait(0.02)

    def stop(self):
        self.halt.set()
        if self.ident is not None:
            self.join(5)


def parse_trace_summary(path, tids):
    """`perf trace -s` output, summed over the threads in `tids`: {syscall: [calls, ms]}."""
    calls = {}
    keep = False
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for ln in f:
                m = re.match(r"^\s*(.*) \((\d+)\), (\d+) events", ln)
                if m:
                    keep = int(m.group(2)) in tids
                    continue
                m = re.match(r"^\s+([a-z_0-9]+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s", ln)
                if m and keep:
                    c = calls.setdefault(m.group(1), [0, 0.0])
                    c[0] += int(m.group(2))
                    c[1] += float(m.group(4))
    except OSError:
        pass
    return calls


def read_status(pid):
    out = {}
    try:
        with open("/proc/%d/status" % pid) as f:
            for ln in f:
                k, _, v = ln.partition(":")
                if k in ("VmHWM", "VmRSS", "Threads"):
                    out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


def smaps_breakdown(pid):
    """
    Resident memory of a process by kind of mapping, in KiB: {kind: [mappings, rss_kib]}.
    Thread stacks (event loops, workers, store threads) are told by glibc's 8 MiB default size,
    malloc's per-thread arenas by their 64 MiB alignment.
    """
    out = {}
    cur = None
    try:
        with open("/proc/%d/smaps" % pid) as f:
            for ln in f:
                first = ln.split(None, 1)[0]
                if "-" in first and not first.endswith(":"):
                    parts = ln.split()
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    path = parts[5] if len(parts) > 5 else ""
                    size_kib = (hi - lo) // 1024
                    if path.startswith("/"):
                        kind = "files (code, libraries)"
                    elif path == "[heap]":
                        kind = "main malloc heap"
                    elif path.startswith("["):
                        kind = "other (%s)" % path.strip("[]")
                    elif 8000 <= size_kib <= 8200:
                        kind = "thread stacks (8 MiB)"
                    elif lo % (64 * MIB) == 0:
                        kind = "malloc thread arenas"
                    else:
                        kind = "other anonymous"
                    cur = out.setdefault(kind, [0, 0])
                    cur[0] += 1
                elif first == "Rss:" and cur is not None:
                    cur[1] += int(ln.split()[1])
    except OSError:
        pass
    return out


def cpu_seconds(pid):
    """utime + stime of a process so far, in seconds."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def voluntary_switches(pid):
    """Voluntary context switches of all a process's threads so far (0 when it is gone)."""
    total = 0
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return 0
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/status" % (pid, tid)) as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        total += int(line.split()[1])
        except (OSError, ValueError):
            pass
    return total


def tree_cpu_seconds(pid):
    """cpu_seconds of a process and of its children (nginx: the master and its workers)."""
    return cpu_seconds(pid) + sum(cpu_seconds(c) for c in child_pids(pid))


def child_pids(pid):
    out = []
    try:
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open("/proc/%s/stat" % name) as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(name))
            except (OSError, IndexError, ValueError):
                pass
    except OSError:
        pass
    return out


def fd_count(pid):
    """Open descriptors of a process (its connections, with a few files and pipes)."""
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return 0


def machine_cpu():
    """(all jiffies, idle + iowait jiffies) of the machine so far, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]
    except (OSError, ValueError, IndexError):
        return 0, 0


def busy_share(m0, m1):
    return 1.0 - (m1[1] - m0[1]) / max(m1[0] - m0[0], 1)


def cpu_busy(seconds):
    """The share of all CPUs that was busy (not idle or waiting for I/O) over `seconds`."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]
    try:
        t0, i0 = sample()
        time.sleep(seconds)
        t1, i1 = sample()
        return 1.0 - (i1 - i0) / max(t1 - t0, 1)
    except (OSError, ValueError, IndexError):
        return 0.0


def read_loadavg():
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError):
        return 0.0
