"""What a child's Landlock spec allows (the confinement itself is checked on a
real worker in tests/integration/test_worker_child.py)."""

from __future__ import annotations

import os
from pathlib import Path

import hypermedia
from hypermedia.worker import sandbox


def test_a_child_may_read_its_runtime_but_not_the_checkout_around_it(tmp_path: Path) -> None:
    spec = sandbox.spec_for("auto", str(tmp_path / "slot-0"), None)
    package = os.path.dirname(hypermedia.__file__)
    checkout = os.path.dirname(package)
    assert package in spec.read
    assert "/usr" in spec.read and "/etc/ld.so.cache" in spec.read
    assert {"/etc/hosts", "/etc/resolv.conf"} <= set(spec.read)  # a tcp:// clamd by name
    # Not the folder around the package (the default HYPERMEDIA_HOME lives
    # there), not /etc as a whole, not the root, not /tmp.
    for denied in (checkout, "/etc", "/", "/tmp", "/root", "/home"):
        assert denied not in spec.read, denied
    assert not any(Path(checkout, "hypermedia-data").is_relative_to(p) for p in spec.read)
    assert spec.write == [str(tmp_path / "slot-0")]
    assert spec.connect_ports is None
    assert sandbox.Spec.from_json(spec.to_json()) == spec


def test_off_confines_nothing() -> None:
    assert sandbox.confine(sandbox.Spec("off")) is None
    assert sandbox.ACTIVE is None
