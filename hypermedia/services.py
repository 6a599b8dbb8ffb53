"""The use cases one process serves, built once from settings.

The API, the dashboard and the CLI all hold one of these and call its parts;
none of them touches SQL.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypermedia.auth.tokens import Tokens
from hypermedia.config import Settings, load_settings
from hypermedia.db.driver import connect
from hypermedia.photos.service import Photos
from hypermedia.queue.clock import clock_for
from hypermedia.queue.engine import Engine
from hypermedia.queue.legacy import LegacyJobs
from hypermedia.queue.profiles import Credits, Profiles
from hypermedia.queue.queues import Queues
from hypermedia.storage.ledger import Storage
from hypermedia.worker.fleet import Fleet


@dataclass
class Services:
    settings: Settings
    engine: Engine
    storage: Storage
    photos: Photos
    profiles: Profiles
    credits: Credits
    tokens: Tokens
    queues: Queues
    fleet: Fleet
    legacy: LegacyJobs

    @classmethod
    def from_engine(cls, engine: Engine) -> Services:
        storage = Storage(engine.db, engine.settings, clock=engine.clock)
        return cls(
            settings=engine.settings,
            engine=engine,
            storage=storage,
            photos=Photos(engine, storage),
            profiles=Profiles(engine),
            credits=Credits(engine),
            tokens=Tokens(engine.db, clock=engine.clock),
            queues=Queues(engine),
            fleet=Fleet(engine),
            legacy=LegacyJobs(engine),
        )

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Services:
        s = settings or load_settings()
        db = connect(s.url)
        return cls.from_engine(Engine(db, s, clock=clock_for(db)))
