"""One benchmarked process in its own memory cgroup: page cache dropped first, CPU use of
other processes measured meanwhile, killed at a timeout. Standard library only.
"""

import dataclasses
import os
import shlex
import signal
import subprocess
import time

from cgroup import MemoryCgroup


class HarnessError(RuntimeError):
    pass


def drop_caches():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except OSError as e:
        raise HarnessError(f"cannot drop the page cache ({e.strerror}); run as root") from e


def busy_cpu_seconds():
    """CPU seconds all processes have used since boot (/proc/stat, idle and iowait left out)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def cpu_cores_in_use(seconds=3.0):
    """CPU cores in use over the next `seconds` (nothing of ours runs meanwhile)."""
    start = busy_cpu_seconds()
    time.sleep(seconds)
    return (busy_cpu_seconds() - start) / seconds


def wait_for_quiet(limit, max_wait):
    """Wait until other processes use at most `limit` cores, or `max_wait` seconds have passed."""
    if limit is None:
        return
    deadline = time.monotonic() + max_wait
    while (busy := cpu_cores_in_use()) > limit and time.monotonic() < deadline:
        print(f"peers: waiting: other processes use {busy:.2f} cores (--quiet-below {limit})", flush=True)
        time.sleep(20)


def last_line(path):
    with open(path, errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[-1][:200] if lines else "no output"


@dataclasses.dataclass
class Outcome:
    status: str  # ok, OOM, timeout, failed
    reason: str  # why not ok (one line)
    wall_seconds: float
    peak_rss: int  # bytes, the process tree's largest
    peak_cgroup: int  # bytes with page cache, None where the kernel does not say
    others_cores: float  # CPU cores other processes used meanwhile


class IsolatedProcess:
    """`command` started in a fresh memory cgroup (limit `mem_cap` bytes or None) after the page
    cache is dropped, output to `log`. Use as a context manager: leaving it kills what still runs
    and removes the cgroup. finish() waits for the exit and returns the Outcome."""

    def __init__(self, command, log, mem_cap, name, env=None, timeout=3600):
        self.command, self.log, self.timeout = command, log, timeout
        drop_caches()
        self.cgroup = MemoryCgroup(name, mem_cap)
        self.start = time.perf_counter()
        self.busy_start = busy_cpu_seconds()
        self.log_file = open(log, "w")
        self.log_file.write(shlex.join(command) + "\n")
        self.log_file.flush()
        self.proc = subprocess.Popen(self.cgroup.wrap(command), stdout=self.log_file, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)
        self.result = None  # (status, rusage) once reaped

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.result is None:
            self.kill()
            self._reap(0)
        self.log_file.close()
        self.cgroup.remove()

    def alive(self):
        return self._reap(os.WNOHANG) is None

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _reap(self, flags):
        if self.result is None:
            pid, status, usage = os.wait4(self.proc.pid, flags)
            if pid:
                self.result = (status, usage)
        return self.result

    def finish(self, stop=False):
        """Wait for the exit (stop: kill it first, for a server whose work is done) and measure."""
        deadline = self.start + self.timeout
        if stop and self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            deadline = time.perf_counter() + 30  # then SIGKILL
        timed_out = False
        while self._reap(os.WNOHANG) is None:
            if time.perf_counter() > deadline and not timed_out:
                self.kill()
                timed_out = not stop
            time.sleep(0.1)
        status, usage = self.result
        wall = time.perf_counter() - self.start
        others = max(0.0, busy_cpu_seconds() - self.busy_start - usage.ru_utime - usage.ru_stime) / wall
        code = os.waitstatus_to_exitcode(status)
        self.log_file.flush()
        tail = last_line(self.log)
        if timed_out:
            state, reason = "timeout", f"timeout ({self.timeout} s)"
        elif self.cgroup.oom_killed() or (code == -signal.SIGKILL and not stop) or "can't allocate memory" in tail \
                or tail.startswith("MemoryError"):
            state, reason = "OOM", "OOM"
        elif code != 0 and not (stop and code in (-signal.SIGTERM, 0, 143)):
            state, reason = "failed", f"failed: {tail}"
        else:
            state, reason = "ok", ""
        return Outcome(state, reason, wall, usage.ru_maxrss * 1024, self.cgroup.peak_bytes(), others)


def run_isolated(command, log, mem_cap, name, env=None, timeout=3600):
    """Run `command` to its end in a fresh cgroup; its Outcome."""
    with IsolatedProcess(command, log, mem_cap, name, env, timeout) as p:
        return p.finish()  # on Ctrl-C, leaving the block kills the run so that its cgroup can go


def machine_line(load_start, load_end):
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                 "unknown CPU")
    return (f"machine: {model}, {os.cpu_count()} cores; load average (1 min) {load_start:.2f} at start, "
            f"{load_end:.2f} at end")
