"""The photo domain of seed 002: photos bound to objects by role, metadata-only
copy and move, variants made by the engine, and the bridge for legacy
``variant_jobs`` producers."""

from hypermedia.photos.bridge import PhotoBridge
from hypermedia.photos.service import Photos

__all__ = ["PhotoBridge", "Photos"]
