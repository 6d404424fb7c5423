"""Where studies live: an SQLite file under ``studies/`` by default, PostgreSQL for many machines.

Why SQLite and not a journal file: both resume and both are served by optuna-dashboard, but
SQLite commits each trial transition as one transaction (a SIGKILL cannot leave half a record),
it is the same RDB code path as PostgreSQL (one storage class, one set of behaviours to test),
and ``sqlite3 studies/autotune.db`` answers questions without Optuna.

Opening a storage is the first thing that writes (RDBStorage creates its tables), so callers
validate everything else first; an unreachable URL raises :class:`StudyError` in one line.
"""

from __future__ import annotations

import contextlib
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
    elif sqlite_file is not None and not create:
        _check_study_file(sqlite_file)  # RDBStorage would write Optuna's tables into any file
    kwargs: dict[str, object] = {}
    if url.startswith("postgresql"):
        kwargs = {"connect_args": {"connect_timeout": 10}}  # an unreachable host fails in seconds
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except (sqlalchemy.exc.SQLAlchemyError, ValueError, ImportError) as e:
        detail = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        raise StudyError(f"cannot open storage {redact(url)!r}: {detail}") from None


def check_storage(storage: str) -> None:
    """Fail now, in one line, where :func:`open_storage` would fail at the end of a long command
    (``tune --storage`` records its episode after minutes of training): a SQLite file whose folder
    does not exist; any other URL is opened once (a server that refuses the connection)."""
    url = storage_url(storage)
    if url.startswith("sqlite:///"):
        folder = Path(url.removeprefix("sqlite:///")).parent
        if not folder.is_dir():
            raise StudyError(f"cannot open storage {redact(url)!r}: no folder {str(folder)!r}")
        return
    open_storage(storage)


#: The first 16 bytes of every SQLite 3 database file (https://www.sqlite.org/fileformat.html).
SQLITE_HEADER = b"SQLite format 3\x00"


def _check_study_file(path: Path) -> None:
    """Refuse an existing ``path`` that holds no Optuna study storage, read-only (nothing written)."""
    import sqlite3

    why = None
    if not path.is_file():
        why = "not a file"
    elif path.stat().st_size == 0:
        why = "an empty file"
    else:
        with path.open("rb") as f:
            if f.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                why = "not an SQLite database"
    if why is None:
        try:
            with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
                tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as e:
            raise StudyError(f"cannot open storage {str(path)!r}: {e}") from None
        why = None if "studies" in tables else "an SQLite database without Optuna's tables"
    if why is not None:
        raise StudyError(f"{path} is not a study storage ({why}): run autotune study first, or pass --storage")


def load_existing_study(storage: str | None, name: str, *, hint: str = "") -> optuna.Study:
    """Study ``name`` in ``storage`` (which must exist: nothing is created); one that does not
    exist is a :class:`StudyError` naming the redacted storage, then ``hint``."""
    import optuna

    opened = open_storage(storage, create=False)
    try:
        return optuna.load_study(study_name=name, storage=opened)
    except KeyError:
        raise StudyError(f"study {name!r} does not exist in {redact(storage_url(storage))!r}{hint}") from None
