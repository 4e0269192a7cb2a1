"""Results storage: the ORM schema, the store (writes and reads), engines and URL checks,
measurement rows, migrations, merging databases and importing Kernel Tuner files.

Only this package writes SQL; everything else calls :class:`Store`.
"""

from zhantune.storage.engine import check_url, make_engine, redact_url, sqlite_path
from zhantune.storage.orm import MeasurementRow
from zhantune.storage.rows import Recorder, measurement_row
from zhantune.storage.store import ClaimLost, Store

__all__ = ["Store", "ClaimLost", "MeasurementRow", "Recorder", "measurement_row", "check_url", "make_engine",
           "redact_url", "sqlite_path"]
