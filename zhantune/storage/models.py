"""The results schema (SQLAlchemy 2.0 typed ORM).

Table names carry a ``zt_`` prefix: Optuna keeps its study state in the same database
(``studies``, ``trials``, ...), and the two must never collide.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

__all__ = ["Base", "Device", "Problem", "Study", "Measurement", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON}


class Device(Base):
    """A device by its key (CUDA: gcnArchName; CPU: model name)."""

    __tablename__ = "zt_device"
    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(256), unique=True)
    name: Mapped[str] = mapped_column(String(256))
    kind: Mapped[str] = mapped_column(String(16))
    properties: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Problem(Base):
    """A GEMM problem (op, dims, dtype) and the lookup key Inductor asked for while compiling it."""

    __tablename__ = "zt_problem"
    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(512), unique=True)
    op: Mapped[str] = mapped_column(String(32))
    shape: Mapped[dict[str, Any]] = mapped_column()  # {"M": .., "N": .., "K": ..}
    dtype: Mapped[str] = mapped_column(String(16))
    activation: Mapped[str | None] = mapped_column(String(16))
    lookup_op: Mapped[str] = mapped_column(String(32))
    #: device-agnostic lookup key exactly as Inductor formats it ("((dtype, size, stride), ...)+mm")
    lookup_key: Mapped[str | None] = mapped_column(String(2048))
    flops: Mapped[int] = mapped_column(Integer)


class Study(Base):
    """One tuning run (an Optuna study of the same name lives beside it)."""

    __tablename__ = "zt_study"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(512), unique=True)
    config: Mapped[dict[str, Any]] = mapped_column()
    started_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(16), default="running")


class Measurement(Base):
    """One compiled-and-timed candidate or baseline. Timings in microseconds.

    ``kind`` is ``eager``, ``default`` (Inductor's default choice) or ``candidate``;
    ``trial_number`` is the Optuna trial (None for baselines).
    """

    __tablename__ = "zt_measurement"
    __table_args__ = (
        UniqueConstraint("study_id", "trial_number", name="uq_zt_measurement_trial"),
        Index("ix_zt_measurement_device_problem", "device_id", "problem_id"),
        Index("ix_zt_measurement_lookup", "device_id", "problem_id", "config_hash"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("zt_study.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("zt_device.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("zt_problem.id"))
    trial_number: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    branch: Mapped[str | None] = mapped_column(String(128))
    template_id: Mapped[str | None] = mapped_column(String(128))
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    config_hash: Mapped[str | None] = mapped_column(String(64))
    template_hash: Mapped[str | None] = mapped_column(String(128))
    lookup_key: Mapped[str | None] = mapped_column(String(2048))
    status: Mapped[str] = mapped_column(String(16))
    median_us: Mapped[float | None] = mapped_column(Float)
    min_us: Mapped[float | None] = mapped_column(Float)
    max_us: Mapped[float | None] = mapped_column(Float)
    p20_us: Mapped[float | None] = mapped_column(Float)
    p80_us: Mapped[float | None] = mapped_column(Float)
    n: Mapped[int | None] = mapped_column(Integer)
    timing_method: Mapped[str | None] = mapped_column(String(64))
    tflops: Mapped[float | None] = mapped_column(Float)
    error: Mapped[float | None] = mapped_column(Float)
    error_text: Mapped[str | None] = mapped_column(String(1000))
    compile_s: Mapped[float | None] = mapped_column(Float)
    torch_version: Mapped[str] = mapped_column(String(64))
    triton_version: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)

    study: Mapped[Study] = relationship()
    device: Mapped[Device] = relationship()
    problem: Mapped[Problem] = relationship()
