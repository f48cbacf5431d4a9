"""Declarative base and the column types every table shares."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, ClassVar, overload

from sqlalchemy import JSON, BigInteger, DateTime, Integer, MetaData, Table
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator

# Named constraints keep Alembic autogenerate and downgrades deterministic.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# BIGINT in Postgres; INTEGER in SQLite, where only "INTEGER PRIMARY KEY" autoincrements.
BigId = BigInteger().with_variant(Integer(), "sqlite")
JsonDoc = JSON().with_variant(JSONB(), "postgresql")


class UtcDateTime(TypeDecorator[datetime]):
    """timestamptz in Postgres; always an aware UTC datetime in Python (SQLite stores naive UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect):
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: fleetprof stores UTC only")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect):
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    if TYPE_CHECKING:  # every model maps one Table (declarative types __table__ as the wider FromClause)
        __table__: ClassVar[Table]


def utcnow() -> datetime:
    return datetime.now(UTC)


# Postgres' to_timestamp(float8) shifts to its 2000 epoch before scaling to microseconds; Python's own
# fromtimestamp scales first. The two can round one float to different microseconds, which put a sample stored
# through SQL 1 us outside a window computed in Python. Every conversion here uses Postgres' rule.
_PG_EPOCH_S = 946_684_800
_UNIX_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_us(ts: float) -> int:
    """Integer microseconds since 1970, rounded exactly as Postgres' to_timestamp(float8) does."""
    return round((ts - _PG_EPOCH_S) * 1_000_000) + _PG_EPOCH_S * 1_000_000


@overload
def from_epoch(ts: float) -> datetime: ...
@overload
def from_epoch(ts: float | None) -> datetime | None: ...
def from_epoch(ts: float | None) -> datetime | None:
    return None if ts is None else _UNIX_EPOCH + timedelta(microseconds=epoch_us(ts))


@overload
def to_epoch(dt: datetime) -> float: ...
@overload
def to_epoch(dt: datetime | None) -> float | None: ...
def to_epoch(dt: datetime | None) -> float | None:
    return None if dt is None else dt.timestamp()
