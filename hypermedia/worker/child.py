"""The child process that runs attempts, started empty-handed by the worker.

It has no database access (it never imports hypermedia.db), an empty
environment, and per-attempt limits: address space (RLIMIT_AS) and CPU time.
It may serve many attempts in a row; the parent decides when to recycle it.
"""

from __future__ import annotations

import os
import resource
import sys
import traceback
from typing import Any

from hypermedia.errors import JobError
from hypermedia.worker.protocol import read_frame, write_frame

_CHUNK_PEAK = "/proc/self/clear_refs"


def _cpu_ms() -> int:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return int((ru.ru_utime + ru.ru_stime) * 1000)


def _reset_peak() -> None:
    # Writing 5 resets the peak RSS (VmHWM), so each attempt reports its own.
    try:
        with open(_CHUNK_PEAK, "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_mb() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _limit(mem_mb: int | None, cpu_s: int | None) -> None:
    if mem_mb:
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        soft = mem_mb * 1024 * 1024
        if hard != resource.RLIM_INFINITY:
            soft = min(soft, hard)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    if cpu_s:
        used = int(resource.getrusage(resource.RUSAGE_SELF).ru_utime) + 1
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        resource.setrlimit(resource.RLIMIT_CPU, (used + cpu_s, hard))


def run_attempt(msg: dict[str, Any], out: int) -> dict[str, Any]:
    from hypermedia.pipelines import registry

    def report(progress: dict[str, Any]) -> None:
        write_frame(out, {"op": "progress", **progress})

    os.chdir(msg["scratch"])
    _reset_peak()
    cpu0 = _cpu_ms()
    _limit(msg.get("mem_mb"), msg.get("cpu_s"))
    try:
        pipeline = registry.get(msg["job_type"])
        ctx = registry.Context(msg["scratch"], report)
        result = pipeline.run(msg.get("params") or {}, ctx)
        done: dict[str, Any] = {"status": "completed", "result": result, "outputs": ctx.outputs}
    except JobError as exc:
        done = {"status": "failed", "code": exc.code, "message": exc.reason}
    except MemoryError:
        done = {"status": "failed", "code": "OOM", "message": "the attempt ran out of memory"}
    except Exception as exc:  # a pipeline bug: keep the child alive, report it
        traceback.print_exc(file=sys.stderr)
        done = {"status": "failed", "code": "INTERNAL", "message": type(exc).__name__}
    finally:
        # Lift the per-attempt limits again before talking to the parent.
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
        os.chdir("/")
    done.update(op="done", cpu_ms=_cpu_ms() - cpu0, cpu_total_ms=_cpu_ms(), peak_mb=_peak_mb())
    return done


def main() -> None:
    # The protocol owns the original stdin/stdout; anything a library prints
    # goes to stderr instead of corrupting the frames.
    # Started with env={}, but the interpreter adds LC_CTYPE when it coerces
    # the C locale (PEP 538): a pipeline must see nothing of its host.
    os.environ.clear()
    inp, out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    while True:
        msg = read_frame(inp)
        if msg is None or msg.get("op") == "exit":
            return
        write_frame(out, run_attempt(msg, out))


if __name__ == "__main__":
    main()
