"""`workers.app` with two bench-only remote-control commands, for bench/scale.py (never production).

    celery -A _probe_app worker ...          (bench/ on PYTHONPATH; the worker is workers.app's own)

- `bench_probe action=<...>`: what the worker process holds, measured inside it. `counts`: RSS,
  `gc.collect()`, the 25 most numerous object types and the kept loops (the process's `kept`);
  `trace_start`: `tracemalloc.start(12)` and a first snapshot; `garbage`: the types of the
  cyclic garbage a collection finds now (`gc.DEBUG_SAVEALL`); `gcstats`: collections, seconds
  and objects collected per generation since start (gc.callbacks); `trim`: `gc.collect()` and
  glibc's `malloc_trim(0)`, then RSS; `trace_diff`: a second snapshot
  compared with the first, the 25 biggest growths by line and the 8 biggest by traceback, as text;
  `alloc`: pymalloc's arenas, allocated blocks and unused pools (`sys._debugmallocstats()`) and
  glibc's arenas with their free bytes (`malloc_info`); `arenas` then `pins`: which 1 MiB arenas
  hold the objects the collector sees (and their referents) now, then the objects in arenas that
  were not there at `arenas` (what keeps a burst's arenas), by type, with samples and their holders;
  `peak_start` then `peak_diff`: tracemalloc from before a burst, a snapshot the first time 400 steps
  run at once, and what it holds beyond the first snapshot per step running, by line and traceback.
- `bench_cprofile action=start|stop path=<file>`: cProfile on the process loop's thread (where every
  step runs; the `WorkerProcess`'s loop), enabled and disabled on that thread; `stop` dumps the stats.

A reply is a small dict (Celery's pidbox carries it back as JSON). Two environment switches, for
the garbage-collector experiments of bench/PROFILE-19.md, applied once the worker is ready (after
workers/worker/bootsteps.py's own `gc.set_threshold`): `BENCH_GC=a,b,c` sets other thresholds, and
`BENCH_GC_EVERY=<s>` runs a full `gc.collect()` in a thread every that many seconds;
`BENCH_MEMO_MAX=<n>` bounds the loop's validated-value memos (`toolloop.memo.MAX`, per run);
(`BENCH_BREAK_CYCLES=1`, PROFILE-19's M1 tried from outside, is gone: the worker does it itself now);
`BENCH_FREE_BODY=1` tries C1's
"do not keep the request body across the model call" (`toolloop.providers.call.dumps` patched to
empty a request body dict once it is encoded).
"""

from __future__ import annotations

import asyncio
import cProfile
import ctypes
import gc
import os
import reprlib
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from celery.signals import worker_ready
from celery.worker.control import control_command

from workers.app import app
from workers.process.worker_process import process_of

__all__ = ["app"]

_gc_times = [[0, 0.0, 0, 0.0], [0, 0.0, 0, 0.0], [0, 0.0, 0, 0.0]]
"""Per generation: collections, wall seconds in them, objects collected, CPU seconds of the
collecting thread (gc.callbacks)."""
_gc_began: list[float] = [0.0, 0.0]


def _on_gc(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        if info["generation"] == 0 and _young_on:
            _young_sample()
        _gc_began[:] = [time.perf_counter(), time.thread_time()]
        return
    counts = _gc_times[info["generation"]]
    counts[0] += 1
    counts[1] += time.perf_counter() - _gc_began[0]
    counts[2] += info["collected"]
    counts[3] += time.thread_time() - _gc_began[1]


_young_on = os.environ.get("BENCH_GC_YOUNG") == "1"
_young: Counter[str] = Counter()
_young_runs = [0, 0, 0]
_older: Counter[str] = Counter()
"""`BENCH_GC_YOUNG=1`: what the young generation holds when a generation-0 collection begins (its
objects by kind, summed over collections), and [collections sampled, objects seen]."""


def _kind(obj: Any) -> str:
    """A kind for an object of the young generation. Containers are read through
    `gc.get_referents` only: a tuple or list being built still has empty (NULL) slots."""
    kind = type(obj).__name__
    if kind == "dict":
        names = [k for k in list(obj)[:4] if type(k) is str]
        return f"dict{{{','.join(names)}}}"
    if kind in ("list", "tuple"):
        items = gc.get_referents(obj)
        return f"{kind}[{type(items[0]).__name__}]" if items else f"{kind}[]"
    if kind == "function":
        return f"function {obj.__qualname__}"
    if kind in ("cell", "method"):
        return kind
    return f"{type(obj).__module__}.{kind}"


def _young_sample() -> None:
    young = gc.get_objects(0)
    _young_runs[0] += 1
    _young_runs[1] += len(young)
    _young.update(_kind(obj) for obj in young)
    del young
    # the survivors of earlier generation-0 collections, still alive
    older = gc.get_objects(1)
    if len(older) > _young_runs[2]:
        _young_runs[2] = len(older)
        _older.clear()
        _older.update(_kind(obj) for obj in older)
    del older


gc.callbacks.append(_on_gc)

_held: dict[str, Any] = {}
"""The profiler and the first tracemalloc snapshot between two commands (bench-only state)."""


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _counts() -> dict[str, Any]:
    collected = gc.collect()
    types = Counter(type(obj).__name__ for obj in gc.get_objects())
    process = process_of(app)
    tasks = len(asyncio.all_tasks(process.start_loop()))
    return {
        "rss_kb": _rss_kb(),
        "collected": collected,
        "objects": sum(types.values()),
        "top": types.most_common(25),
        "kept_loops": len(process.kept),
        "loop_tasks": tasks,
        "frozen": gc.get_freeze_count(),
        "blocks": sys.getallocatedblocks(),
    }


def _trace_diff() -> dict[str, Any]:
    first = _held.get("snapshot")
    if first is None:
        return {"error": "send bench_probe action=trace_start first"}
    gc.collect()
    second = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.Filter(False, tracemalloc.__file__)]
    )
    lines = [str(stat) for stat in second.compare_to(first, "lineno")[:25]]
    traces = []
    for stat in second.compare_to(first, "traceback")[:8]:
        frames = "\n    ".join(stat.traceback.format(limit=12, most_recent_first=True))
        traces.append(
            f"{stat.size_diff / 1024:+.1f} KiB, {stat.count_diff:+d} blocks:\n    {frames}"
        )
    total = sum(stat.size_diff for stat in second.compare_to(first, "filename"))
    return {
        "rss_kb": _rss_kb(),
        "traced_growth_kb": total // 1024,
        "by_line": lines,
        "by_trace": traces,
    }


def _running() -> int:
    consumer = process_of(app).consumer
    return len(getattr(consumer, "running", ()))


def _peak_start() -> dict[str, Any]:
    """tracemalloc from now (16 frames), a first snapshot, and a thread that takes a second one the
    first time the step consumer runs 400 steps at once (--steps-in-flight 500: the burst's peak)."""
    tracemalloc.start(16)
    gc.collect()
    _held["peak0"] = tracemalloc.take_snapshot()

    def watch() -> None:
        while "peak" not in _held:
            time.sleep(0.02)
            running = _running()
            if running >= 400:
                _held["peak_running"] = running
                _held["peak"] = tracemalloc.take_snapshot()
                _held["peak_running_after"] = _running()

    threading.Thread(target=watch, name="bench-peak", daemon=True).start()
    return {"rss_kb": _rss_kb()}


def _peak_diff() -> dict[str, Any]:
    """What the peak snapshot holds beyond the first, per step running then, by traceback and line."""
    first, peak = _held.get("peak0"), _held.get("peak")
    if first is None or peak is None:
        return {
            "error": "no peak snapshot (send peak_start before a burst of >= 400 steps)"
        }
    running = (_held["peak_running"] + _held["peak_running_after"]) / 2
    skip = [
        tracemalloc.Filter(False, tracemalloc.__file__),
        tracemalloc.Filter(False, __file__),
    ]
    peak = peak.filter_traces(skip)
    total = sum(stat.size_diff for stat in peak.compare_to(first, "filename"))
    blocks = sum(stat.count_diff for stat in peak.compare_to(first, "filename"))
    lines = [
        f"{stat.size_diff / running:+.0f} B {stat.count_diff / running:+.1f} blocks per step: "
        f"{stat.traceback[0].filename.split('site-packages/')[-1]}:{stat.traceback[0].lineno}"
        for stat in peak.compare_to(first, "lineno")[:60]
    ]
    traces = []
    for stat in peak.compare_to(first, "traceback")[:40]:
        frames = " <- ".join(
            f"{Path(f.filename).name}:{f.lineno}"
            for f in list(stat.traceback)[::-1][:14]
        )
        per_step = f"{stat.size_diff / running:+.0f} B {stat.count_diff / running:+.1f}"
        traces.append(f"{per_step} per step: {frames}")
    return {
        "running": running,
        "bytes_per_step": total / running,
        "blocks_per_step": blocks / running,
        "by_line": lines,
        "by_trace": traces,
    }


def _pymalloc() -> dict[str, int]:
    """`sys._debugmallocstats()`'s arena lines (it writes to the C stderr: read through a file)."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        try:
            sys.stderr.flush()
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    found: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition("=")
        number = value.strip().replace(",", "")
        if not number.isdigit():
            continue
        name = name.strip().lstrip("# ")
        if "unused pools" in name:
            found["unused_pools"] = int(name.split()[0])
        for key in (
            "arenas allocated current",
            "arenas highwater mark",
            "arenas reclaimed",
            "bytes in allocated blocks",
            "bytes in available blocks",
        ):
            if name == key:
                found[key.replace(" ", "_")] = int(number)
    return found


def _glibc() -> dict[str, Any]:
    """glibc's `malloc_info`: per arena (heap 0 is the main one, the others threads'), the bytes it
    has from the OS and the free bytes in it; mmapped chunks apart."""
    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype, libc.fopen.argtypes = (
        ctypes.c_void_p,
        [ctypes.c_char_p, ctypes.c_char_p],
    )
    libc.fclose.argtypes, libc.malloc_info.argtypes = (
        [ctypes.c_void_p],
        [ctypes.c_int, ctypes.c_void_p],
    )
    with tempfile.NamedTemporaryFile(suffix=".xml") as out:
        handle = libc.fopen(out.name.encode(), b"w")
        libc.malloc_info(0, handle)
        libc.fclose(handle)
        root = ElementTree.parse(out.name).getroot()
    heaps = []
    for heap in root.findall("heap"):
        system = sum(
            int(e.get("size", 0))
            for e in heap.findall("system")
            if e.get("type") == "current"
        )
        free = sum(
            int(e.get("size", 0))
            for e in heap.findall("total")
            if e.get("type") in ("fast", "rest")
        )
        heaps.append(
            {
                "nr": int(heap.get("nr", -1)),
                "system_kb": system // 1024,
                "free_kb": free // 1024,
            }
        )
    mmapped = sum(
        int(e.get("size", 0)) for e in root.findall("total") if e.get("type") == "mmap"
    )
    system, free = sum(h["system_kb"] for h in heaps), sum(h["free_kb"] for h in heaps)
    return {
        "arenas": len(heaps),
        "heaps": heaps,
        "mmap_kb": mmapped // 1024,
        "system_kb": system,
        "free_kb": free,
    }


_ARENA = 1 << 20  # pymalloc's arena size on 64-bit CPython 3.10+


def _by_arena() -> dict[int, list[Any]]:
    """The small objects (<= 512 bytes: pymalloc's) the collector sees, and their referents, by the
    1 MiB arena their address falls in."""
    gc.collect()
    found: dict[int, list[Any]] = {}
    seen: set[int] = set()
    for obj in gc.get_objects():
        for each in (obj, *gc.get_referents(obj)):
            if id(each) in seen or sys.getsizeof(each) > 512:
                continue
            seen.add(id(each))
            found.setdefault(id(each) & ~(_ARENA - 1), []).append(each)
    return found


def _pins() -> dict[str, Any]:
    """The objects in arenas that were not there at `arenas`: what keeps a burst's arenas alive,
    by type, with tracemalloc's allocation site when tracing."""
    before = _held.get("arenas", set())
    arenas = {base: objs for base, objs in _by_arena().items() if base not in before}
    kinds: Counter[str] = Counter()
    sites: Counter[str] = Counter()
    for objs in arenas.values():
        for obj in objs:
            kinds[type(obj).__qualname__] += 1
            trace = (
                tracemalloc.get_object_traceback(obj)
                if tracemalloc.is_tracing()
                else None
            )
            if trace is not None:
                sites[
                    " <- ".join(
                        f"{Path(f.filename).name}:{f.lineno}"
                        for f in list(trace)[-1:-7:-1]
                    )
                ] += 1
    per_arena = sorted(len(objs) for objs in arenas.values())
    samples = [
        [_describe(obj) for obj in objs[:4]]
        for objs in sorted(arenas.values(), key=len)[:12]
    ]
    return {
        "new_arenas": len(arenas),
        "objects": sum(per_arena),
        "per_arena": per_arena,
        "types": kinds.most_common(30),
        "sites": sites.most_common(30),
        "samples": samples,
    }


def _describe(obj: Any) -> str:
    """An object's type, a short repr and the types of what refers to it (who keeps it)."""
    holders = [type(each).__qualname__ for each in gc.get_referrers(obj)][:4]
    return f"{type(obj).__qualname__} {reprlib.repr(obj)} <- {', '.join(holders)}"


def _alloc() -> dict[str, Any]:
    """Where the process's memory is by allocator: pymalloc's arenas (1 MiB each) and their free
    part, glibc's arenas and their free part, after a `gc.collect()`."""
    gc.collect()
    blocks = sys.getallocatedblocks()
    return {
        "rss_kb": _rss_kb(),
        "blocks": blocks,
        "pymalloc": _pymalloc(),
        "glibc": _glibc(),
    }


_ACTIONS = {
    "counts": _counts,
    "trace_diff": _trace_diff,
    "peak_start": _peak_start,
    "peak_diff": _peak_diff,
    "alloc": _alloc,
    "pins": _pins,
}


@control_command(args=[("action", str)], signature="<action>")  # type: ignore[untyped-decorator]
def bench_probe(state: Any, action: str) -> dict[str, Any]:
    simple = _ACTIONS.get(action)
    if simple is not None:
        return simple()
    if action == "trace_start":
        tracemalloc.start(12)
        gc.collect()
        _held["snapshot"] = tracemalloc.take_snapshot()
        return {"rss_kb": _rss_kb()}
    if action == "gcstats":
        fields = ("collections", "seconds", "collected", "cpu_s")
        found = {
            f"gen{gen}": dict(zip(fields, counts, strict=True))
            for gen, counts in enumerate(_gc_times)
        }
        return {**found, "thresholds": gc.get_threshold()}
    if action == "gcyoung":
        return {
            "collections": _young_runs[0],
            "objects": _young_runs[1],
            "top": _young.most_common(60),
            "older": _young_runs[2],
            "older_top": _older.most_common(60),
        }
    if (
        action == "garbage"
    ):  # what the cyclic garbage is made of: collected into gc.garbage, counted
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            kinds = Counter(type(obj).__qualname__ for obj in gc.garbage)
            found = {"objects": len(gc.garbage), "top": kinds.most_common(40)}
        finally:
            gc.garbage.clear()
            gc.set_debug(0)
        return found
    if (
        action == "arenas"
    ):  # remember which pymalloc arenas hold objects now (before a burst)
        _held["arenas"] = set(_by_arena())
        return {"arenas": len(_held["arenas"])}
    if action == "trim":  # what glibc gives back to the OS once asked (malloc_trim)
        gc.collect()
        collected = _rss_kb()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return {"rss_kb": _rss_kb(), "collected_rss_kb": collected}
    return {"error": f"unknown action {action!r}: counts, trace_start or trace_diff"}


@control_command(args=[("action", str), ("path", str)], signature="<action> <path>")  # type: ignore[untyped-decorator]
def bench_cprofile(state: Any, action: str, path: str) -> dict[str, Any]:
    loop = process_of(app).start_loop()
    if action == "start":
        profiler = _held["profiler"] = cProfile.Profile()
        asyncio.run_coroutine_threadsafe(_call(profiler.enable), loop).result(10)
        return {"ok": "profiling the process loop"}
    profiler = _held.pop("profiler", None)
    if profiler is None:
        return {"error": "send bench_cprofile action=start first"}
    asyncio.run_coroutine_threadsafe(_call(profiler.disable), loop).result(10)
    profiler.dump_stats(path)
    return {"ok": path}


async def _call(function: Any) -> None:
    function()


def _gc_switches(**_: Any) -> None:
    thresholds = os.environ.get("BENCH_GC", "")
    if thresholds:
        first, second, third = (int(part) for part in thresholds.split(","))
        gc.set_threshold(first, second, third)
    if os.environ.get("BENCH_MEMO_MAX"):
        import toolloop.memo

        toolloop.memo.MAX = int(os.environ["BENCH_MEMO_MAX"])
    if os.environ.get("BENCH_FREE_BODY") == "1":
        _free_body()
    every = float(os.environ.get("BENCH_GC_EVERY", "0"))
    if every > 0:
        threading.Thread(
            target=_collect_forever, args=(every,), name="bench-gc", daemon=True
        ).start()


def _free_body() -> None:
    from toolloop.providers import call

    encode = call.dumps

    def dumps(value: Any) -> Any:
        content = encode(value)
        if isinstance(value, dict) and "messages" in value:
            value.clear()  # the nested tree dies now, not after the HTTP call
        return content

    call.dumps = dumps


def _collect_forever(every: float) -> None:
    while True:
        time.sleep(every)
        gc.collect()


worker_ready.connect(_gc_switches, weak=False)
