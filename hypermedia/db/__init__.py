"""The only package that imports SQLAlchemy: schema, driver, migrations."""

from hypermedia.db.driver import Driver, connect

__all__ = ["Driver", "connect"]
