"""Every contender of the benchmark, by key ``family/backend``."""

from __future__ import annotations

from .app import App, AppPooled
from .base import Busy, Contender
from .native import Floor, GetLock, PgAdvisory
from .peers import DBMutex, DjangoMySQL, RedisLock

FAMILIES: list[type[Contender]] = [
    App,
    AppPooled,
    Floor,
    PgAdvisory,
    GetLock,
    DBMutex,
    DjangoMySQL,
    RedisLock,
]

__all__ = ["FAMILIES", "Busy", "Contender", "build", "every"]


def every() -> list[Contender]:
    """One instance of every contender, in report order.

    Example::

        keys = [c.key for c in every()]
    """
    return [family(backend) for family in FAMILIES for backend in family.backends]


def build(key: str) -> Contender:
    """A fresh instance of the contender ``family/backend``.

    Example::

        build("locks/postgresql")
    """
    family_name, backend = key.split("/")
    for family in FAMILIES:
        if family.family == family_name and backend in family.backends:
            return family(backend)
    raise KeyError(key)
