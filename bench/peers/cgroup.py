"""A memory cgroup (v1 or v2) that one benchmarked process at a time runs in.

Page cache is charged to the cgroup that faulted it in, so under a cap a system cannot keep
in the page cache what it wrote to (or memory-maps from) disk.
"""

import os
import time

V1_ROOT = "/sys/fs/cgroup/memory"
V2_ROOT = "/sys/fs/cgroup"


class CgroupError(RuntimeError):
    pass


def _read(path):
    with open(path) as f:
        return f.read()


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def _counter(path, key):
    """The value of `key N` in a flat-keyed cgroup file (memory.events, memory.oom_control)."""
    for line in _read(path).splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def _v2_has_memory():
    controllers = os.path.join(V2_ROOT, "cgroup.controllers")
    return os.path.exists(controllers) and "memory" in _read(controllers).split()


class MemoryCgroup:
    """A fresh cgroup named `name` with an optional limit in bytes (None = no limit, measure only)."""

    def __init__(self, name, limit_bytes):
        if os.path.exists(os.path.join(V1_ROOT, "memory.limit_in_bytes")):
            self.version = 1
            self.path = os.path.join(V1_ROOT, name)
        elif _v2_has_memory():
            self.version = 2
            self.path = os.path.join(V2_ROOT, name)
        else:
            raise CgroupError(f"no memory cgroup controller (neither v1 {V1_ROOT} nor v2 'memory' in "
                              f"{V2_ROOT}/cgroup.controllers); mount one or run on a host that has it")
        try:
            if self.version == 2 and "memory" not in _read(os.path.join(V2_ROOT, "cgroup.subtree_control")).split():
                _write(os.path.join(V2_ROOT, "cgroup.subtree_control"), "+memory")
            os.mkdir(self.path)
            if limit_bytes is not None:
                _write(self._file("memory.limit_in_bytes" if self.version == 1 else "memory.max"), str(limit_bytes))
        except OSError as e:
            self.remove()
            raise CgroupError(f"cannot make memory cgroup {self.path} ({e.strerror}); run as root") from e
        self.oom_kills_at_start = self.oom_kills()

    def _file(self, name):
        return os.path.join(self.path, name)

    def wrap(self, command):
        """`command` prefixed so that the process joins this cgroup before it execs."""
        script = f'echo $$ > {self._file("cgroup.procs")} && exec "$@"'
        return ["sh", "-c", script, "sh", *command]

    def peak_bytes(self):
        """Peak usage including page cache, or None where the kernel does not report it (v2 before 5.19)."""
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        return int(_read(self._file(name))) if os.path.exists(self._file(name)) else None

    def oom_kills(self):
        if self.version == 1:
            return _counter(self._file("memory.oom_control"), "oom_kill")
        return _counter(self._file("memory.events"), "oom_kill")

    def oom_killed(self):
        return self.oom_kills() > self.oom_kills_at_start

    def remove(self):
        """Remove the cgroup; its processes have exited (the kernel may need a moment to notice)."""
        for _ in range(50):
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        raise CgroupError(f"cannot remove memory cgroup {self.path}: processes remain in it")
