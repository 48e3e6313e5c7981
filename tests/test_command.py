"""``manage.py locks list|break|reap``: output, exit codes, confirmation, errors."""

from __future__ import annotations

import io
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections, transaction
from django.test import override_settings

import locks
from locks.backends import for_connection
from locks.conf import conf
from locks.management.commands.locks import Command
from locks.models import Lock
from tests.conftest import BACKEND, ROOT, worker_env
from tests.faults import Holding, hold_table_lock, hold_write_lock

pytestmark = pytest.mark.django_db(transaction=True)


class Terminal(io.StringIO):
    """Standard input that says it is a terminal, with the user's answer in it."""

    def isatty(self) -> bool:
        return True


def run(*args: str, **options: Any) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("locks", *args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


def fails(*args: str, **options: Any) -> tuple[int, str]:
    with pytest.raises(CommandError) as caught:
        run(*args, **options)
    return caught.value.returncode, str(caught.value)


def expired(name: str) -> None:
    locks.acquire(name, ttl=0.05, holder="gone")
    time.sleep(0.2)


def test_list_shows_a_table_of_held_locks_newest_first() -> None:
    older = locks.acquire("orders:1", ttl=30, holder="worker-a")
    newer = locks.acquire("orders:2", ttl=30, holder="worker-b")
    expired("orders:old")
    out, _ = run("list")
    lines = out.splitlines()
    assert lines[0].startswith("NAME ") and lines[0].endswith("  EXPIRES IN  STATE")
    assert [line.split()[:4] for line in lines[1:]] == [
        ["orders:2", "worker-b", "1", str(newer.token)],
        ["orders:1", "worker-a", "1", str(older.token)],
    ]
    assert all(line.endswith(" s  held") for line in lines[1:])
    assert "orders:old" not in out


def test_list_expired_all_and_json() -> None:
    locks.acquire("orders:live", ttl=30, holder="worker")
    expired("orders:old")
    assert [line.split()[0] for line in run("list", "--expired")[0].splitlines()[1:]] == [
        "orders:old"
    ]
    assert len(run("list", "--all")[0].splitlines()) == 3
    rows = json.loads(run("list", "--json", "--all")[0])
    by_name = {row["name"]: row for row in rows}
    assert by_name["orders:live"]["state"] == "held"
    assert 0 < by_name["orders:live"]["expires_in"] <= 30
    assert by_name["orders:old"]["state"] == "expired"
    assert by_name["orders:old"]["expires_in"] < 0
    assert set(by_name["orders:live"]) >= {"holder", "count", "token", "acquired_at", "note"}


def test_list_says_when_there_is_nothing() -> None:
    assert run("list")[0].strip() == "No held locks."
    assert json.loads(run("list", "--json")[0]) == []
    assert fails("list", "--expired", "--all")[0] == 2


def test_list_escapes_characters_that_would_fake_rows_or_reach_the_terminal() -> None:
    # Names come from URLs through lock_view: an outsider can plant any of these.
    locks.acquire("evil\nfake-row", ttl=30, holder="worker\x1b[2J")
    locks.acquire("invoice\u202efdp.exe", ttl=30, holder="tab\there\u200b")  # Cc and Cf
    locks.acquire("back\\nslash", ttl=30, holder="w")  # a backslash, then "n"
    out, _ = run("list")
    assert all(char.isprintable() for char in out.replace("\n", ""))
    lines = out.splitlines()
    assert len(lines) == 4, "one line per lock, and the header"
    assert sorted(line.split()[:2] for line in lines[1:]) == [
        ["back\\\\nslash", "w"],
        ["evil\\nfake-row", "worker\\x1b[2J"],
        ["invoice\\u202efdp.exe", "tab\\there\\u200b"],
    ]


def test_list_lines_up_columns_by_terminal_cells_with_wide_and_combining_characters() -> None:
    # A CJK character or an emoji takes two cells of a terminal, a combining accent none:
    # padding by len() pushed the columns after such a value out of line. The NAME column
    # is 11 cells wide ("plain:12345"), HOLDER 6 ("HOLDER"; "工人" takes 4), COUNT 5.
    expected = {
        "注文:42": "注文:42" + " " * 4 + "  w     ",  # 2 + 2 + 3 cells
        "cafe\u0301:1": "cafe\u0301:1" + " " * 5 + "  w     ",  # 6 cells in 7 characters
        "\U0001f512:9": "\U0001f512:9" + " " * 7 + "  w     ",  # an emoji: 2 cells
        "\u2764\ufe0f:3": "\u2764\ufe0f:3" + " " * 7 + "  w     ",  # U+FE0F: emoji, 2 cells
        "plain:12345": "plain:12345  工人  ",
    }
    for name in expected:
        locks.acquire(name, ttl=30, holder="工人" if name == "plain:12345" else "w")
    lines = run("list")[0].splitlines()
    # (TOKEN is as wide as the tokens the test run has drawn so far.)
    assert lines[0].startswith("NAME       " + "  HOLDER  COUNT  ")
    assert lines[0].split()[3] == "TOKEN"
    assert len(lines) == 1 + len(expected)
    for line in lines[1:]:
        [name] = [name for name in expected if line.startswith(name + " ")]
        assert line.startswith(expected[name] + "      1  "), line


def test_list_shows_the_acquired_time_to_the_millisecond_with_zero_microseconds() -> None:
    locks.acquire("orders:whole", ttl=30, holder="worker")
    whole_second = datetime(2026, 11, 26, 0, 37, 17, tzinfo=UTC)
    Lock.objects.filter(name="orders:whole").update(acquired_at=whole_second)
    row = run("list")[0].splitlines()[1]
    assert row.startswith("orders:whole ") and " 2026-11-26 00:37:17.000 " in row


def test_break_with_yes_breaks_and_the_holder_gets_lock_lost() -> None:
    lease = locks.acquire("orders:9", ttl=30, holder="worker-9")
    out, _ = run("break", "orders:9", "--yes")
    assert f"Broke lock 'orders:9' (holder 'worker-9', token {lease.token})." in out
    assert not Lock.objects.exists()
    with pytest.raises(locks.LockLost):
        lease.release()


@pytest.mark.parametrize("flag", ["--no-input", "--noinput"])
def test_break_takes_djangos_no_input_flag_as_yes(flag: str) -> None:
    # As manage.py flush --no-input: no prompt, the destructive action goes ahead.
    lease = locks.acquire("orders:9", ttl=30, holder="worker-9")
    out, _ = run("break", "orders:9", flag)
    assert f"Broke lock 'orders:9' (holder 'worker-9', token {lease.token})." in out
    assert not Lock.objects.exists()


def test_verbosity_0_leaves_out_what_break_and_reap_did_but_not_errors() -> None:
    # For cron: -v 0 prints nothing when all went well, as Django's own commands.
    locks.acquire("orders:9", ttl=30, holder="worker-9")
    expired("orders:old")
    assert run("break", "orders:9", "--yes", "-v", "0") == ("", "")
    assert run("reap", "-v", "0") == ("", "")
    assert run("reap", "-v", "1")[0].strip() == "Reaped 0 expired lock(s)."
    assert not Lock.objects.exists()
    with pytest.raises(CommandError, match="1 of 1 lock"):
        run("break", "orders:gone", "--yes", "-v", "0")
    # The listing is what list is for: -v 0 keeps it.
    locks.acquire("orders:10", ttl=30, holder="worker-10")
    assert "orders:10" in run("list", "-v", "0")[0]


def test_break_with_yes_names_the_holding_it_broke_when_the_lock_changed_hands() -> None:
    old = locks.acquire("orders:10", ttl=30, holder="worker-old")
    taken: list[locks.Lease] = []

    def hand_over_after_the_read(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        result = execute(sql, params, many, context)
        if not taken and "locks_lock" in sql and sql.lstrip().upper().startswith("SELECT"):
            old.release()  # on the app's own connection, not this one
            taken.append(locks.acquire("orders:10", ttl=30, holder="worker-new"))
        return result

    with connection.execute_wrapper(hand_over_after_the_read):
        out, _ = run("break", "orders:10", "--yes")
    new = taken[0]
    assert new.token > old.token
    assert f"Broke lock 'orders:10' (holder 'worker-new', token {new.token})." in out
    assert not Lock.objects.exists()


def test_break_reports_unknown_names_and_exits_1() -> None:
    locks.acquire("orders:9", ttl=30, holder="worker-9")
    with pytest.raises(CommandError) as caught:
        call_command("locks", "break", "orders:9", "nope", "--yes", stdout=io.StringIO())
    assert caught.value.returncode == 1
    assert "'nope'" in str(caught.value)
    assert not Lock.objects.exists(), "the known name is still broken"


@pytest.mark.parametrize("bad", ["", "a\x00b", "x" * 256])
def test_break_refuses_bad_names_and_breaks_nothing(bad: str) -> None:
    lease = locks.acquire("orders:9", ttl=30, holder="worker-9")
    code, message = fails("break", "orders:9", bad, "--yes")
    assert code == 2 and "no lock was broken" in message
    assert Lock.objects.get().token == lease.token


def test_break_without_yes_and_without_a_terminal_refuses() -> None:
    lease = locks.acquire("orders:9", ttl=30, holder="worker-9")
    code, message = fails("break", "orders:9", stdin=io.StringIO("y\n"))
    assert code == 2 and "--yes" in message
    assert Lock.objects.get().token == lease.token


def test_break_on_a_terminal_asks_first() -> None:
    lease = locks.acquire("orders:9", ttl=30, holder="worker-9")
    out = io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("locks", "break", "orders:9", stdin=Terminal("n\n"), stdout=out)
    assert caught.value.returncode == 1
    assert "worker-9" in out.getvalue() and "Break 1 lock(s)?" in out.getvalue()
    assert Lock.objects.get().token == lease.token

    out_text, _ = run("break", "orders:9", stdin=Terminal("y\n"))
    assert "Broke lock 'orders:9'" in out_text
    assert not Lock.objects.exists()


def test_reap_deletes_expired_rows_only() -> None:
    expired("orders:old1")
    expired("orders:old2")
    locks.acquire("orders:live", ttl=30, holder="worker")
    assert run("reap", "--batch-size", "1")[0].strip() == "Reaped 2 expired lock(s)."
    assert list(Lock.objects.values_list("name", flat=True)) == ["orders:live"]


def test_reap_leaves_the_database_to_waiting_writers_between_batches_where_they_poll() -> None:
    for number in range(4):
        expired(f"orders:old{number}")
    statements: list[tuple[str, float, float]] = []

    def timed(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        started = time.monotonic()
        try:
            return execute(sql, params, many, context)
        finally:
            statements.append((sql.strip(), started, time.monotonic()))

    with locks.connection.get(conf.DATABASE).execute_wrapper(timed):
        assert run("reap", "--batch-size", "1")[0].strip() == "Reaped 4 expired lock(s)."
    assert sum(sql.startswith("DELETE") for sql, _, _ in statements) == 5  # the 5th: short
    if for_connection(connection).writers_poll:
        # SQLite: a batch holds the file's write lock from its BEGIN IMMEDIATE to its
        # COMMIT; before the next batch reads its busy timeout, a pause as long.
        held = [end for sql, _, end in statements if sql == "BEGIN IMMEDIATE"]
        done = [end for sql, _, end in statements if sql == "COMMIT"]
        following = [start for sql, start, _ in statements if sql == "PRAGMA busy_timeout"]
        assert len(held) == len(done) == len(following) == 5
        for begin, commit, after in zip(held, done, following[1:], strict=False):
            assert after - commit >= commit - begin
    assert not Lock.objects.exists()


@pytest.mark.parametrize("batch", ["0", "-5", "2000000"])
def test_reap_refuses_bad_batch_sizes(batch: str) -> None:
    expired("orders:old")
    assert fails("reap", "--batch-size", batch)[0] == 2
    assert Lock.objects.count() == 1


def test_unknown_database_alias_is_a_usage_error() -> None:
    code, message = fails("list", "--database", "nope")
    assert code == 2 and "nope" in message


@contextmanager
def lock_table_away(alias: str) -> Iterator[None]:
    """Rename ``alias``'s lock table for the block, as if it had never been migrated.

    A committed rename, so the app's own connection (``reap``) misses the table too, on
    every database (MariaDB cannot roll back DDL).
    """
    connection = connections[alias]
    table, away = (connection.ops.quote_name(n) for n in ("locks_lock", "locks_lock_away"))
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME TO {away}")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {away} RENAME TO {table}")


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.parametrize("args", [["list"], ["break", "orders:1", "--yes"], ["reap"]])
def test_a_database_without_the_lock_table_says_to_migrate_and_exits_3(args: list[str]) -> None:
    locks.acquire("orders:1", ttl=30, holder="worker")  # on "default", which stays
    with lock_table_away("other"):
        code, message = fails(*args, "--database", "other")
    assert code == 3
    assert "'other'" in message and "manage.py migrate locks --database other" in message
    assert Lock.objects.get().holder == "worker"


def manage(*args: str, stdout: int = subprocess.PIPE) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py locks ARGS``; its output captured, or into the file descriptor
    ``stdout``."""
    return subprocess.run(
        [sys.executable, "manage.py", "locks", *args],
        cwd=ROOT,
        env=worker_env(),
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_exit_codes_of_the_real_command() -> None:
    lease = locks.acquire("orders:cli", ttl=30, holder="worker-cli")
    listed = manage("list")
    assert listed.returncode == 0 and "worker-cli" in listed.stdout
    refused = manage("break", "orders:cli")  # stdin is not a terminal
    assert refused.returncode == 2 and "--yes" in refused.stderr
    unknown = manage("break", "nope", "--yes")
    assert unknown.returncode == 1 and "Unknown lock name(s): 'nope'" in unknown.stderr
    assert manage().returncode == 2  # no subcommand: argparse usage error
    assert manage("reap", "--batch-size", "0").returncode == 2
    assert Lock.objects.get().token == lease.token
    with lock_table_away("other"):
        unmigrated = manage("list", "--database", "other")
    assert unmigrated.returncode == 3 and "migrate locks --database other" in unmigrated.stderr
    broken = manage("break", "orders:cli", "--yes")
    assert broken.returncode == 0 and "Broke lock 'orders:cli'" in broken.stdout
    assert not Lock.objects.exists()


def manage_on_a_terminal(*args: str, keys: bytes) -> tuple[int, str]:
    """Run ``manage.py locks ARGS`` on a terminal of its own; type ``keys`` at its prompt.

    A pseudo-terminal that is the command's controlling terminal (``setsid --ctty``), so
    Ctrl-C (``\\x03``) reaches it as the SIGINT an operator's terminal sends, and Ctrl-D
    (``\\x04``) is the end of file it makes. Returns the exit code (negative: killed by
    that signal) and all that the terminal showed.
    """
    main, side = os.openpty()
    process = subprocess.Popen(
        ["setsid", "--ctty", sys.executable, "manage.py", "locks", *args, "--no-color"],
        cwd=ROOT,
        env=worker_env(),
        stdin=side,
        stdout=side,
        stderr=side,
    )
    os.close(side)
    shown = b""
    deadline = time.monotonic() + 120
    try:
        typed = False
        while time.monotonic() < deadline:
            if not typed and b"[y/N] " in shown:
                # Only once it waits in its read: a SIGINT that comes between the prompt's
                # write and the read runs its handler only when the read returns (as no
                # hand can type that fast, only a test sees it: the command waits for good).
                wait_until_blocked(process.pid)
                os.write(main, keys)
                typed = True
            ready, _, _ = select.select([main], [], [], 1)
            if ready:
                try:
                    chunk = os.read(main, 4096)
                except OSError:  # EIO: the command ended, the terminal is closed
                    break
                if not chunk:
                    break
                shown += chunk
        return process.wait(timeout=max(1.0, deadline - time.monotonic())), shown.decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(main)


@pytest.mark.parametrize("key", ["\x03", "\x04"], ids=["ctrl-c", "ctrl-d"])
def test_break_interrupted_or_ended_at_the_prompt_breaks_nothing_and_says_so(key: str) -> None:
    # As createsuperuser's prompt: a message and exit code 1, not a traceback (Ctrl-C),
    # and the message on a line of its own, not after the prompt (either key).
    lease = locks.acquire("orders:14", ttl=60, holder="worker-14")
    code, shown = manage_on_a_terminal("break", "orders:14", keys=key.encode())
    assert "Break 1 lock(s)?" in shown
    assert code == 1, shown
    assert "Traceback" not in shown and "KeyboardInterrupt" not in shown
    [said] = [line for line in shown.splitlines() if "no lock was broken" in line]
    assert said.startswith("CommandError: aborted"), shown
    assert Lock.objects.get(name="orders:14").token == lease.token
    lease.release()


def wait_until_blocked(pid: int, seconds: float = 60) -> None:
    """Wait until process ``pid`` has slept for 0.8 s on end: a command that has
    started up and now waits (for a row lock, or a busy SQLite file)."""
    deadline = time.monotonic() + seconds
    asleep_since = None
    while time.monotonic() < deadline:
        # The state follows the command's name, which is in parentheses.
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state != "S":
            asleep_since = None
        elif asleep_since is None:
            asleep_since = time.monotonic()
        elif time.monotonic() - asleep_since > 0.8:
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} never waited")


def interrupted_while_blocked(blocker: Holding, *args: str) -> tuple[int, str, str]:
    """Run ``manage.py locks ARGS``, send it SIGINT (Ctrl-C) once it waits behind
    ``blocker``; exit code, stdout, stderr."""
    try:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "locks", *args],
            cwd=ROOT,
            env=worker_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_until_blocked(process.pid)
        process.send_signal(signal.SIGINT)
        # psycopg cancels the statement at once; mysqlclient and sqlite3 see the interrupt
        # only once the statement has run, so the blocker then lets it run.
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=1)
        blocker.end()
        out, err = process.communicate(timeout=120)
    finally:
        blocker.end()
        blocker.join(30)
    return process.returncode, out, err


def test_break_interrupted_while_it_waits_says_what_is_left_without_a_traceback(
    backend: str,
) -> None:
    # Newest first: "orders:15" is broken first, and waits for a transaction on its row
    # (on SQLite, on the file); Ctrl-C comes meanwhile.
    other = locks.acquire("orders:16", ttl=60, holder="worker-16")
    lease = locks.acquire("orders:15", ttl=60, holder="worker-15")
    code, out, err = interrupted_while_blocked(
        hold_write_lock("orders:15", 8.0), "break", "orders:15", "orders:16", "--yes"
    )
    assert code == 1, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert (
        "CommandError: interrupted while breaking lock 'orders:15', which may or may not be "
        "broken now; not broken: 'orders:16'"
    ) in err
    assert "orders:16" not in out
    assert Lock.objects.get(name="orders:16").token == other.token
    if backend == "postgresql":
        # psycopg cancels the statement on Ctrl-C; mysqlclient and sqlite3 let Python see
        # the interrupt only once the statement has run.
        assert Lock.objects.get(name="orders:15").token == lease.token
    other.release()


def test_reap_interrupted_while_it_waits_exits_1_without_a_traceback() -> None:
    expired("orders:17")
    code, out, err = interrupted_while_blocked(hold_table_lock(8.0), "reap")
    assert code == 1, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "CommandError: reap: interrupted" in err
    assert "Reaped" not in out


def manage_into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``manage.py locks ARGS`` with its output into a pipe nobody reads any more.

    As ``manage.py locks list | head -1`` once ``head`` has exited: every write fails
    with EPIPE.
    """
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return manage(*args, stdout=writer)
    finally:
        os.close(writer)


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize(
    "args", [["list"], ["list", "--json"], ["break", "orders:15", "--yes"], ["reap"]]
)
def test_output_into_a_closed_pipe_ends_quietly_as_unix_tools_do(
    args: list[str], buffered: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "locks list | head -1": no BrokenPipeError traceback, and the exit code of a tool
    # that SIGPIPE ended (128 + 13), so that "set -o pipefail" still sees it. Buffered
    # (output into a pipe, by default): the write fails as the command ends; unbuffered
    # (PYTHONUNBUFFERED): at once.
    if buffered:
        monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    else:
        monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    locks.acquire("orders:15", ttl=60, holder="worker-15")
    ended = manage_into_a_closed_pipe(*args)
    assert ended.returncode == 141, ended.stderr
    assert "Traceback" not in ended.stderr and "BrokenPipeError" not in ended.stderr


def test_a_failure_with_output_into_a_closed_pipe_keeps_its_message_and_exit_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The reader of the output gone is no reason to hide why the command failed: the
    # CommandError's message and exit code, not the 141 of a closed pipe. (Output into a
    # pipe is buffered, as it is unless PYTHONUNBUFFERED is set, so the write fails once
    # the command has ended.)
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    locks.acquire("orders:19", ttl=60, holder="worker-19")
    ended = manage_into_a_closed_pipe("break", "orders:19", "orders:nope", "--yes")
    assert ended.returncode == 1, ended.stderr
    assert "Unknown lock name(s): 'orders:nope'." in ended.stderr
    assert "1 of 2 lock(s) not broken" in ended.stderr and "Traceback" not in ended.stderr
    assert not Lock.objects.filter(name="orders:19").exists()


class FailsAfterItsOutput(Command):
    """``locks list`` that fails once its table is written, as a lost server would.

    No real failure comes reliably between an output and the end of the command.
    """

    def _list(self, alias: str, options: dict[str, Any]) -> None:
        super()._list(alias, options)
        raise RuntimeError("the server went away")


def test_an_error_after_output_into_a_closed_pipe_is_raised_not_hidden(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An unexpected error keeps its traceback (and exit code 1) on the command line; the
    # output it could not write is dropped, so the exit does not fail on it again.
    locks.acquire("orders:20", ttl=60, holder="worker-20")
    reader, writer = os.pipe()
    os.close(reader)
    with open(writer, "w") as closed:
        monkeypatch.setattr(sys, "stdout", closed)
        with pytest.raises(RuntimeError, match="the server went away"):
            FailsAfterItsOutput().run_from_argv(["manage.py", "locks", "list", "--skip-checks"])
        closed.write("more")
        closed.flush()  # into os.devnull now


class HandOverOnAnswer(Terminal):
    """A terminal whose user answers "y" after the lock shown changed hands."""

    def __init__(self, old: locks.Lease) -> None:
        super().__init__("y\n")
        self.old = old
        self.new: locks.Lease | None = None

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]  # typeshed
        self.old.release()
        self.new = locks.acquire(self.old.name, ttl=30, holder="worker-new")
        return super().readline()


def test_break_after_a_prompt_leaves_a_holding_that_took_the_lock_meanwhile() -> None:
    # The user agreed to break the holding on the screen, not the one that came after it.
    old = locks.acquire("orders:11", ttl=30, holder="worker-old")
    stdin = HandOverOnAnswer(old)
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("locks", "break", "orders:11", stdin=stdin, stdout=out, stderr=err)
    assert caught.value.returncode == 1
    assert "worker-old" in out.getvalue() and "Broke" not in out.getvalue()
    assert "released or taken again meanwhile" in err.getvalue()
    assert stdin.new is not None
    assert Lock.objects.get(name="orders:11").token == stdin.new.token
    stdin.new.release()


def test_break_of_a_lock_released_after_the_read_exits_1() -> None:
    lease = locks.acquire("orders:12", ttl=30, holder="worker")
    other = locks.acquire("orders:13", ttl=30, holder="worker")

    def release_after_the_read(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        result = execute(sql, params, many, context)
        if lease.held and "locks_lock" in sql and sql.lstrip().upper().startswith("SELECT"):
            lease.release()  # on the app's own connection, not this one
        return result

    out, err = io.StringIO(), io.StringIO()
    with connection.execute_wrapper(release_after_the_read), pytest.raises(CommandError) as caught:
        call_command("locks", "break", "orders:12", "orders:13", "--yes", stdout=out, stderr=err)
    assert caught.value.returncode == 1 and "1 of 2 lock(s) not broken: 'orders:12'" in str(
        caught.value
    )
    assert "Broke lock 'orders:13'" in out.getvalue()
    assert "Lock 'orders:12' was released or taken again meanwhile." in err.getvalue()
    assert "Unknown" not in err.getvalue()
    assert not Lock.objects.exists()
    with pytest.raises(locks.LockLost):
        other.release()


@pytest.mark.parametrize("args", [["list"], ["break", "orders:1", "--yes"], ["reap"]])
def test_a_database_error_other_than_a_missing_table_is_not_called_unmigrated(
    args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import OperationalError

    def down(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("server closed the connection unexpectedly")

    command = "locks.management.commands.locks"
    for name in ("_rows", "reap_expired"):
        monkeypatch.setattr(f"{command}.{name}", down)
    with pytest.raises(OperationalError, match="server closed the connection"):
        run(*args)


@pytest.mark.parametrize("subcommand", [["list"], ["break", "orders:none", "--yes"], ["reap"]])
def test_djangos_own_options_are_taken_after_the_subcommand_too(subcommand: list[str]) -> None:
    # Where every other command takes them: manage.py locks list --settings=... -v 0.
    common = ["-v", "0", "--no-color", "--traceback", "--skip-checks"]
    common += ["--settings", "tests.settings", "--pythonpath", str(ROOT)]
    try:
        run(*subcommand, *common)
    except CommandError as exc:
        assert exc.returncode == 1 and "'orders:none'" in str(exc)  # break: unknown name
    # Read, not only accepted: Django refuses this pair wherever it is given.
    assert "can't be used together" in fails(*subcommand, "--no-color", "--force-color")[1]


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_djangos_own_options_after_the_subcommand_take_effect() -> None:
    listed = manage("list", "--settings", "tests.settings")
    assert listed.returncode == 0 and listed.stdout.strip() == "No held locks."
    failed = manage("list", "--database", "nope", "--traceback")
    assert failed.returncode != 0 and "Traceback" in failed.stderr
    quiet = manage("list", "--database", "nope")
    assert quiet.returncode == 2 and "Traceback" not in quiet.stderr


def test_break_without_yes_and_with_stdin_closed_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    # What Python makes of a closed file descriptor 0 (a daemon, "<&-"): no sys.stdin.
    lease = locks.acquire("orders:9", ttl=30, holder="worker-9")
    monkeypatch.setattr(sys, "stdin", None)
    code, message = fails("break", "orders:9")
    assert code == 2 and "--yes" in message
    assert Lock.objects.get().token == lease.token


@pytest.mark.django_db(transaction=True, databases=["default", "manual"])
@pytest.mark.parametrize("args", [["list"], ["break", "orders:1", "--yes"], ["reap"]])
def test_an_alias_without_autocommit_and_the_lock_table_says_to_migrate_too(
    args: list[str],
) -> None:
    # "manual" mirrors "default" with AUTOCOMMIT = False: on PostgreSQL the failed read
    # leaves its transaction aborted, where no other statement runs until a rollback.
    with lock_table_away("default"):
        code, message = fails(*args, "--database", "manual")
    assert code == 3 and "manage.py migrate locks --database manual" in message


@pytest.mark.parametrize("where", ["option", "sys.stdin"])
def test_break_without_yes_and_with_a_closed_stdin_file_refuses(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file object that was closed (by the caller, or sys.stdin closed by the program):
    # asking it whether it is a terminal raises ValueError, it cannot answer a prompt.
    lease = locks.acquire("orders:9", ttl=30, holder="worker-9")
    with open(os.devnull) as closed:
        pass
    options: dict[str, Any] = {"stdin": closed} if where == "option" else {}
    if where == "sys.stdin":
        monkeypatch.setattr(sys, "stdin", closed)
    code, message = fails("break", "orders:9", **options)
    assert code == 2 and "--yes" in message and "no lock was broken" in message
    assert Lock.objects.get().token == lease.token


#: One character of each kind that acts on a terminal or reorders what it shows: C0 (an
#: escape sequence, a carriage return), DEL, C1 (CSI, which some terminals take as ESC [),
#: the bidi embeddings, overrides and isolates, a line separator, and private use.
SPOOFING = (
    "\x1b[2J\r\x7f\x9b2J\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\U000f0000"
)


def raw_controls(text: str) -> set[str]:
    """The characters of ``text`` that would reach a terminal as they are (but line ends)."""
    return {char for char in text if not char.isprintable() and char != "\n"}


def test_list_json_escapes_control_and_bidi_characters_and_round_trips() -> None:
    name, holder, note = f"zamówienie{SPOOFING}fdp.exe", f"worker{SPOOFING}", f"by{SPOOFING}"
    locks.acquire(name, ttl=30, holder=holder, note=note)
    out, _ = run("list", "--json")
    assert raw_controls(out) == set()
    assert "\\u009b" in out and "\\u202e" in out and "\\udb80\\udc00" in out
    assert "zamówienie" in out, "printable text stays as it is, not \\u escapes"
    [row] = json.loads(out)
    assert (row["name"], row["holder"], row["note"]) == (name, holder, note)


def test_table_prompt_and_messages_show_control_and_bidi_characters_escaped() -> None:
    name, holder = f"invoice{SPOOFING}fdp.exe", f"worker{SPOOFING}"
    locks.acquire(name, ttl=30, holder=holder)
    listed, _ = run("list")
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError) as caught:  # the unknown name: exit code 1
        call_command(
            "locks", "break", name, f"nope{SPOOFING}", stdin=Terminal("y\n"), stdout=out, stderr=err
        )
    shown = out.getvalue()
    assert "Break 1 lock(s)?" in shown and "Broke lock" in shown
    for text in (listed, shown, err.getvalue(), str(caught.value)):
        assert raw_controls(text) == set()
        assert "\\x1b[2J\\r\\x7f\\x9b2J\\u202a" in text and "\\u2069\\u2028\\U000f0000" in text
    assert not Lock.objects.exists()


def test_a_bad_locks_setting_met_by_break_is_a_command_error_not_a_traceback() -> None:
    # manage.py check reports it, but --skip-checks (and call_command) go past the checks.
    first = locks.acquire("orders:16", ttl=30, holder="worker")
    second = locks.acquire("orders:17", ttl=30, holder="worker")
    with override_settings(LOCKS={"TRANSIENT_RETRIES": -1}):
        code, message = fails("break", "orders:16", "orders:17", "--yes")
    assert code == 1
    assert "LOCKS['TRANSIENT_RETRIES']" in message
    assert "'orders:16'" in message and "'orders:17'" in message, "what was not broken"
    assert locks.check_token("orders:16", first.token)
    assert locks.check_token("orders:17", second.token)


def test_a_bad_locks_setting_met_by_the_real_command_exits_1_without_a_traceback(
    tmp_path: Path,
) -> None:
    lease = locks.acquire("orders:16", ttl=30, holder="worker")
    (tmp_path / "bad_locks_settings.py").write_text(
        'from tests.settings import *  # noqa: F403\n\nLOCKS = {"TRANSIENT_RETRIES": -1}\n'
    )
    flags = ["--settings", "bad_locks_settings", "--pythonpath", str(tmp_path), "--skip-checks"]
    ended = manage("break", "orders:16", "--yes", *flags)
    assert ended.returncode == 1, ended.stderr
    assert "LOCKS['TRANSIENT_RETRIES']" in ended.stderr and "Traceback" not in ended.stderr
    assert locks.check_token("orders:16", lease.token)


@pytest.mark.skipif(BACKEND != "sqlite", reason="SQLite's one writer per file")
@pytest.mark.parametrize("args", [["break", "orders:18", "--yes"], ["reap"]])
def test_a_lock_error_is_a_command_error_not_a_traceback(args: list[str]) -> None:
    # A lock call refused (LockError): here, under a transaction of the caller's own on
    # the SQLite file of the locks, which the lock call would wait for forever.
    lease = locks.acquire("orders:18", ttl=30, holder="worker")
    with transaction.atomic(), pytest.raises(CommandError) as caught:
        run(*args)
    assert caught.value.returncode == 1
    assert "cannot run while this thread's transaction" in str(caught.value)
    assert locks.check_token("orders:18", lease.token)
