"""The main job on the embedded default, end to end: ``hypermedia serve`` (SQLite,
local folder), a photo added from the command line, its thumbnail and preview
made by real libvips in worker children, bound by the bridge, and downloaded
through signed URLs the service serves."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.harness import cli_env, start_serve, stop, wait_for

pytestmark = pytest.mark.timeout(120)


def _cli(home: Path, *args: str) -> dict:  # type: ignore[type-arg]
    done = subprocess.run(
        [sys.executable, "-m", "hypermedia", *args],
        env=cli_env("", home, HYPERMEDIA_PHOTO_BRIDGE_INTERVAL_SECONDS="0.2"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_a_photo_gets_its_thumbnail_and_preview(tmp_path: Path) -> None:
    import pyvips

    picture = tmp_path / "garden.jpg"
    pyvips.Image.xyz(1800, 1200).extract_band(0).cast("uchar").jpegsave(str(picture), Q=90)

    home = tmp_path / "embedded"
    server, base = start_serve(tmp_path, home, HYPERMEDIA_PHOTO_BRIDGE_INTERVAL_SECONDS="0.2")
    try:
        added = _cli(home, "photos", "add", str(picture), "--album", "garden", "--json")
        assert (added["width"], added["height"]) == (1800, 1200)

        def variants_bound() -> dict | None:  # type: ignore[type-arg]
            shown = _cli(home, "photos", "show", added["id"], "--base-url", base, "--json")
            return shown if shown["thumb_url"] and shown["preview_url"] else None

        shown = wait_for(variants_bound, 60, interval=0.5, what="thumb and preview are bound")
        assert {v["status"] for v in shown["variants"].values()} == {"completed"}
        # The default profiles: a 200x200 cover-cropped thumbnail, and a preview
        # fitted inside 1280x1280 (aspect kept).
        for url, size in ((shown["thumb_url"], (200, 200)), (shown["preview_url"], (1280, 853))):
            with urllib.request.urlopen(url, timeout=10) as r:
                assert r.headers["Content-Type"] == "image/webp"
                body = r.read()
            img = pyvips.Image.new_from_buffer(body, "")
            assert (img.width, img.height) == size
    finally:
        assert stop(server, signal.SIGTERM) == 0, (tmp_path / "serve.log").read_text()[-3000:]
