"""Admin for lock rows: read-only list by the database clock, and actions to break and reap."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import DELETION, LogEntry
from django.core.exceptions import PermissionDenied
from django.db import connections, transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.translation import gettext as _

from . import validation
from .conf import conf
from .exceptions import LockError
from .leases import break_lock, reap_expired
from .models import DatabaseNow, Lock, LockQuerySet

logger = logging.getLogger("locks.admin")

if TYPE_CHECKING:
    ModelAdmin = admin.ModelAdmin[Lock]
else:  # ModelAdmin is generic only in django-stubs, not at run time
    ModelAdmin = admin.ModelAdmin

#: Lock names looked up per query when a break is confirmed.
CONFIRM_BATCH = 500

#: Actions that change lock rows: they need the ``locks.break_lock`` permission.
GUARDED_ACTIONS = ("break_locks", "reap_expired")

View = TypeVar("View", bound=Callable[..., Any])


def _non_atomic_everywhere(view: View) -> View:
    """Exempt ``view`` from ``ATOMIC_REQUESTS`` on every database of ``DATABASES``.

    The actions' lock calls commit at once on the app's own connection, whatever the
    request does; so must their admin log entries, or a rolled-back request would leave
    breaks that happened unrecorded. And on SQLite a request transaction open on the
    file of the locks would make every lock call refuse to run (one writer per file).
    The aliases are those configured when the admin is loaded.
    """
    for alias in connections:
        view = transaction.non_atomic_requests(using=alias)(view)
    return view


def seconds_left(lock: Lock) -> float:
    """Seconds until ``lock`` expires by the database clock (negative once expired).

    Needs a row read through :meth:`LockAdmin.get_queryset` (it carries the database's now).

    Example::

        seconds_left(LockAdmin(Lock, admin.site).get_queryset(request).get(name="orders:42"))
    """
    now = lock.db_now  # type: ignore[attr-defined]
    return float((lock.expires_at - now).total_seconds())


def _isolated_text(value: object) -> str:
    """``value`` as text between Unicode isolates (FSI, PDI).

    For where no ``<bdi>`` can go, such as a page's ``<title>``: a right-to-left override
    in a lock's name then ends with the name, not at the end of the title.
    """
    return f"\u2068{value}\u2069"


def _isolated(field: str) -> Callable[[Lock], str]:
    """A changelist column showing the text ``field`` of a lock in ``<bdi>``, escaped.

    Names, holders and notes come from outside (``lock_view`` fills names from URLs): a
    right-to-left override or isolate in one (U+202E, U+2067) would reorder what the page
    shows around it; ``<bdi>`` keeps each value to itself. The column keeps what the field
    itself would have: its name (CSS class ``field-holder`` for ``holder``), its sorting.
    """

    @admin.display(description=field, ordering=field)
    def column(lock: Lock) -> str:
        return format_html("<bdi>{}</bdi>", getattr(lock, field))

    column.__name__ = field
    return column


class StateFilter(admin.SimpleListFilter):
    """Filter lock rows by state, judged by the database clock: held or expired."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("held", "held"), ("expired", "expired")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        rows = cast(LockQuerySet, queryset)
        if self.value() == "held":
            return rows.held()
        if self.value() == "expired":
            return rows.expired()
        return queryset


@admin.register(Lock)
class LockAdmin(ModelAdmin):
    """Lock rows, read-only; breaking and reaping need the ``locks.break_lock`` permission.

    Example::

        admin.site.register(Lock, LockAdmin)  # done by this module; subclass to customise
    """

    list_display = (
        _isolated("name"),
        _isolated("holder"),
        "count",
        "token",
        "acquired_at",
        "expires_in",
        "state",
    )
    list_filter = (StateFilter,)
    search_fields = ("name", "holder")
    ordering = ("-acquired_at", "-token")  # same millisecond on SQLite: later token first
    actions = GUARDED_ACTIONS
    fields = ("name", "holder", "count", "token", "acquired_at", "expires_at", "note")
    readonly_fields = fields
    break_confirmation_template = "admin/locks/lock/break_confirmation.html"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Lock]:
        # Expiry is judged by the database's clock, read in the same statement as the rows.
        queryset = super().get_queryset(request).using(conf.DATABASE)
        return queryset.annotate(db_now=DatabaseNow())

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Lock | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Lock | None = None) -> bool:
        # Deleting would skip the owner-checked semantics: breaking is the way.
        return False

    def has_break_lock_permission(self, request: HttpRequest) -> bool:
        """Whether the user may break and reap locks (``locks.break_lock``)."""
        return request.user.has_perm(f"{self.opts.app_label}.break_lock")

    @admin.display(description="expires in (s)", ordering="expires_at")
    def expires_in(self, lock: Lock) -> str:
        return f"{seconds_left(lock):.1f}"

    @admin.display(description="state")
    def state(self, lock: Lock) -> str:
        return "held" if seconds_left(lock) > 0 else "expired"

    @_non_atomic_everywhere
    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # Without the permission an action is hidden, and Django would answer a forged
        # POST with "no action selected"; refuse it plainly instead.
        if request.method == "POST":
            # Every value: Django runs the one at the form's index, not the last one.
            actions = set(request.POST.getlist("action"))
            if actions & set(GUARDED_ACTIONS) and not self.has_break_lock_permission(request):
                raise PermissionDenied("breaking locks needs the locks.break_lock permission")
        return super().changelist_view(request, extra_context)

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        # The page's subtitle (also in its <title>) is the lock's name.
        response = super().change_view(request, object_id, form_url, extra_context)
        context = getattr(response, "context_data", None)
        if context and context.get("subtitle"):
            context["subtitle"] = _isolated_text(context["subtitle"])
        return response

    def history_view(
        self, request: HttpRequest, object_id: str, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # The page's title (also its heading) ends with the lock's name.
        response = super().history_view(request, object_id, extra_context)
        context = getattr(response, "context_data", None)
        if context and context.get("object") is not None and "title" not in (extra_context or {}):
            context["title"] = _("Change history: %s") % _isolated_text(context["object"])
        return response

    @admin.action(description="Break selected locks", permissions=["break_lock"])
    def break_locks(self, request: HttpRequest, queryset: QuerySet[Lock]) -> HttpResponse | None:
        """Show the selected holdings for confirmation; on confirmation break exactly those."""
        if request.POST.get("post") == "yes":
            self._break_confirmed(request, queryset)
            return None
        rows = list(queryset)
        for lock in rows:
            lock.expires_in = seconds_left(lock)  # type: ignore[attr-defined]
            lock.state = "held" if lock.expires_in > 0 else "expired"  # type: ignore[attr-defined]
        context = {
            **self.admin_site.each_context(request),
            "title": "Break locks",
            "subtitle": None,
            "locks": rows,
            "holdings": json.dumps([f"{lock.token} {lock.name}" for lock in rows]),
            "opts": self.opts,
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.break_confirmation_template, context)

    def _break_confirmed(self, request: HttpRequest, queryset: QuerySet[Lock]) -> None:
        # The page posts them as one JSON list ("holdings"); a "holding" field per lock,
        # as pages before it did, is read too.
        listed = _listed(request.POST.get("holdings", ""))
        shown = _shown_holdings(request.POST.getlist("holding") + (listed or []))
        if listed is None or not shown:
            # Only a forged or garbled POST gets here: say so rather than nothing at all.
            self.message_user(
                request,
                "The confirmation named no lock that could be read: nothing was broken.",
                messages.ERROR,
            )
            return
        broken: list[str] = []
        changed: list[str] = []
        error: LockError | None = None
        names = list(shown)
        try:
            # Only the rows shown, out of what may be every row (select_across), in
            # batches that keep each query within the databases' parameter limits.
            for start in range(0, len(names), CONFIRM_BATCH):
                for lock in queryset.filter(name__in=names[start : start + CONFIRM_BATCH]):
                    token = shown.pop(lock.name)
                    # break_lock(token=...) deletes only the holding that was on the page.
                    if token != lock.token:
                        changed.append(lock.name)
                    elif break_lock(lock.name, token=token, using=conf.DATABASE):
                        self._log_break(request, lock)
                        broken.append(lock.name)
                    else:
                        changed.append(lock.name)
        except LockError as exc:
            # E.g. SQLite, with a transaction of the project's own open on the file of
            # the locks: the operator gets the reason and what was done, not a 500.
            error = exc
        else:
            changed.extend(shown)  # released since the page was shown
        # Names quoted and escaped as repr() does, as in the log: a name's bidi control
        # (U+202E) would reorder the rest of the message, its comma fake two names.
        if broken:
            self.message_user(request, f"Broke {len(broken)} lock(s): {_quoted(broken)}.")
        if changed:
            self.message_user(
                request,
                f"Left {len(changed)} lock(s) alone: released or taken again since the page "
                f"was shown: {_quoted(changed)}.",
                messages.WARNING,
            )
        if error is not None:
            self.message_user(
                request,
                f"Breaking locks stopped, the rest left as they are: {error}",
                messages.ERROR,
            )

    def _log_break(self, request: HttpRequest, lock: Lock) -> None:
        message = f"Broke lock {lock.name!r} held by {lock.holder!r} with token {lock.token}."
        LogEntry.objects.log_actions(
            user_id=cast(int, request.user.pk),  # only staff users reach an action
            queryset=[lock],
            action_flag=DELETION,
            change_message=message,
            single_object=True,
        )
        logger.warning("admin user %r: %s", request.user.get_username(), message)

    @admin.action(description="Reap expired locks", permissions=["break_lock"])
    def reap_expired(self, request: HttpRequest, queryset: QuerySet[Lock]) -> None:
        """Delete every expired lock row (not only the selected ones); live rows stay."""
        try:
            deleted = reap_expired(using=conf.DATABASE)
        except LockError as exc:
            self.message_user(request, f"Could not reap expired locks: {exc}", messages.ERROR)
            return
        self.message_user(request, f"Reaped {deleted} expired lock(s).")


def _quoted(names: list[str]) -> str:
    return ", ".join(repr(name) for name in names)


def _listed(value: str) -> list[str] | None:
    """The confirmation page's holdings field: a JSON list of strings; ``None`` if garbled."""
    try:
        decoded = json.loads(value) if value else []
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        return None
    if not isinstance(decoded, list):
        return None
    return [item for item in decoded if isinstance(item, str)]


def _shown_holdings(values: list[str]) -> dict[str, int]:
    """Parse the confirmation page's "TOKEN NAME" fields; malformed ones are ignored."""
    shown: dict[str, int] = {}
    for value in values:
        token, space, name = value.partition(" ")
        digits = token.isascii() and token.isdigit()  # "²" is a digit, not to int()
        if space and name and digits and len(token) < 20 and _lock_name(name):
            shown[name] = int(token)
    return shown


def _lock_name(name: str) -> bool:
    # A name no lock can have (a NUL, which PostgreSQL refuses in any query) is not looked up.
    try:
        validation.check_name(name)
    except ValueError:
        return False
    return True
