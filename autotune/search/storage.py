"""Where studies live: an SQLite file under ``studies/`` by default, PostgreSQL for many machines.

Why SQLite and not a journal file: both resume and both are served by optuna-dashboard, but
SQLite commits each trial transition as one transaction (a SIGKILL cannot leave half a record),
it is the same RDB code path as PostgreSQL (one storage class, one set of behaviours to test),
and ``sqlite3 studies/autotune.db`` answers questions without Optuna.

Opening a storage is the first thing that writes (RDBStorage creates its tables), so callers
validate everything else first; an unreachable URL raises :class:`StudyError` in one line.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.errors import MissingDependencyError, StudyError

if TYPE_CHECKING:
    import optuna

__all__ = [
    "DEFAULT_STORAGE",
    "DEFAULT_ARTIFACTS",
    "DEFAULT_CACHE",
    "load_existing_study",
    "open_storage",
    "redact",
    "storage_url",
]

DEFAULT_STORAGE = Path("studies") / "autotune.db"
DEFAULT_ARTIFACTS = Path("studies") / "artifacts"
DEFAULT_CACHE = Path("studies") / "measurements.db"


def storage_url(storage: str | None) -> str:
    """The SQLAlchemy URL for ``--storage``: None is the default SQLite file; a bare path is an
    SQLite file; ``postgresql://`` uses psycopg 3 when psycopg2 is absent."""
    if storage is None:
        return f"sqlite:///{DEFAULT_STORAGE}"
    if "://" not in storage:
        return f"sqlite:///{storage}"
    if storage.startswith(("postgresql://", "postgres://")):
        return "postgresql+" + _postgres_driver() + "://" + storage.split("://", 1)[1]
    return storage


def _postgres_driver() -> str:
    # SQLAlchemy's bare postgresql:// means psycopg2; the dev requirements install psycopg 3.
    import importlib.util

    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return driver
    raise MissingDependencyError("a postgresql:// storage needs a PostgreSQL driver: pip install 'psycopg[binary]'")


def redact(url: str) -> str:
    """The URL with any password replaced by ***, for messages."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def open_storage(storage: str | None, *, create: bool = True) -> optuna.storages.RDBStorage:
    """Open the storage ``--storage`` names, creating its tables (and, for the default, the
    ``studies/`` folder) if ``create``; commands that only read refuse a missing SQLite file
    instead of leaving an empty one behind."""
    import optuna
    import sqlalchemy.exc

    url = storage_url(storage)
    sqlite_file = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None
    if sqlite_file is not None and not sqlite_file.exists():
        if not create:
            raise StudyError(f"no study storage at {sqlite_file}: run autotune study first, or pass --storage")
        if storage is None:
            sqlite_file.parent.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, object] = {}
    if url.startswith("postgresql"):
        kwargs = {"connect_args": {"connect_timeout": 10}}  # an unreachable host fails in seconds
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except (sqlalchemy.exc.SQLAlchemyError, ValueError, ImportError) as e:
        detail = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        raise StudyError(f"cannot open storage {redact(url)!r}: {detail}") from None


def load_existing_study(storage: str | None, name: str, *, hint: str = "") -> optuna.Study:
    """Study ``name`` in ``storage`` (which must exist: nothing is created); one that does not
    exist is a :class:`StudyError` naming the redacted storage, then ``hint``."""
    import optuna

    opened = open_storage(storage, create=False)
    try:
        return optuna.load_study(study_name=name, storage=opened)
    except KeyError:
        raise StudyError(f"study {name!r} does not exist in {redact(storage_url(storage))!r}{hint}") from None
