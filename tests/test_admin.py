"""The Lock admin: read-only list by the database clock, break (with permission) and reap."""

from __future__ import annotations

import html
import json
import re
import time
from typing import Any

import pytest
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.urls import reverse

import locks
from locks.models import Lock
from tests import forms

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "/admin/locks/lock/"


def staff(username: str, *perms: str) -> Client:
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=perms))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def superuser() -> Client:
    User.objects.create_superuser("root", password="pw")
    client = Client()
    client.login(username="root", password="pw")
    return client


def shown(response: Any) -> str:
    """The page's text as the browser shows it (Django escapes quotes, for one)."""
    page: bytes = response.content
    return html.unescape(page.decode())


def cells(html: str, column: str) -> list[str]:
    start, end = r"(?:<a [^>]*>)?(?:<bdi>)?", r"(?:</bdi>)?(?:</a>)?"  # link, isolation
    pattern = rf'<t[dh] class="field-{column}"[^>]*>{start}(.*?){end}</t[dh]>'
    return re.findall(pattern, html)


def expired(name: str, holder: str) -> locks.Lease:
    lease = locks.acquire(name, ttl=0.05, holder=holder)
    time.sleep(0.2)
    return lease


def test_list_shows_holder_count_token_and_time_left_by_the_database_clock(
    superuser: Client,
) -> None:
    old = expired("jobs:old", "worker-old")
    live = locks.acquire("jobs:live", ttl=30, holder="worker-live")
    locks.acquire("jobs:live", ttl=30, holder="worker-live")  # re-entry: count 2
    html = superuser.get(CHANGELIST).content.decode()

    assert cells(html, "name") == ["jobs:live", "jobs:old"]  # newest first
    assert cells(html, "holder") == ["worker-live", "worker-old"]
    assert cells(html, "count") == ["2", "1"]
    assert cells(html, "token") == [str(live.token), str(old.token)]
    assert cells(html, "state") == ["held", "expired"]
    left = [float(v) for v in cells(html, "expires_in")]
    assert 0 < left[0] <= 30 and left[1] < 0


def test_name_and_holder_columns_have_their_headers_and_sort(superuser: Client) -> None:
    # Shown through <bdi>, they are still the model's columns: header, CSS class, sorting.
    locks.acquire("jobs:b", ttl=30, holder="worker-a")
    locks.acquire("jobs:a", ttl=30, holder="worker-c")
    locks.acquire("jobs:c", ttl=30, holder="worker-b")
    page = superuser.get(CHANGELIST).content.decode()
    for column, index, label in [("name", 1, "Name"), ("holder", 2, "Holder")]:
        header = rf'<th scope="col" class="sortable column-{column}">.*?</th>'
        [found] = re.findall(header, page, re.S)
        # (Django 6 gives the link role="button" too.)
        assert re.search(rf'<a [^>]*href="\?o={index}\.[-.\d]*">{label}</a>', found), found
    by_name = superuser.get(CHANGELIST + "?o=1").content.decode()
    assert cells(by_name, "name") == ["jobs:a", "jobs:b", "jobs:c"]
    by_holder = superuser.get(CHANGELIST + "?o=-2").content.decode()
    assert cells(by_holder, "holder") == ["worker-c", "worker-b", "worker-a"]


def test_filter_by_state_and_search_by_name_and_holder(superuser: Client) -> None:
    expired("jobs:old", "worker-old")
    locks.acquire("jobs:live", ttl=30, holder="worker-live")
    assert cells(superuser.get(CHANGELIST + "?state=held").content.decode(), "name") == [
        "jobs:live"
    ]
    assert cells(superuser.get(CHANGELIST + "?state=expired").content.decode(), "name") == [
        "jobs:old"
    ]
    assert cells(superuser.get(CHANGELIST + "?q=worker-old").content.decode(), "name") == [
        "jobs:old"
    ]
    assert cells(superuser.get(CHANGELIST + "?q=live").content.decode(), "name") == ["jobs:live"]


def test_rows_are_read_only_and_cannot_be_added_or_deleted(superuser: Client) -> None:
    locks.acquire("jobs:ro", ttl=30, holder="worker")
    assert superuser.get("/admin/locks/lock/add/").status_code == 403
    change = superuser.get("/admin/locks/lock/jobs:ro/change/")
    assert change.status_code == 200
    assert b'name="holder"' not in change.content and b"worker" in change.content
    assert superuser.post("/admin/locks/lock/jobs:ro/change/", {"holder": "x"}).status_code == 403
    assert superuser.post("/admin/locks/lock/jobs:ro/delete/", {"post": "yes"}).status_code == 403
    assert b"delete_selected" not in superuser.get(CHANGELIST).content
    assert Lock.objects.get(name="jobs:ro").holder == "worker"


def action(name: str, *selected: str, **extra: Any) -> dict[str, Any]:
    return {"action": name, "_selected_action": list(selected), "index": 0, **extra}


def test_staff_without_break_permission_sees_no_action_and_gets_403() -> None:
    lease = locks.acquire("jobs:guarded", ttl=30, holder="worker")
    viewer = staff("viewer", "view_lock")
    page = viewer.get(CHANGELIST)
    assert page.status_code == 200 and b"jobs:guarded" in page.content
    assert b"break_locks" not in page.content and b"reap_expired" not in page.content

    for name in ("break_locks", "reap_expired"):
        assert viewer.post(CHANGELIST, action(name, "jobs:guarded")).status_code == 403
    confirm = {"post": "yes", "holding": f"{lease.token} jobs:guarded"}
    forged = viewer.post(CHANGELIST, action("break_locks", "jobs:guarded", **confirm))
    assert forged.status_code == 403
    # Django runs the action at the form's index; a guard reading the last value is fooled.
    twice = action("break_locks", "jobs:guarded", **confirm)
    twice["action"] = ["break_locks", ""]
    assert viewer.post(CHANGELIST, twice).status_code == 403
    assert Lock.objects.filter(name="jobs:guarded", token=lease.token).exists()
    assert not LogEntry.objects.exists()
    lease.release()


def test_break_asks_for_confirmation_then_breaks_and_logs_holder_and_token() -> None:
    lease = locks.acquire("jobs:stuck", ttl=30, holder="worker-stuck")
    breaker = staff("breaker", "view_lock", "break_lock")
    assert b"break_locks" in breaker.get(CHANGELIST).content

    page = breaker.post(CHANGELIST, action("break_locks", "jobs:stuck"))
    assert page.status_code == 200
    assert "admin/locks/lock/break_confirmation.html" in [t.name for t in page.templates]
    html = page.content.decode()
    assert "worker-stuck" in html
    assert json.loads(form_fields(html)["holdings"][0]) == [f"{lease.token} jobs:stuck"]
    assert locks.is_locked("jobs:stuck"), "nothing is broken before the confirmation"

    confirm = {"post": "yes", "holding": f"{lease.token} jobs:stuck"}
    done = breaker.post(CHANGELIST, action("break_locks", "jobs:stuck", **confirm), follow=True)
    assert "Broke 1 lock(s): 'jobs:stuck'." in shown(done)
    assert not Lock.objects.filter(name="jobs:stuck").exists()
    entry = LogEntry.objects.get()
    assert (entry.action_flag, entry.object_id) == (DELETION, "jobs:stuck")
    assert "worker-stuck" in entry.change_message and str(lease.token) in entry.change_message
    assert entry.user_id == User.objects.get(username="breaker").pk
    with pytest.raises(locks.LockLost):
        lease.renew()
    with pytest.raises(locks.LockLost):
        lease.release()


def test_a_stale_confirmation_does_not_break_a_lock_taken_again() -> None:
    first = locks.acquire("jobs:again", ttl=30, holder="worker-1")
    breaker = staff("breaker", "view_lock", "break_lock")
    breaker.post(CHANGELIST, action("break_locks", "jobs:again"))  # page shows token 1
    first.release()
    second = locks.acquire("jobs:again", ttl=30, holder="worker-2")

    confirm = {"post": "yes", "holding": f"{first.token} jobs:again"}
    done = breaker.post(CHANGELIST, action("break_locks", "jobs:again", **confirm), follow=True)
    assert b"Left 1 lock(s) alone" in done.content
    assert Lock.objects.get(name="jobs:again").token == second.token
    assert not LogEntry.objects.exists()
    second.release()


@pytest.mark.parametrize("holding", ["", "jobs:bad", "x jobs:bad", "-1 jobs:bad", "12"])
def test_malformed_confirmation_breaks_nothing(holding: str) -> None:
    lease = locks.acquire("jobs:bad", ttl=30, holder="worker")
    breaker = staff("breaker", "view_lock", "break_lock")
    confirm = {"post": "yes", "holding": holding}
    done = breaker.post(CHANGELIST, action("break_locks", "jobs:bad", **confirm), follow=True)
    assert done.status_code == 200
    assert Lock.objects.filter(name="jobs:bad", token=lease.token).exists()
    assert not LogEntry.objects.exists()
    lease.release()


def test_reap_action_deletes_expired_rows_only() -> None:
    expired("jobs:old1", "w")
    expired("jobs:old2", "w")
    live = locks.acquire("jobs:live", ttl=30, holder="w")
    breaker = staff("breaker", "view_lock", "break_lock")
    done = breaker.post(CHANGELIST, action("reap_expired", "jobs:live"), follow=True)
    assert b"Reaped 2 expired lock(s)." in done.content
    assert list(Lock.objects.values_list("name", flat=True)) == ["jobs:live"]
    live.release()


@pytest.mark.usefixtures("atomic_requests")
def test_break_and_reap_work_under_atomic_requests() -> None:
    # On SQLite the request's transaction on the same file would make the lock calls
    # refuse to run (LockError, a 500) if the changelist ran in it.
    lease = locks.acquire("jobs:stuck", ttl=30, holder="worker-stuck")
    expired("jobs:old", "w")
    breaker = staff("breaker", "view_lock", "break_lock")
    confirm = {"post": "yes", "holding": f"{lease.token} jobs:stuck"}
    done = breaker.post(CHANGELIST, action("break_locks", "jobs:stuck", **confirm), follow=True)
    assert "Broke 1 lock(s): 'jobs:stuck'." in shown(done)
    assert not Lock.objects.filter(name="jobs:stuck").exists()
    assert LogEntry.objects.get().object_id == "jobs:stuck"

    live = locks.acquire("jobs:live", ttl=30, holder="w")
    done = breaker.post(CHANGELIST, action("reap_expired", "jobs:live"), follow=True)
    assert b"Reaped 1 expired lock(s)." in done.content
    assert list(Lock.objects.values_list("name", flat=True)) == ["jobs:live"]
    live.release()


@pytest.mark.usefixtures("atomic_requests")
def test_a_break_stays_logged_when_the_request_fails_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The break itself commits at once (the app's own connection): its log entry must
    # not go with a rolled-back request transaction.
    first = locks.acquire("jobs:a", ttl=30, holder="w")
    second = locks.acquire("jobs:b", ttl=30, holder="w")

    def break_then_crash(name: str, **kwargs: Any) -> bool:
        if name == "jobs:a":
            raise RuntimeError("the server went away")
        return locks.break_lock(name, **kwargs)

    monkeypatch.setattr("locks.admin.break_lock", break_then_crash)
    breaker = staff("breaker", "view_lock", "break_lock")
    breaker.raise_request_exception = False
    confirm = {"post": "yes", "holding": [f"{first.token} jobs:a", f"{second.token} jobs:b"]}
    assert (
        breaker.post(CHANGELIST, action("break_locks", "jobs:a", "jobs:b", **confirm)).status_code
        == 500
    )
    assert list(Lock.objects.values_list("name", flat=True)) == ["jobs:a"]
    assert LogEntry.objects.get().object_id == "jobs:b"  # newest first: broken before the crash
    first.release()


def test_a_lock_error_in_an_action_is_reported_not_a_500(monkeypatch: pytest.MonkeyPatch) -> None:
    # As SQLite raises it when a transaction of the project's own (a middleware's, say)
    # is open on the file of the locks.
    first = locks.acquire("jobs:a", ttl=30, holder="w")
    second = locks.acquire("jobs:b", ttl=30, holder="w")
    calls: list[str] = []

    def break_then_fail(name: str, **kwargs: Any) -> bool:
        calls.append(name)
        if len(calls) > 1:
            raise locks.LockError("one writer per file")
        return locks.break_lock(name, **kwargs)

    def fail(*args: Any, **kwargs: Any) -> int:
        raise locks.LockError("one writer per file")

    monkeypatch.setattr("locks.admin.break_lock", break_then_fail)
    monkeypatch.setattr("locks.admin.reap_expired", fail)
    breaker = staff("breaker", "view_lock", "break_lock")
    holdings = [f"{first.token} jobs:a", f"{second.token} jobs:b"]
    confirm = {"post": "yes", "holding": holdings}
    done = breaker.post(
        CHANGELIST, action("break_locks", "jobs:a", "jobs:b", **confirm), follow=True
    )
    assert done.status_code == 200
    html = done.content.decode()
    assert "Broke 1 lock(s): 'jobs:b'." in shown(done)  # newest first
    assert "Breaking locks stopped, the rest left as they are: one writer per file" in html
    assert "Left" not in html, "the lock not tried is not reported as changed"
    assert list(Lock.objects.values_list("name", flat=True)) == ["jobs:a"]
    assert LogEntry.objects.get().object_id == "jobs:b"

    done = breaker.post(CHANGELIST, action("reap_expired", "jobs:a"), follow=True)
    assert done.status_code == 200
    assert b"Could not reap expired locks: one writer per file" in done.content
    first.release()


@pytest.mark.parametrize(
    ("lookup", "name", "holder"),
    [
        ("iexact", "JOBS:nightly", "worker-A"),
        ("icontains", "S:NIGHT", "KER-"),
        ("istartswith", "jOBS", "WORKER"),
        ("iendswith", "NIGHTLY", "-a"),
    ],
)
def test_case_insensitive_lookups_fold_case_on_every_database(
    lookup: str, name: str, holder: str
) -> None:
    # MariaDB's columns compare byte for byte (the lock statements need that), which
    # would make Django's LIKE case-sensitive there.
    locks.acquire("Jobs:Nightly", ttl=30, holder="Worker-A")
    locks.acquire("other", ttl=30, holder="someone")
    assert list(
        Lock.objects.filter(**{f"name__{lookup}": name}).values_list("name", flat=True)
    ) == ["Jobs:Nightly"]
    assert list(
        Lock.objects.filter(**{f"holder__{lookup}": holder}).values_list("name", flat=True)
    ) == ["Jobs:Nightly"]
    # Exact comparison stays exact: the lock statements rely on it.
    assert not Lock.objects.filter(name="jobs:nightly").exists()
    assert not Lock.objects.filter(holder="worker-a").exists()


def test_admin_search_ignores_case(superuser: Client) -> None:
    locks.acquire("Jobs:Nightly", ttl=30, holder="Worker-A")
    assert cells(superuser.get(CHANGELIST + "?q=NIGHTLY").content.decode(), "name") == [
        "Jobs:Nightly"
    ]
    assert cells(superuser.get(CHANGELIST + "?q=worker-a").content.decode(), "name") == [
        "Jobs:Nightly"
    ]


def test_a_confirmed_break_leaves_a_lock_taken_again_after_the_page_read_it() -> None:
    # The token on the page matches the row the action reads; the holding changes hands
    # just after that read: only break_lock(token=...) keeps the new holder's lock.
    first = locks.acquire("jobs:race", ttl=30, holder="worker-1")
    taken: list[locks.Lease] = []

    def hand_over_after_the_read(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        result = execute(sql, params, many, context)
        text = sql.lower()
        if not taken and "locks_lock" in text and "token" in text and "count(" not in text:
            first.release()  # on the app's own connection, not this one
            taken.append(locks.acquire("jobs:race", ttl=30, holder="worker-2"))
        return result

    breaker = staff("breaker", "view_lock", "break_lock")
    confirm = {"post": "yes", "holding": f"{first.token} jobs:race"}
    with connection.execute_wrapper(hand_over_after_the_read):
        done = breaker.post(CHANGELIST, action("break_locks", "jobs:race", **confirm), follow=True)
    assert taken, "the action read the row"
    assert b"Left 1 lock(s) alone" in done.content
    assert Lock.objects.get(name="jobs:race").token == taken[0].token
    assert not LogEntry.objects.exists()
    taken[0].release()


def test_a_lock_released_before_the_confirmation_is_reported_as_left_alone() -> None:
    lease = locks.acquire("jobs:gone", ttl=30, holder="worker")
    other = locks.acquire("jobs:other", ttl=30, holder="worker")
    breaker = staff("breaker", "view_lock", "break_lock")
    confirm = {"post": "yes", "holding": f"{lease.token} jobs:gone"}
    lease.release()
    done = breaker.post(CHANGELIST, action("break_locks", "jobs:gone", **confirm), follow=True)
    assert done.status_code == 200
    assert (
        "Left 1 lock(s) alone: released or taken again since the page was shown: 'jobs:gone'."
    ) in shown(done)
    assert b"Broke" not in done.content
    assert list(Lock.objects.values_list("name", flat=True)) == ["jobs:other"]
    other.release()


def form_fields(html: str) -> dict[str, list[str]]:
    """The fields a browser posts from the page's forms that post back to the page itself."""
    return forms.form_fields(html, lambda form: "action" not in form)  # not the logout form


def test_breaking_every_lock_selected_across_pages_confirms_within_the_post_field_limit(
    superuser: Client, settings: Any
) -> None:
    # "Select all N" across the changelist's pages posts select_across, not N ids; the
    # confirmation page then lists all N, and what it posts back must stay within
    # DATA_UPLOAD_MAX_NUMBER_FIELDS, or the confirmation is refused with a 400.
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 100
    leases = [locks.acquire(f"jobs:many-{i:03}", ttl=60, holder="worker") for i in range(60)]
    chosen = action("break_locks", leases[0].name, select_across="1")
    page = superuser.post(CHANGELIST, chosen)
    assert page.status_code == 200
    assert "admin/locks/lock/break_confirmation.html" in [t.name for t in page.templates]
    confirm = form_fields(page.content.decode())

    done = superuser.post(CHANGELIST, confirm, follow=True)
    assert done.status_code == 200, "the confirmation was refused"
    assert b"Broke 60 lock(s)" in done.content
    assert not Lock.objects.exists()
    assert LogEntry.objects.count() == 60


@pytest.mark.parametrize(
    "holdings",
    [
        "[" * 100_000,  # nested beyond the JSON decoder's recursion limit
        '["1 jobs:\\u0000nul"]',  # a name no lock can have (PostgreSQL refuses NUL in text)
        '["\\u00b2 jobs:kept"]',  # a digit to str.isdigit(), not to int()
        '["1 jobs:\\ud800"]',  # a lone surrogate: not text any database takes
        '{"1 jobs:kept": 1}',
        "not json",
    ],
    ids=["deep", "nul", "superscript", "surrogate", "object", "garbage"],
)
def test_a_forged_or_garbled_confirmation_breaks_nothing_and_says_so(
    superuser: Client, holdings: str
) -> None:
    lease = locks.acquire("jobs:kept", ttl=60, holder="worker")
    confirm = action("break_locks", "jobs:kept", post="yes", select_across="1", holdings=holdings)
    done = superuser.post(CHANGELIST, confirm, follow=True)
    assert done.status_code == 200
    assert b"nothing was broken" in done.content
    assert lease.held and locks.check_token("jobs:kept", lease.token)
    lease.release()


def test_break_messages_quote_names_and_escape_bidi_and_control_characters() -> None:
    # U+202E would show the rest of the message reversed; a comma would fake two names.
    tricky = "jobs:\u202egpj.exe, jobs:x\nFAKE"
    first = locks.acquire(tricky, ttl=30, holder="worker")
    gone = locks.acquire("jobs:\u2066gone", ttl=30, holder="worker")
    breaker = staff("breaker", "view_lock", "break_lock")
    holdings = [f"{first.token} {tricky}", f"{gone.token} jobs:\u2066gone"]
    gone.release()
    done = breaker.post(
        CHANGELIST,
        action("break_locks", tricky, "jobs:\u2066gone", post="yes", holding=holdings),
        follow=True,
    )
    text = shown(done)
    assert "Broke 1 lock(s): 'jobs:\\u202egpj.exe, jobs:x\\nFAKE'." in text
    assert "since the page was shown: 'jobs:\\u2066gone'." in text
    messages = text[text.index('class="messagelist"') :]
    messages = messages[: messages.index("</ul>")]
    assert "\u202e" not in messages and "\u2066" not in messages and "\n" + "FAKE" not in messages
    assert not Lock.objects.exists()


def test_names_and_holders_are_isolated_from_the_page_around_them(superuser: Client) -> None:
    # A right-to-left override or isolate in a name (U+202E, U+2067) must not reorder
    # what the page shows around it: each value sits in its own <bdi>, escaped.
    name, holder = "jobs:\u202egpj.exe<b>", "worker\u2067<i>x"
    lease = locks.acquire(name, ttl=30, holder=holder)
    escaped_name, escaped_holder = html.escape(name), html.escape(holder)

    listed = superuser.get(CHANGELIST).content.decode()
    assert re.search(
        rf'<th class="field-name"><a [^>]*><bdi>{re.escape(escaped_name)}</bdi></a></th>', listed
    ), listed
    assert f'<td class="field-holder"><bdi>{escaped_holder}</bdi></td>' in listed
    assert "<b>" not in listed and "<i>" not in listed

    page = superuser.post(CHANGELIST, action("break_locks", name)).content.decode()
    assert f'<td class="field-name"><bdi>{escaped_name}</bdi></td>' in page
    assert f'<td class="field-holder"><bdi>{escaped_holder}</bdi></td>' in page
    assert "<b>" not in page and "<i>" not in page

    # Where no <bdi> can go (the <title>), the name is between Unicode isolates.
    isolated = f"\u2068{escaped_name}\u2069"
    change = superuser.get(reverse("admin:locks_lock_change", args=[quote(name)]))
    assert f"<title>{isolated} | View lock |" in change.content.decode()
    history = superuser.get(reverse("admin:locks_lock_history", args=[quote(name)]))
    assert f"<title>Change history: {isolated} |" in history.content.decode()
    lease.release()
