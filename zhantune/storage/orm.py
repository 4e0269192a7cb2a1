"""The results schema (SQLAlchemy 2.0 typed ORM).

Table names carry a ``zt_`` prefix: Optuna keeps its study state in the same database
(``studies``, ``trials``, ...), and the two must never collide.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Float, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

__all__ = ["Base", "Claim", "Device", "Environment", "Problem", "Study", "MeasurementRow", "Verdict"]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON}


class Device(Base):
    """A device by its key (CUDA: gcnArchName; CPU: model name and thread count, zhantune.device.cpu_device_key)."""

    __tablename__ = "zt_device"
    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(256), unique=True)
    name: Mapped[str] = mapped_column(String(256))
    kind: Mapped[str] = mapped_column(String(16))
    properties: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Environment(Base):
    """The software and host a measurement was taken with; one row per distinct fingerprint."""

    __tablename__ = "zt_environment"
    id: Mapped[int] = mapped_column(primary_key=True)
    #: sha256 (hex, 64) of the other fields, canonical JSON
    fingerprint: Mapped[str] = mapped_column(String(64), unique=True)
    torch: Mapped[str | None] = mapped_column(String(64))
    triton: Mapped[str | None] = mapped_column(String(64))
    cuda: Mapped[str | None] = mapped_column(String(32))
    hip: Mapped[str | None] = mapped_column(String(32))
    driver: Mapped[str | None] = mapped_column(String(64))
    python: Mapped[str | None] = mapped_column(String(32))
    zhantune: Mapped[str | None] = mapped_column(String(32))
    host: Mapped[str | None] = mapped_column(String(256))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)


class Problem(Base):
    """A GEMM problem (op, dims, dtype) and the lookup key Inductor asked for while compiling it."""

    __tablename__ = "zt_problem"
    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(512), unique=True)
    #: a GEMM op, or a Kernel Tuner kernel's name (up to 100 characters: zhantune.bench.recorded_checks)
    op: Mapped[str] = mapped_column(String(128))
    shape: Mapped[dict[str, Any]] = mapped_column()  # {"M": .., "N": .., "K": ..}
    dtype: Mapped[str] = mapped_column(String(16))
    activation: Mapped[str | None] = mapped_column(String(16))
    #: "kn": W [K, N] row-major; "nk": nn.Linear's W [N, K] used as W.t() (zhantune.problems.gemm)
    weight_layout: Mapped[str] = mapped_column(String(8), default="kn", server_default="kn")
    lookup_op: Mapped[str] = mapped_column(String(128))
    #: device-agnostic lookup key exactly as Inductor formats it ("((dtype, size, stride), ...)+mm")
    lookup_key: Mapped[str | None] = mapped_column(String(2048))
    flops: Mapped[int] = mapped_column(BigInteger)


class Study(Base):
    """One tuning run (an Optuna study of the same name lives beside it)."""

    __tablename__ = "zt_study"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(512), unique=True)
    config: Mapped[dict[str, Any]] = mapped_column()
    started_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)
    finished_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(16), default="running")


class Claim(Base):
    """A worker measures this config of this study (a unique row: exactly one worker wins it)."""

    __tablename__ = "zt_claim"
    __table_args__ = (UniqueConstraint("study_id", "config_hash", name="uq_zt_claim"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("zt_study.id"))
    config_hash: Mapped[str] = mapped_column(String(64))
    trial_number: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)


class Verdict(Base):
    """A speedup claim of one config over Inductor's default on one (device, problem), settled by
    paired, interleaved rounds (zhantune.bench.decision.judge_speedup). ``ratio`` is the median over
    the rounds of the default's decision statistic over the config's (each round's two measured back
    to back); ``ratio_low``/``ratio_high`` the spread of the per-round ratios; ``contended`` how
    many of the paired measurements ran under contention; ``torch_version``/``triton_version`` the
    software the rounds ran with (a claim holds for that torch only). The exporter ships a tuned
    entry only where the latest verdict for the winning config, settled with the table's torch, is
    ``confirmed``."""

    __tablename__ = "zt_verdict"
    __table_args__ = (Index("ix_zt_verdict_device_problem", "device_id", "problem_id"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("zt_study.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("zt_device.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("zt_problem.id"))
    config_hash: Mapped[str | None] = mapped_column(String(64))
    ratio: Mapped[float | None] = mapped_column(Float)
    ratio_low: Mapped[float | None] = mapped_column(Float)
    ratio_high: Mapped[float | None] = mapped_column(Float)
    rounds: Mapped[int] = mapped_column(Integer)
    contended: Mapped[int] = mapped_column(Integer)
    confirmed: Mapped[bool] = mapped_column()
    reason: Mapped[str] = mapped_column(String(500))
    #: the torch and triton the paired rounds ran with (None: settled before 0008 and not recoverable)
    torch_version: Mapped[str | None] = mapped_column(String(64))
    triton_version: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)


class MeasurementRow(Base):
    """One compiled-and-timed candidate or baseline. Timings in microseconds.

    ``kind`` is ``eager``, ``default`` (Inductor's default choice), ``default_unfrozen`` (the default
    compiled without freezing, CPU), ``candidate`` or ``remeasure`` (a paired round's measurement);
    ``trial_number`` is the Optuna trial (None for baselines).
    """

    __tablename__ = "zt_measurement"
    __table_args__ = (
        UniqueConstraint("study_id", "trial_number", name="uq_zt_measurement_trial"),
        Index("ix_zt_measurement_device_problem", "device_id", "problem_id"),
        Index("ix_zt_measurement_lookup", "device_id", "problem_id", "config_hash"),
        Index("ix_zt_measurement_study", "study_id"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("zt_study.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("zt_device.id"))
    problem_id: Mapped[int] = mapped_column(ForeignKey("zt_problem.id"))
    environment_id: Mapped[int | None] = mapped_column(
        ForeignKey("zt_environment.id", name="fk_zt_measurement_environment"))
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
    mean_us: Mapped[float | None] = mapped_column(Float)
    std_us: Mapped[float | None] = mapped_column(Float)
    #: interquartile range (75th - 25th percentile) of the runs, microseconds
    iqr_us: Mapped[float | None] = mapped_column(Float)
    #: coefficient of variation of the runs: std / mean
    cv: Mapped[float | None] = mapped_column(Float)
    #: the machine while measuring (zhantune.bench.conditions): load average, threads, governor, ...
    conditions: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    #: measured under contention (zhantune.bench.conditions.is_contended: busy when timing began, timed
    #: runs kept waiting for a core, other runnable tasks, or other GPU processes)
    contended: Mapped[bool | None] = mapped_column()
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
    environment: Mapped[Environment | None] = relationship()
