"""Results storage: the ORM schema and the store API."""

from zhantune.storage.store import Store, check_url, make_engine, sqlite_path

__all__ = ["Store", "check_url", "make_engine", "sqlite_path"]
