"""PDF previews: hypermedia's pdf.preview (pdfium + libvips) against pdftoppm (poppler).

    .venv/bin/python bench/pdf_previews.py [--docs 20] [--pages 10] [--width 1280]

Generates ``--docs`` report-like PDFs of ``--pages`` pages each in code
(tests/pdfs.py ``realistic``: two columns of text in two standard fonts, a chart
of bars, grid lines and a Bezier curve, filled and stroked circles; content
streams Flate-compressed), then renders every page of every document at the
same pixel width, for each of ``--formats`` (default png,jpeg,raw), with:

* hypermedia in-process: the pipeline's ``run`` called in this process, one
  call per document for pages 1..N, as a warm worker child runs it (pdfium and
  libvips already loaded, one thread);
* hypermedia end to end (png and jpeg): one ``pdf.preview`` job per document on
  an SQLite ledger in a temporary HYPERMEDIA_HOME, drained by ``hypermedia
  worker --queues documents --concurrency C --burst`` (input download, child,
  output objects stored and recorded); timed from the first attempt's start to
  the last one's end as job_attempts records them, the worker's whole wall
  time (start-up included) shown beside.  Skipped, with a note, while the
  registry's built-ins do not include pdf.preview;
* pdftoppm: ``pdftoppm -png -scale-to-x W -scale-to-y -1 -f 1 -l N`` per
  document (``-jpeg -jpegopt quality=85`` for jpeg), one process per document
  as a service shelling out would run it.

``raw`` separates the rasteriser from the encoder: pdfium renders each page
into a buffer that is then dropped (pdf.preview's own ``_render``), against
pdftoppm writing PPM to stdout, which goes to /dev/null.  PNG at zlib level 6 and
JPEG at quality 85 on both sides.  ``webp`` (the profile's default format, not
in the default list) has no pdftoppm counterpart: it is shown beside
pdftoppm's PNG for its cost, and not counted in the verdict.

Each system runs ``--repeat`` times, alternating which goes first; the best
run counts (2 shared cores: the 1-minute load is printed per run, and
``--quiet-wait S`` waits up to S seconds for it to drop below 0.7).  The script
checks every system rendered every page at the requested width, and compares
one page between pdfium and poppler (mean absolute difference per channel,
0..255) to show they drew the same thing; heights may differ by one row
(pdf.preview rounds width x page height / page width, pdftoppm rounds up).
Target: hypermedia >= 1.5x pdftoppm's pages per second for the encoded formats.
Run from the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

import _common as C

from tests import pdfs

TARGET = 1.5
EXT = {"png": "png", "jpeg": "jpg", "webp": "webp", "raw": "raw"}
# pdftoppm cannot write WebP: hypermedia's WebP is shown against its PNG.
PEER_FLAGS = {
    "png": ["-png"],
    "jpeg": ["-jpeg", "-jpegopt", "quality=85"],
    "webp": ["-png"],
    "raw": [],
}
PEER_EXT = {"png": "png", "jpeg": "jpg", "webp": "png", "raw": "ppm"}


def wait_quiet(limit: float, below: float = 0.7) -> float:
    end = time.monotonic() + limit
    while os.getloadavg()[0] >= below and time.monotonic() < end:
        time.sleep(2)
    return os.getloadavg()[0]


def make_docs(folder: Path, docs: int, pages: int) -> list[Path]:
    out = []
    for i in range(docs):
        path = folder / f"doc-{i:03d}.pdf"
        path.write_bytes(pdfs.realistic(pages, seed=i))
        out.append(path)
    return out


# -- the systems -----------------------------------------------------------------


def hm_params(pages: int, width: int, fmt: str) -> dict[str, Any]:
    from hypermedia.pipelines import pdf

    return pdf.PREVIEW.validate(
        {"first_page": 1, "last_page": pages, "width": width, "format": fmt},
        {"max_rendered_pages": max(50, pages)},
    )


def run_inprocess(docs: list[Path], out: Path, pages: int, width: int, fmt: str) -> dict[str, Any]:
    from hypermedia.pipelines import pdf, registry

    if fmt == "raw":
        return run_raw(docs, out, pages, width)
    params = hm_params(pages, width, fmt)
    widths: set[int] = set()
    nbytes = count = 0
    t0 = time.perf_counter()
    for i, doc in enumerate(docs):
        scratch = out / f"d{i}"
        scratch.mkdir()
        result = pdf.PREVIEW.run(params, registry.Context(str(scratch), lambda p: None, str(doc)))
        assert result is not None
        for page in result["rendered"]:
            widths.add(page["width"])
            nbytes += page["bytes"]
            count += 1
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "pages": count, "bytes": nbytes, "widths": widths}


def run_raw(docs: list[Path], out: Path, pages: int, width: int) -> dict[str, Any]:
    """pdfium's rasteriser alone: pdf.preview's page sizing and ``_render``, pixels dropped."""
    from hypermedia.pipelines import pdf

    pdfium = pdf._pypdfium2()
    params = hm_params(pages, width, "png")
    widths: set[int] = set()
    nbytes = count = 0
    t0 = time.perf_counter()
    for path in docs:
        doc = pdf._open(pdfium, str(path))
        try:
            for n in range(1, min(pages, len(doc)) + 1):
                w, h = pdf._target_size(n, doc.get_page_size(n - 1), params)
                buf = pdf._render(pdfium, doc, n - 1, (w, h), 600)
                widths.add(w)
                nbytes += len(buf)
                count += 1
        finally:
            doc.close()
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "pages": count, "bytes": nbytes, "widths": widths}


def run_pdftoppm(docs: list[Path], out: Path, pages: int, width: int, fmt: str) -> dict[str, Any]:
    flags = PEER_FLAGS[fmt]
    base = ["pdftoppm", *flags, "-scale-to-x", str(width), "-scale-to-y", "-1"]
    base += ["-f", "1", "-l", str(pages)]
    t0 = time.perf_counter()
    for i, doc in enumerate(docs):
        if fmt == "raw":  # no PPM root: every page to stdout, dropped
            subprocess.run([*base, str(doc)], check=True, stdout=subprocess.DEVNULL)
        else:
            subprocess.run([*base, str(doc), str(out / f"d{i}")], check=True, capture_output=True)
    seconds = time.perf_counter() - t0
    if fmt == "raw":  # checked outside the timing: the first document, read back
        sizes = ppm_sizes(subprocess.run([*base, str(docs[0])], check=True, capture_output=True))
        if len(sizes) != pages:
            raise RuntimeError(f"pdftoppm wrote {len(sizes)} PPM pages, not {pages}")
        w, h = sizes[0]
        count = pages * len(docs)
        return {"seconds": seconds, "pages": count, "bytes": count * w * h * 3, "widths": {w}}
    files = sorted(p for p in out.iterdir() if p.is_file())
    widths = {image_width(p) for p in files}
    nbytes = sum(p.stat().st_size for p in files)
    return {"seconds": seconds, "pages": len(files), "bytes": nbytes, "widths": widths}


def ppm_sizes(done: subprocess.CompletedProcess[bytes]) -> list[tuple[int, int]]:
    """(width, height) of each binary PPM in a concatenation of them."""
    data, i, out = done.stdout, 0, []
    while i < len(data):
        w, h = (int(v) for v in data[i : i + 64].split()[1:3])
        header = b"P6\n%d %d\n255\n" % (w, h)  # as pdftoppm writes it
        if not data.startswith(header, i):
            raise RuntimeError("pdftoppm wrote something other than 8-bit PPM")
        out.append((w, h))
        i += len(header) + w * h * 3
    return out


def image_width(path: Path) -> int:
    import pyvips

    return int(pyvips.Image.new_from_file(str(path)).width)


def registry_has_pdf() -> bool:
    code = "from hypermedia.pipelines import registry; print('pdf.preview' in registry.known())"
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
    return done.stdout.strip() == "True"


def run_e2e(
    docs: list[Path], home: Path, pages: int, width: int, fmt: str, concurrency: int
) -> dict[str, Any]:
    import sqlalchemy as sa

    from hypermedia.config import Settings
    from hypermedia.db.driver import Driver
    from hypermedia.db.schema import job_attempts as A
    from hypermedia.db.schema import job_outputs as O
    from hypermedia.db.schema import processing_jobs as J
    from hypermedia.queue.models import NewJob
    from hypermedia.storage.ledger import Storage

    url = f"sqlite:///{home / 'hypermedia.db'}"
    engine = C.hm_engine(url)
    driver = Driver(url)
    storage = Storage(driver, Settings(home=home, database_url=url))
    params = {"first_page": 1, "last_page": pages, "width": width, "format": fmt}
    jobs = []
    for doc in docs:
        obj = storage.put_file(doc)
        jobs.append(engine.enqueue(NewJob("pdf.preview", params, object_id=obj["object_id"])))
    cmd = C.worker_command(queues="documents", concurrency=concurrency, batch=1, burst=True)
    cmd.append("--no-maintenance")
    log = home / "worker.log"
    t0 = time.perf_counter()
    with open(log, "wb") as f:
        done = subprocess.run(
            cmd, env=C.worker_env(url, home), stdout=f, stderr=subprocess.STDOUT, timeout=1800
        )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"the worker exited with {done.returncode}: {log.read_text()[-2000:]}")
    with driver.read() as tx:
        rows = tx.conn.execute(
            sa.select(J.c.status, J.c.result, A.c.started_at, A.c.finished_at).join(
                A, A.c.job_id == J.c.job_id
            )
        ).all()
        outputs = tx.conn.execute(sa.select(sa.func.count()).select_from(O)).scalar_one()
    driver.dispose()
    bad = [r for r in rows if r[0] != "completed"]
    if bad or len(rows) != len(jobs):
        raise RuntimeError(f"{len(bad)} of {len(rows)} jobs did not complete: {bad[:3]}")
    results = [r[1] if isinstance(r[1], dict) else json.loads(r[1]) for r in rows]
    rendered = [p for res in results for p in res["rendered"]]
    span = (max(r[3] for r in rows) - min(r[2] for r in rows)).total_seconds()
    if outputs != len(rendered):
        raise RuntimeError(f"{len(rendered)} pages rendered but {outputs} outputs recorded")
    return {
        "seconds": span,
        "wall": wall,
        "pages": len(rendered),
        "bytes": sum(p["bytes"] for p in rendered),
        "widths": {p["width"] for p in rendered},
    }


def pixel_difference(ours: Path, theirs: Path) -> float:
    """Mean absolute difference per channel over the common area (0..255)."""
    import pyvips

    a = pyvips.Image.new_from_file(str(ours))[0:3]
    b = pyvips.Image.new_from_file(str(theirs))[0:3]
    w, h = min(a.width, b.width), min(a.height, b.height)
    a, b = a.crop(0, 0, w, h).cast("short"), b.crop(0, 0, w, h).cast("short")
    return float((a - b).abs().avg())


# -- main ------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=20)
    ap.add_argument("--pages", type=int, default=10, help="pages per document, all rendered")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument(
        "--formats", default="png,jpeg,raw", help="png, jpeg, webp (against png), raw (render only)"
    )
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=1, help="worker slots (end to end)")
    ap.add_argument("--no-e2e", action="store_true", help="skip the end-to-end worker runs")
    ap.add_argument("--quiet-wait", type=float, default=0.0)
    ap.add_argument("--time-limit", type=float, default=3600)
    args = ap.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    if set(formats) - set(EXT):
        sys.exit(f"--formats: choose from {', '.join(EXT)}")
    C.set_time_limit(args.time_limit)
    C.note_code_version()
    if shutil.which("pdftoppm") is None:
        sys.exit("pdftoppm is not installed (apt-get install -y poppler-utils)")
    from hypermedia.pipelines import pdf

    reason = pdf.available()
    if reason:
        sys.exit(f"pdf.preview cannot run here: {reason}")
    e2e = not args.no_e2e and registry_has_pdf()
    poppler = subprocess.run(["pdftoppm", "-v"], capture_output=True, text=True).stderr
    load_start = os.getloadavg()[0]
    root = Path(tempfile.mkdtemp(prefix="hm-bench-pdf-"))
    try:
        docs = make_docs(root, args.docs, args.pages)
        size_kb = sum(d.stat().st_size for d in docs) / len(docs) / 1000
        # Warm-up: load pdfium and libvips once, as a warm worker child has them.
        (root / "warm").mkdir()
        run_inprocess(docs[:1], root / "warm", 1, args.width, "png")
        expected = args.docs * args.pages
        rows, verdicts, diffs = [], [], []
        for fmt in formats:
            systems = ["hypermedia in-process", "pdftoppm"]
            if e2e and fmt != "raw":
                systems.append("hypermedia end to end")
            runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
            for rep in range(args.repeat):
                for system in systems if rep % 2 == 0 else list(reversed(systems)):
                    load = wait_quiet(args.quiet_wait) if args.quiet_wait else os.getloadavg()[0]
                    out = root / f"{fmt}-{system.replace(' ', '-')}-{rep}"
                    out.mkdir()
                    if system == "pdftoppm":
                        r = run_pdftoppm(docs, out, args.pages, args.width, fmt)
                    elif system == "hypermedia in-process":
                        r = run_inprocess(docs, out, args.pages, args.width, fmt)
                    else:
                        r = run_e2e(docs, out, args.pages, args.width, fmt, args.concurrency)
                    if r["pages"] != expected or r["widths"] != {args.width}:
                        raise RuntimeError(f"{fmt} {system}: {r['pages']} pages, {r['widths']}")
                    r.update(load=load, out=out)
                    runs[system].append(r)
                    rate = r["pages"] / r["seconds"]
                    print(f"  {fmt} run {rep + 1} {system}: {rate:.1f} pages/s (load {load:.2f})")
                    sys.stdout.flush()
            best = {s: max(rs, key=lambda r: r["pages"] / r["seconds"]) for s, rs in runs.items()}
            peer = best["pdftoppm"]["pages"] / best["pdftoppm"]["seconds"]
            for system in systems:
                r = best[system]
                rate = r["pages"] / r["seconds"]
                label = f"{system} ({fmt})"
                if fmt == "raw":
                    label = f"{system} (render only{', PPM' if system == 'pdftoppm' else ''})"
                elif system == "pdftoppm" and fmt == "webp":
                    label = "pdftoppm (png: it has no webp)"
                rows.append(
                    [
                        label,
                        r["pages"],
                        f"{r['seconds']:.2f}",
                        f"{rate:.1f}",
                        f"{1000 / rate:.1f}",
                        f"{r['bytes'] / r['pages'] / 1000:.0f}",
                        f"{rate / peer:.2f}x",
                        f"{r['load']:.2f}",
                        f"worker wall {r['wall']:.2f} s" if "wall" in r else "",
                    ]
                )
                if system != "pdftoppm" and fmt in ("png", "jpeg"):  # same format both sides
                    verdicts.append((f"{system} ({fmt})", rate / peer))
            if fmt != "raw":
                ours = best["hypermedia in-process"]["out"] / "d0" / f"page-1.{EXT[fmt]}"
                theirs = sorted(best["pdftoppm"]["out"].glob(f"d0-*.{PEER_EXT[fmt]}"))[0]
                diffs.append((fmt, pixel_difference(ours, theirs)))

        print()
        print(f"command: {C.command_line()}")
        print(f"machine: {C.machine_line()}")
        print(f"renderers: {pdf.versions()}; {poppler.splitlines()[0] if poppler else '?'}")
        print(
            f"input: {args.docs} PDFs x {args.pages} pages (A4; text, vector chart, shapes; "
            f"{size_kb:.0f} KB each), every page at {args.width} px wide; best of "
            f"{args.repeat} runs; load average (1 min) at start {load_start:.2f}"
        )
        if not e2e and not args.no_e2e:
            print("end to end: skipped, pdf.preview is not among the registry's built-ins yet")
        print()
        headers = ["system", "pages", "s", "pages/s", "ms/page", "KB/page", "vs pdftoppm", "load"]
        print(C.table([*headers, ""], rows))
        print()
        for fmt, diff in diffs:
            print(f"{fmt}: page 1 of doc 0, pdfium vs poppler, mean abs difference {diff:.2f}/255")
        if verdicts:
            print(f"target: >= {TARGET}x pdftoppm's pages/s in the same format")
            for name, x in verdicts:
                print(f"  {name}: {x:.2f}x {'MET' if x >= TARGET else 'NOT MET'}")
            renderer = [x for name, x in verdicts if "in-process" in name]
            if renderer:
                met = all(x >= TARGET for x in renderer)
                print(f"verdict (the renderer, in-process): {'MET' if met else 'NOT MET'}")
            e2e_rows = [x for name, x in verdicts if "end to end" in name]
            if e2e_rows:
                met = all(x >= TARGET for x in e2e_rows)
                print(
                    f"verdict (end to end, with the worker's storage and bookkeeping): "
                    f"{'MET' if met else 'NOT MET'}"
                )
        else:
            print("target: not judged (it is for png and jpeg; neither was measured)")
        print(f"load average (1 min) at end {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
