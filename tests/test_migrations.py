"""The app's migrations: they match its models, and leave the lock table working both ways."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection

import locks
from locks.models import Lock


# makemigrations checks the applied migrations' history in the database too.
@pytest.mark.django_db
def test_models_need_no_new_migration() -> None:
    # Exits with SystemExit(1) when makemigrations would write a migration for the app.
    call_command("makemigrations", "locks", check=True, dry_run=True, verbosity=0)


@pytest.fixture
def latest_migration_afterwards() -> Iterator[None]:
    yield
    call_command("migrate", "locks", verbosity=0)


def tokens_of_two_holdings() -> list[int]:
    tokens = []
    for _ in range(2):
        lease = locks.acquire("orders:1", holder="Alice")
        tokens.append(lease.token)
        lease.release()
    return tokens


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("latest_migration_afterwards")
def test_tokens_keep_rising_after_unapplying_and_reapplying_the_holder_migration() -> None:
    # On SQLite, altering locks_lock rebuilds the table and drops the triggers that raise
    # the token high-water mark; each direction of 0003 must create them again.
    tokens = tokens_of_two_holdings()
    call_command("migrate", "locks", "0002", verbosity=0)
    tokens += tokens_of_two_holdings()
    call_command("migrate", "locks", verbosity=0)
    tokens += tokens_of_two_holdings()
    assert tokens == sorted(set(tokens)), tokens


NOTE = "export 日本 😀"  # 3- and 4-byte UTF-8, as in a view's request path


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("latest_migration_afterwards")
def test_a_lock_table_made_in_a_latin1_database_takes_any_note_after_migrating(
    backend: str,
) -> None:
    call_command("migrate", "locks", "0003", verbosity=0)
    if backend == "mariadb":
        # The column as a latin1 database would have made it: such a note fails there.
        with connection.cursor() as cursor:
            cursor.execute(
                "ALTER TABLE locks_lock MODIFY note varchar(255) CHARACTER SET latin1 NOT NULL"
            )
        with pytest.raises(OperationalError, match="Incorrect string value"):
            locks.acquire("orders:1", note=NOTE)
    tokens = tokens_of_two_holdings()
    call_command("migrate", "locks", verbosity=0)
    lease = locks.acquire("orders:1", note=NOTE)
    assert Lock.objects.get(name="orders:1").note == NOTE
    lease.release()
    tokens += tokens_of_two_holdings()
    assert tokens == sorted(set(tokens)), tokens  # the SQLite rebuild kept the triggers
