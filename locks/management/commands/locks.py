"""``manage.py locks list|break|reap``: look at lock rows, break locks, delete expired rows.

Exit codes: 0 done; 1 some names were unknown (or not broken), a lock call was refused
(``LockError``, or a bad ``LOCKS`` setting met by ``break``), the prompt was declined or
left (Ctrl-C, Ctrl-D), or the command was interrupted (Ctrl-C: a ``break`` names the lock it
was breaking, which may or may not be broken, and those it did not reach); 2 bad usage (bad
arguments, or no way to confirm a break); 3 the database has no lock table (not migrated);
141 the output went into a pipe that was closed (``locks list | head -1``), as for tools
that SIGPIPE ends.
"""

from __future__ import annotations

import json
import os
import sys
import unicodedata
from argparse import SUPPRESS
from datetime import datetime
from typing import Any, TextIO, TypeGuard

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from locks import connection as own_connection
from locks import validation
from locks.conf import conf
from locks.exceptions import LockError
from locks.leases import break_lock, reap_expired
from locks.models import DatabaseNow, Lock

PARTIAL = 1
USAGE = 2
NOT_MIGRATED = 3
BROKEN_PIPE = 141  # 128 + SIGPIPE (13): how a shell reports a tool that SIGPIPE ended
COLUMNS = ("NAME", "HOLDER", "COUNT", "TOKEN", "ACQUIRED (UTC)", "EXPIRES IN", "STATE")


def _break_holding(alias: str, row: dict[str, Any], *, again: bool) -> dict[str, Any] | None:
    """Break the holding ``row`` shows (by token), so what is reported is what went.

    After a prompt, only the holding that was shown; with ``again`` (``--yes``), also one
    that took the lock meanwhile, read anew. None: nothing was broken.
    """
    for _ in range(3):  # a lock that keeps changing hands this fast is reported, not chased
        if break_lock(row["name"], using=alias, token=row["token"]):
            return row
        fresh = _rows(alias, [row["name"]]) if again else []
        if not fresh:
            return None
        row = fresh[0]
    return None


def _rows(alias: str, names: list[str] | None = None, state: str = "held") -> list[dict[str, Any]]:
    """Lock rows with their time left by the database clock, newest first."""
    # Two grants in one millisecond (SQLite's clock) tie: the later token is the newer.
    newest_first = ("-acquired_at", "-token")
    queryset = Lock.objects.using(alias).annotate(db_now=DatabaseNow()).order_by(*newest_first)
    if names is not None:
        queryset = queryset.filter(name__in=names)
    elif state == "held":
        queryset = queryset.held()
    elif state == "expired":
        queryset = queryset.expired()
    rows = []
    for lock in queryset:
        left = (lock.expires_at - lock.db_now).total_seconds()  # type: ignore[attr-defined]
        rows.append(
            {
                "name": lock.name,
                "holder": lock.holder,
                "count": lock.count,
                "token": lock.token,
                "acquired_at": lock.acquired_at.isoformat(),
                "expires_at": lock.expires_at.isoformat(),
                "expires_in": round(left, 3),
                "state": "held" if left > 0 else "expired",
                "note": lock.note,
            }
        )
    return rows


def _lacks_table(alias: str) -> bool:
    """Whether ``alias``'s database surely has no lock table (False if it cannot tell)."""
    # Asked on the app's own autocommit connection: Django's may be in the transaction
    # the failed read opened (AUTOCOMMIT = False, or an atomic block), which PostgreSQL
    # has aborted, refusing any further statement.
    connection = own_connection.get(alias)
    try:
        with connection.cursor() as cursor:
            return Lock._meta.db_table not in connection.introspection.table_names(cursor)
    except DatabaseError:
        return False


def _printable(text: str) -> str:
    """``text`` with what ``repr()`` escapes escaped the same way, without the quotes.

    Names come from outside (``lock_view`` fills them from URLs): a raw line break would
    print a fake row, an escape sequence would reach the operator's terminal. So every
    character that is not printable (Unicode categories ``C*`` -- control, format,
    surrogate, private use, unassigned -- and the separators other than the space) is
    escaped, and a backslash is doubled so that an escape cannot be faked. It is the
    spelling of the name in ``Broke lock 'a\\nb'`` and other messages of this command.
    """
    return "".join(
        char if char.isprintable() and char != "\\" else repr(char)[1:-1] for char in text
    )


def _json(rows: list[dict[str, Any]]) -> str:
    """``rows`` as JSON that round-trips exactly, with no raw unprintable character in it.

    Readable text stays as it is (not ``ensure_ascii``), but what :func:`_printable`
    escapes is a ``\\uXXXX`` escape here: ``json.dumps`` itself escapes only C0, which
    would let C1 controls (U+009B, CSI to some terminals) and bidi overrides through to
    the operator's terminal. Such characters occur only inside strings, where the escape
    means the same; the layout's line breaks stay.
    """
    text = json.dumps(rows, indent=2, ensure_ascii=False)
    return "".join(
        char if char.isprintable() or char == "\n" else json.dumps(char)[1:-1] for char in text
    )


def _is_terminal(stdin: TextIO | None) -> TypeGuard[TextIO]:
    """Whether ``stdin`` is a terminal someone can answer a prompt on."""
    # None: Python's sys.stdin when file descriptor 0 is closed (a daemon, "<&-"). A
    # closed file object cannot say (ValueError): it cannot answer either.
    if stdin is None:
        return False
    try:
        return stdin.isatty()
    except ValueError:
        return False


def _when(iso: str) -> str:
    """``acquired_at`` to the millisecond; ``isoformat()`` leaves out zero microseconds."""
    return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M:%S.%f")[:23]


def _table(rows: list[dict[str, Any]]) -> str:
    cells = [
        (
            _printable(row["name"]),
            _printable(row["holder"]),
            str(row["count"]),
            str(row["token"]),
            _when(row["acquired_at"]),
            f"{row['expires_in']:.1f} s",
            row["state"],
        )
        for row in rows
    ]
    widths = [max(_cells(c[i]) for c in [COLUMNS, *cells]) for i in range(len(COLUMNS))]
    right = {2, 3, 5}  # numbers line up on the right
    lines = [
        "  ".join(
            _pad(cell, width, right=i in right)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in [COLUMNS, *cells]
    ]
    return "\n".join(lines)


def _cells(text: str) -> int:
    """How many terminal cells ``text`` takes up, for a table to line up.

    Not ``len()``: an East Asian wide or fullwidth character (CJK, most emoji) takes two
    cells; a combining mark (an accent after its letter) and a conjoining Hangul vowel or
    final (part of the syllable before it) none; a narrow character that U+FE0F asks to
    show as an emoji (``❤️``) two. Only what :func:`_printable` lets through is measured:
    no control or format character reaches the table.
    """
    widths: list[int] = []
    for char in text:
        if char == "\ufe0f" and widths and widths[-1] == 1:
            widths[-1] = 2
        elif unicodedata.category(char) in {"Mn", "Me"} or "\u1160" <= char <= "\u11ff":
            widths.append(0)
        else:
            widths.append(2 if unicodedata.east_asian_width(char) in {"W", "F"} else 1)
    return sum(widths)


def _pad(text: str, width: int, *, right: bool) -> str:
    """``text`` padded with spaces to ``width`` terminal cells, on the left if ``right``."""
    padding = " " * max(0, width - _cells(text))
    return padding + text if right else text + padding


def _flush_stdout() -> bool:
    """Write out what standard output still buffers; False if its reader has gone.

    Then it goes to ``os.devnull``, so that the flush at exit does not fail again.
    """
    if sys.stdout is None:  # file descriptor 1 closed (">&-")
        return True
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return False
    return True


def _django_options(sub: CommandParser) -> None:
    """Django's own options on a subcommand's parser too, as every command takes them.

    argparse reads what follows ``list`` with the subcommand's parser alone, so without
    these ``manage.py locks list --settings=... -v 0`` is refused. Their default is to
    leave unset, so one given before the subcommand is kept.
    """
    options: dict[str, dict[str, Any]] = {
        "--verbosity": {"type": int, "choices": [0, 1, 2, 3]},
        "--settings": {},
        "--pythonpath": {},
        "--traceback": {"action": "store_true"},
        "--no-color": {"action": "store_true"},
        "--force-color": {"action": "store_true"},
        "--skip-checks": {"action": "store_true"},
    }
    for flag, kwargs in options.items():
        flags = ["-v", flag] if flag == "--verbosity" else [flag]
        sub.add_argument(*flags, default=SUPPRESS, help=SUPPRESS, **kwargs)


class Command(BaseCommand):
    help = "List locks, break locks by name, or delete expired lock rows."
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")
        listing = commands.add_parser("list", help="show held locks (a table, or --json)")
        listing.add_argument("--expired", action="store_true", help="show only expired rows")
        listing.add_argument("--all", action="store_true", help="show held and expired rows")
        listing.add_argument("--json", action="store_true", help="print JSON, not a table")
        breaking = commands.add_parser("break", help="break locks: their holders lose them")
        breaking.add_argument("names", nargs="+", metavar="NAME", help="lock names")
        breaking.add_argument(
            "--yes",
            "--no-input",
            "--noinput",  # Django's spelling, as manage.py flush takes it
            dest="yes",
            action="store_true",
            help="do not ask for confirmation",
        )
        reaping = commands.add_parser("reap", help="delete expired lock rows in batches")
        reaping.add_argument("--batch-size", type=int, default=None, help="rows per statement")
        for sub in (listing, breaking, reaping):
            sub.add_argument(
                "--database", default=None, help="database alias (default: LOCKS['DATABASE'])"
            )
            _django_options(sub)

    def run_from_argv(self, argv: list[str]) -> None:
        """Run from the command line; output into a pipe closed early ends it quietly.

        ``manage.py locks list | head -1``: once the reader has gone, a write fails with
        BrokenPipeError. As Python's documentation of SIGPIPE advises, standard output
        goes to ``os.devnull`` (so that the flush at exit does not fail again) and the
        command ends at once, with the exit code of a tool that SIGPIPE ended, so that
        ``set -o pipefail`` still tells. A command that failed (a CommandError, an
        unexpected error) ends as it would have, with its own message and exit code.
        Only here: ``call_command`` gets the exception.
        """
        try:
            super().run_from_argv(argv)
        except BrokenPipeError:
            _flush_stdout()
            sys.exit(BROKEN_PIPE)
        except BaseException:
            _flush_stdout()
            raise
        if not _flush_stdout():
            sys.exit(BROKEN_PIPE)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            alias = conf.DATABASE if options["database"] is None else options["database"]
            alias = validation.check_alias(alias)
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc), returncode=USAGE) from exc
        subcommand = options["subcommand"]
        try:
            if subcommand == "list":
                self._list(alias, options)
            elif subcommand == "break":
                stdin = options.get("stdin") or sys.stdin
                self._break(alias, options["names"], options["yes"], stdin, options["verbosity"])
            else:
                self._reap(alias, options["batch_size"], options["verbosity"])
        except KeyboardInterrupt:
            # Ctrl-C: as at the prompt, a message and exit code 1, not a traceback. The
            # statement under way was cancelled or has run (each commits on its own).
            raise CommandError(f"{subcommand}: interrupted", returncode=PARTIAL) from None
        except LockError as exc:
            # A lock call refused (e.g. SQLite, under a transaction of the caller's own on
            # the file of the locks): the reason, not a traceback.
            raise CommandError(str(exc), returncode=PARTIAL) from exc
        except DatabaseError as exc:
            # Only a missing table gets its own answer; any other database error (server
            # down, no permission) is reported as it is, not as "not migrated".
            if not _lacks_table(alias):
                raise
            raise CommandError(
                f"database {alias!r} has no lock table ({Lock._meta.db_table}): run "
                f"'manage.py migrate locks --database {alias}'",
                returncode=NOT_MIGRATED,
            ) from exc

    def _list(self, alias: str, options: dict[str, Any]) -> None:
        if options["expired"] and options["all"]:
            raise CommandError("use --expired or --all, not both", returncode=USAGE)
        state = "all" if options["all"] else "expired" if options["expired"] else "held"
        rows = _rows(alias, state=state)
        if options["json"]:
            self.stdout.write(_json(rows))
        elif rows:
            self.stdout.write(_table(rows))
        else:
            self.stdout.write(
                {"held": "No held locks.", "expired": "No expired locks."}.get(state, "No locks.")
            )

    def _break(
        self, alias: str, names: list[str], yes: bool, stdin: TextIO | None, verbosity: int
    ) -> None:
        try:
            names = list(dict.fromkeys(validation.check_name(name) for name in names))
        except (TypeError, ValueError) as exc:
            raise CommandError(f"{exc}; no lock was broken", returncode=USAGE) from exc
        rows = _rows(alias, names)
        if rows and not yes:
            self._confirm(rows, stdin)
        found = {row["name"]: row for row in rows}
        missed = [name for name in names if name not in found]
        gone: set[str] = set()
        for name, row in found.items():
            try:
                broken = _break_holding(alias, row, again=yes)
            except KeyboardInterrupt:
                # Its statement may have committed before the interrupt was seen (a
                # driver that waits for the server's answer before it lets Python run).
                left = [other for other in names if other not in gone and other != name]
                raise CommandError(
                    f"interrupted while breaking lock {name!r}, which may or may not be "
                    "broken now" + (f"; not broken: {', '.join(map(repr, left))}" if left else ""),
                    returncode=PARTIAL,
                ) from None
            except (LockError, TypeError, ValueError) as exc:
                # A lock call refused, or a bad LOCKS setting (which --skip-checks lets
                # through): the reason and what is left, not a traceback.
                left = [other for other in names if other not in gone]
                raise CommandError(
                    f"breaking locks stopped: {exc}; not broken: {', '.join(map(repr, left))}",
                    returncode=PARTIAL,
                ) from exc
            if broken is None:
                self.stderr.write(f"Lock {name!r} was released or taken again meanwhile.")
                missed.append(name)
                continue
            gone.add(name)
            if verbosity > 0:  # -v 0: only errors, as Django's own commands
                self.stdout.write(
                    f"Broke lock {name!r} (holder {broken['holder']!r}, token {broken['token']})."
                )
        unknown = [name for name in missed if name not in found]
        if unknown:
            self.stderr.write(f"Unknown lock name(s): {', '.join(map(repr, unknown))}.")
        if missed:
            raise CommandError(
                f"{len(missed)} of {len(names)} lock(s) not broken: {', '.join(map(repr, missed))}",
                returncode=PARTIAL,
            )

    def _confirm(self, rows: list[dict[str, Any]], stdin: TextIO | None) -> None:
        if not _is_terminal(stdin):
            raise CommandError(
                "breaking locks needs a confirmation and standard input is not a terminal: "
                "pass --yes to break without asking; no lock was broken",
                returncode=USAGE,
            )
        try:
            self.stdout.write(_table(rows))
            self.stdout.write(
                f"Break {len(rows)} lock(s)? Their holders lose them. [y/N] ", ending=""
            )
            self.stdout.flush()
            answer = stdin.readline()
        except KeyboardInterrupt:
            # Ctrl-C at the prompt, or as it came up: as Django's own prompts, a message and
            # exit code 1, not a traceback.
            answer = ""
        if not answer.endswith("\n"):
            # Ctrl-C or Ctrl-D left the cursor after the prompt: end its line.
            self.stdout.write("")
        if answer.strip().lower() not in {"y", "yes"}:
            raise CommandError("aborted: no lock was broken", returncode=PARTIAL)

    def _reap(self, alias: str, batch_size: Any, verbosity: int) -> None:
        try:
            deleted = reap_expired(batch_size, using=alias)
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc), returncode=USAGE) from exc
        if verbosity > 0:
            self.stdout.write(f"Reaped {deleted} expired lock(s).")
