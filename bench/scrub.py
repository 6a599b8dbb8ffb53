"""``hypermedia objects verify`` (the scrub) against the least a scrub must do:
read each file and hash it with BLAKE3, in one process, no database.

    .venv/bin/python bench/scrub.py [--big-mb 200] [--small 2000] [--small-kb 50] [--repeat 3]

Fills a fresh embedded home (SQLite + local pool) with one ``--big-mb`` file
and ``--small`` files of ``--small-kb`` (random bytes), then, alternating,
times ``storage.scrub.scrub`` over the pool and a plain loop that reads the
same blob files and hashes them with the blake3 package (same 128 KiB reads
as the ledger's own hashing).  Both read from the page cache after the first
run (the files were just written): what is compared is the scrub's own cost
around the hash (a ledger query per 500 objects, a verifying reader, a
re-check only on a finding).  Best of ``--repeat``; the ratio is throughput.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import _common as C
import blake3

CHUNK = 128 * 1024


def fill(home: Path, big_mb: int, small: int, small_kb: int) -> tuple[object, list[Path]]:
    from hypermedia.config import Settings
    from hypermedia.db.driver import Driver
    from hypermedia.storage.ledger import Storage

    url = f"sqlite:///{home / 'hypermedia.db'}"
    C.hm_engine(url)  # migrated
    storage = Storage(Driver(url), Settings(home=home, database_url=url))
    src = home / "src"
    src.mkdir()
    files = []
    big = src / "big.bin"
    with open(big, "wb") as f:
        for _ in range(big_mb):
            f.write(os.urandom(1 << 20))
    files.append(big)
    for i in range(small):
        p = src / f"s{i}.bin"
        p.write_bytes(os.urandom(small_kb * 1024))
        files.append(p)
    storage.put_files(files)
    shutil.rmtree(src)
    blobs = sorted((home / "storage" / "objects").glob("*/*"))
    return storage, blobs


def raw_hash(blobs: list[Path]) -> int:
    total = 0
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    for path in blobs:
        h = blake3.blake3()
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                h.update(view[:n])
                total += n
        h.hexdigest()
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--big-mb", type=int, default=200)
    ap.add_argument("--small", type=int, default=2000)
    ap.add_argument("--small-kb", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    C.note_code_version()
    from hypermedia.storage import scrub

    home = Path(tempfile.mkdtemp(prefix="hm-scrub-"))
    try:
        storage, blobs = fill(home, args.big_mb, args.small, args.small_kb)
        best: dict[str, float] = {}
        size = 0
        for _ in range(args.repeat):
            t = time.perf_counter()
            report = scrub.scrub(storage)  # type: ignore[arg-type]
            best["scrub"] = min(best.get("scrub", 1e9), time.perf_counter() - t)
            assert report.checked == len(blobs) and not report.findings, report
            t = time.perf_counter()
            size = raw_hash(blobs)
            best["raw"] = min(best.get("raw", 1e9), time.perf_counter() - t)
        mb = size / 1e6
        print(f"command: {C.command_line()}")
        print(C.machine_line())
        print(f"objects: 1 x {args.big_mb} MB + {args.small:,} x {args.small_kb} KB ({mb:,.0f} MB)")

        def row(name: str, seconds: float) -> list[str]:
            ratio = f"{best['raw'] / seconds:.2f}x"
            return [
                name,
                f"{seconds:.3f}",
                f"{mb / seconds:,.0f}",
                f"{len(blobs) / seconds:,.0f}",
                ratio,
            ]

        rows = [
            row("hypermedia objects verify (scrub)", best["scrub"]),
            row("read + blake3 per file (no ledger)", best["raw"]),
        ]
        print(C.table(["system", "best s", "MB/s", "objects/s", "vs raw"], rows))
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
