"""Between transactional tests, empty the tables with DELETE in one transaction.

Django's flush after a ``TransactionTestCase`` (every ``django_db(transaction=True)`` test,
which is most of this suite: lock statements run on connections of the app's own, so a
test's rows must be committed) truncates every table and then sends ``post_migrate``, which
writes the content types and permissions back. On PostgreSQL ``TRUNCATE`` gives each of the
25 tables a new file and commits them to disk: about 0.2 s a database, 0.5 s for a test on
two, on a busy 2-core machine, and a fifth to a third of a whole run on a server (on
PostgreSQL 815 s, 633 s without it; through PgBouncer 797 s, 512 s). A ``DELETE`` of the
few rows a test left, all in one transaction, costs a few milliseconds, and the content
types and permissions, which ``post_migrate`` would write back the same, are kept as they
are.

Example::

    install()  # from pytest_configure
"""

from __future__ import annotations

from django.core.management import call_command
from django.db import DatabaseError, connections, transaction
from django.test import TransactionTestCase

#: Written once by ``migrate``'s ``post_migrate`` and never changed by a test.
KEPT = frozenset({"django_content_type", "auth_permission"})

_django_teardown = TransactionTestCase._fixture_teardown  # type: ignore[attr-defined]


def emptied_tables(alias: str) -> list[str]:
    """The tables emptied between tests on ``alias``: every model's, but :data:`KEPT`."""
    # From the models, without a query; a table missing on the server fails the DELETE.
    names = connections[alias].introspection.django_table_names(include_views=False)
    return sorted(set(names) - KEPT)


def empty(alias: str) -> None:
    """Delete every row of :func:`emptied_tables` on ``alias``, in one transaction."""
    connection = connections[alias]
    quote = connection.ops.quote_name
    # Foreign keys: Django creates them deferred on PostgreSQL and SQLite, so the order of
    # the DELETEs does not matter by the commit; MariaDB checks each statement.
    mysql = connection.vendor == "mysql"
    with transaction.atomic(using=alias), connection.cursor() as cursor:
        if mysql:
            cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
        try:
            for table in emptied_tables(alias):
                cursor.execute(f"DELETE FROM {quote(table)}")
        finally:
            if mysql:
                cursor.execute("SET FOREIGN_KEY_CHECKS = 1")


def _fixture_teardown(self: TransactionTestCase) -> None:
    if self.available_apps is not None or self.serialized_rollback:
        _django_teardown(self)
        return
    for alias in self._databases_names(include_mirrors=False):  # type: ignore[attr-defined]
        try:
            empty(alias)
        except DatabaseError:
            # A table a test dropped, or a session the test ended: Django's own flush, which
            # empties the tables there are (and fails as it would have).
            call_command("flush", verbosity=0, interactive=False, database=alias)


def install() -> None:
    """Put the DELETE flush in place of Django's for every transactional test."""
    TransactionTestCase._fixture_teardown = _fixture_teardown  # type: ignore[attr-defined]
