"""Celery task de-duplication: ``SingletonTask`` holds a lease per task key from enqueue to end."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from celery import Task
from celery.canvas import _chain
from celery.exceptions import Ignore, Reject, Retry
from celery.result import AsyncResult
from celery.signals import task_postrun, task_prerun, task_revoked
from celery.utils import uuid
from django.db import DatabaseError, InterfaceError, OperationalError

from . import connection, leases, validation
from .conf import conf
from .exceptions import DuplicateTask, LockBusy, LockError, LockLost

__all__ = ["KEY_HEADER", "DuplicateTask", "SingletonTask", "default_key", "fit_key"]

logger = logging.getLogger("locks.celery")

#: Message header that carries the lock key from the producer to the worker and to
#: retries, so both use the very key the enqueue took (whatever the serializer does).
KEY_HEADER = "locks_key"
#: ``note`` of the lock rows SingletonTask writes; marks the holder as a task id.
NOTE_PREFIX = "celery task "
ON_DUPLICATE = ("return", "raise")
# How often apply_async retries when the holder it lost to is gone by the time it looks.
_DUPLICATE_ATTEMPTS = 3
_HASHED_PREFIX = validation.MAX_NAME_LENGTH - len(":sha256:") - 64
# Set on a worker's (or eager) request once its run holds the lease; Celery makes a new
# request object per run, retries included.
_RUN_MARK = "locks_run_entered"
# Set on a run's request when it replaced itself (Task.replace) by a run of the same key,
# which takes the lease over: the run's end then leaves it alone.
_HANDED_OVER = "locks_handed_over"
# The run's own lease, on its request, for on_replace.
_RUN_LEASE = "locks_run_lease"


def fit_key(key: str) -> str:
    """Return ``key`` as a lock name: as it is when it fits, else prefix + SHA-256 digest.

    Example::

        fit_key("tasks.export:" + "x" * 400)  # 'tasks.export:xxx…:sha256:faa5833e…' (255 max)
    """
    if len(key) <= validation.MAX_NAME_LENGTH:
        return key
    validation.check_long_name(key)
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
    return f"{key[:_HASHED_PREFIX]}:sha256:{digest}"


def _tagged(value: Any) -> Any:
    """JSON for values JSON has no type for, tagged with the type so types never collide."""
    kind = f"\x00{type(value).__module__}.{type(value).__qualname__}"
    if isinstance(value, set | frozenset):
        # A set's repr has no stable order; the sorted encodings of its members do.
        return {kind: sorted(json.dumps(item, sort_keys=True, default=_tagged) for item in value)}
    if inspect.getattr_static(type(value), "__repr__") is object.__repr__:
        raise TypeError(
            f"{type(value).__name__} has no stable text form (its repr is its memory address)"
        )
    return {kind: repr(value)}


def default_key(task_name: str, arguments: Mapping[str, Any] | Sequence[Any]) -> str:
    """The default lock key of a task run: the task name plus its arguments as JSON.

    The JSON is canonical (sorted keys, no spaces, ASCII only); values JSON cannot hold
    are tagged with their type; keys longer than 255 characters are hashed (:func:`fit_key`).

    Example::

        default_key("billing.send_invoice", {"invoice_id": 42})
        # 'billing.send_invoice:{"invoice_id":42}'
    """
    try:
        encoded = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=_tagged)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"cannot build a lock key for task {task_name!r} from its arguments: {exc}; "
            "give the task a lock_key (a format string or a callable)"
        ) from exc
    return fit_key(f"{task_name}:{encoded}")


def _carried(options: Mapping[str, Any], link: Any, link_error: Any) -> str:
    """What a message sent with these options carries beyond its own run, in words: what
    would be lost, or wait for ever, if another task id's run stood in for it.

    Example::

        _carried({"chain": [next_task]}, None, None)  # 'the rest of its chain'
    """
    chain = options.get("chain")
    parts = [
        words
        for present, words in (
            (chain, "the rest of its chain"),
            # The worker sends a chain's last task with an empty one, and the run before it
            # as parent_id: the chain's result is its. (A chain of one task, sent with an
            # empty one too, returns the task's own result to its caller.)
            (chain is not None and not chain and options.get("parent_id"), "the end of its chain"),
            (options.get("chord"), "its chord's body"),
            # A group's result is made of the ids its tasks were given before the sending.
            # Not so a group Celery sends with the run before it as parent_id: a finished
            # run's link callbacks (more than one) and its errbacks, whose result no one
            # gets; a chain's or chord's group comes with its chain or chord.
            (options.get("group_id") and not options.get("parent_id"), "its group's result"),
            # self.replace() sends its replacement under the replaced run's task id, the
            # one its caller waits on (a retry of the replacement carries the mark too).
            (options.get("replaced_task_nesting"), "the result of the task it replaces"),
            # self.retry() sends its run again under the run's task id, with the key header
            # the run came with: its caller waits on that id, which another run cannot
            # answer. (A replacement under the same key sends the header too; said above.)
            (
                KEY_HEADER in (options.get("headers") or {})
                and not options.get("replaced_task_nesting"),
                "the retry of its run",
            ),
            (link, "its link callbacks"),
            (link_error, "its link_error callbacks"),
        )
        if present
    ]
    return ", ".join(parts)


class SingletonTask(Task[..., Any]):
    """Celery task base class: at most one run per key is queued or running at a time.

    ``delay()``/``apply_async()`` take a lease on the task's key with the new task id as
    holder. While that run is queued or running, another call with the same key enqueues
    nothing: it returns the ``AsyncResult`` of the queued run (``on_duplicate="return"``)
    or raises :class:`~locks.DuplicateTask` (``on_duplicate="raise"``). The worker
    releases the lease when the run ends (success, failure, final retry failure); a retry
    keeps it, and so does ``Reject(requeue=True)`` in an ``acks_late`` task. A message
    dropped unrun (``revoke()``, ``expires``) or a run killed by ``revoke(terminate=True)``
    releases it too, when the worker reports the revoke. A worker that dies mid-run leaves
    the lease to expire after ``lock_ttl``.
    A worker that receives a duplicate anyway (sent by code that bypassed ``apply_async``)
    skips it and logs why.

    Options, as task attributes or decorator keywords:
        lock_ttl: seconds (or timedelta) the lease lasts from enqueue and again from the
            start of the run; default ``LOCKS["TASK_LOCK_TTL"]`` (an hour).
        lock_key: ``None`` (task name + arguments), a format string over the task's
            arguments by position and by name (``"invoice:{invoice_id}"``), or a callable
            taking the task's arguments and returning the key.
        on_duplicate: ``"return"`` (default) or ``"raise"``.
        lock_auto_renew: renew the lease while the run lasts (``lock_ttl`` then only
            needs to outlast the queue wait and a crash-recovery delay).
        lock_using: database alias of the lock table (default ``LOCKS["DATABASE"]``).

    Example::

        @shared_task(base=SingletonTask, lock_ttl=600, lock_key="invoice:{invoice_id}")
        def send_invoice_email(invoice_id): ...

        first = send_invoice_email.delay(42)
        assert send_invoice_email.delay(42).id == first.id  # not enqueued twice
    """

    lock_ttl: float | timedelta | None = None
    lock_key: str | Callable[..., str] | None = None
    on_duplicate: str = "return"
    lock_auto_renew: bool = False
    lock_using: str | None = None

    # --- options --------------------------------------------------------------------------

    def _lock_options(self) -> tuple[float, str, str]:
        """Validated (ttl, alias, on_duplicate); raises before any query runs."""
        where = f"task {self.name!r}"
        try:
            ttl = conf.TASK_LOCK_TTL if self.lock_ttl is None else self.lock_ttl
            ttl = validation.ttl_seconds(ttl)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{where}: lock_ttl: {exc}") from None
        alias = conf.DATABASE if self.lock_using is None else self.lock_using
        alias = validation.check_alias(alias)
        if self.on_duplicate not in ON_DUPLICATE:
            raise ValueError(
                f"{where}: on_duplicate must be 'return' or 'raise', not {self.on_duplicate!r}"
            )
        if not isinstance(self.lock_auto_renew, bool):
            raise TypeError(f"{where}: lock_auto_renew must be True or False")
        return ttl, alias, self.on_duplicate

    def lock_name(
        self, args: Sequence[Any] | None = None, kwargs: Mapping[str, Any] | None = None
    ) -> str:
        """The lock key of a run of this task with these arguments.

        Example::

            send_invoice_email.lock_name((42,))  # 'invoice:42'
        """
        args, kwargs = tuple(args or ()), dict(kwargs or {})
        key_option = inspect.getattr_static(self, "lock_key", None)
        if isinstance(key_option, staticmethod):
            key_option = key_option.__func__
        if key_option is None:
            bound = self._bind(args, kwargs)
            key = default_key(
                self.name, dict(bound.arguments) if bound is not None else [list(args), kwargs]
            )
        elif isinstance(key_option, str):
            key = self._format_key(key_option, args, kwargs)
        elif callable(key_option):
            key = key_option(*args, **kwargs)
            if not isinstance(key, str):
                raise TypeError(
                    f"lock_key of task {self.name!r} returned {key!r}; it must return a str"
                )
        else:
            raise TypeError(
                f"lock_key of task {self.name!r} must be None, a format string or a "
                f"callable, not {key_option!r}"
            )
        if "\x00" in key:
            raise ValueError(f"lock key of task {self.name!r} must not contain NUL: {key!r}")
        return validation.check_name(fit_key(key))

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> inspect.BoundArguments | None:
        """The arguments bound to the task's parameters, defaults filled in.

        So ``f(1)``, ``f(x=1)`` and ``f()`` with ``x=1`` as default all make the same key.
        """
        try:
            signature = inspect.signature(self.run)
        except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
            return None
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError as exc:
            if not self.typing:
                return None
            raise TypeError(f"task {self.name!r} called with bad arguments: {exc}") from exc
        bound.apply_defaults()
        return bound

    def _format_key(self, template: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        bound = self._bind(args, kwargs)
        if bound is not None:
            args, kwargs = bound.args, {**bound.arguments, **bound.kwargs}
        try:
            return template.format(*args, **kwargs)
        except KeyError as exc:
            problem = f"refers to {exc}, which is not among the arguments {sorted(kwargs)}"
        except IndexError:
            problem = f"refers to a position beyond its {len(args)} positional arguments"
        raise ValueError(f"lock_key {template!r} of task {self.name!r} {problem}")

    # --- enqueue ----------------------------------------------------------------------

    def apply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        **options: Any,
    ) -> AsyncResult[Any]:
        """Enqueue unless a run with the same key is queued or running (see the class).

        Example::

            result = send_invoice_email.apply_async((42,), countdown=10)
        """
        ttl, alias, on_duplicate = self._lock_options()
        if not isinstance(args, list | tuple | None) or not isinstance(kwargs, Mapping | None):
            raise TypeError(
                f"task {self.name!r}: args must be a list or tuple and kwargs a dict, "
                f"not {args!r} and {kwargs!r}"
            )
        headers = dict(options.get("headers") or {})
        key = headers.get(KEY_HEADER) or self.lock_name(args, kwargs)
        task_id = validation.check_holder(task_id or uuid())
        # A run held back by countdown or eta starts that much later: until then it is
        # queued, and its key must stay taken (retries come this way too).
        ttl = min(ttl + _delay(options, self.app.timezone), validation.MAX_TTL)
        # The first task of a chain carries the rest of it, a chord's header task the
        # chord's body (which runs once every header task has reported), and a task its
        # link= and link_error= callbacks; a group's task, a chain's last one, a
        # replacement (self.replace) and a retry have ids their group's or chain's or the
        # replaced or retried run's result waits for. Not enqueued, it would drop them
        # unsent or leave that result waiting, while the caller waits for ever.
        # Another task id's queued run stands for this run, not for what it carries: raise.
        dropped = _carried(options, link, link_error)
        for _ in range(_DUPLICATE_ATTEMPTS):
            lease = leases.try_acquire(key, ttl=ttl, holder=task_id, using=alias, note=self._note())
            if lease is not None:
                break
            holding = self._live_holding(key, alias)
            if holding is not None:
                mode = "raise" if dropped else on_duplicate
                return self._duplicate(key, task_id, holding, mode, dropped)
        else:
            raise LockBusy(f"lock {key!r} of task {self.name!r} kept changing hands; try again")
        if lease.count > 1 and KEY_HEADER not in headers:
            # Re-entered: a run under this very task id is queued or running. Only a retry
            # (which sends the key header) may enqueue it again. In a chain too, that run
            # went out with its chain (a worker sends a chain's next task again after a
            # redelivery): nothing is dropped, so on_duplicate decides as for any task.
            _release_quietly(lease, f"task {self.name}[{task_id}] is a duplicate")
            return self._duplicate(key, task_id, (task_id, lease.note), on_duplicate)
        options["headers"] = {**headers, KEY_HEADER: key}
        try:
            return super().apply_async(
                None if args is None else tuple(args),
                None if kwargs is None else dict(kwargs),
                task_id,
                producer,
                link,
                link_error,
                shadow,
                **options,
            )
        except BaseException:
            if not self.app.conf.task_always_eager:
                # Nothing was queued: a lock left behind would block the key until it expires.
                _release_quietly(lease, f"publishing task {self.name}[{task_id}] failed")
            else:
                # Eager: the error may come from before the run (Celery's argument check),
                # whose lock is still ours, or out of the run (task_eager_propagates), whose
                # end already released the whole holding: finding it gone is expected.
                _release_quietly(
                    lease, f"eager run of task {self.name}[{task_id}] raised", gone_ok=True
                )
            raise

    def _note(self) -> str:
        return (NOTE_PREFIX + self.name)[: validation.MAX_NOTE_LENGTH]

    def _live_holding(self, key: str, alias: str) -> tuple[str, str] | None:
        return leases._execute(
            alias, "inspect", key, lambda backend, cursor: backend.live_holding(cursor, key)
        )

    def _duplicate(
        self,
        key: str,
        task_id: str,
        holding: tuple[str, str],
        on_duplicate: str,
        dropped: str = "",
    ) -> AsyncResult[Any]:
        holder, note = holding
        if not note.startswith(NOTE_PREFIX):
            raise DuplicateTask(
                f"lock {key!r} of task {self.name!r} is held by {holder!r}, which is not a "
                "queued task (another user of the same lock name)",
                name=key,
                task_id=None,
            )
        if on_duplicate == "raise":
            raise DuplicateTask(
                f"task {self.name!r} is already queued or running as {holder} (lock {key!r})"
                + (f"; not sent either: {dropped}" if dropped else ""),
                name=key,
                task_id=holder,
            )
        logger.info(
            "not enqueueing task %s[%s]: lock %r shows %s queued or running",
            self.name,
            task_id,
            key,
            holder,
        )
        return self.AsyncResult(holder)

    # --- run ------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task under its lock (in a worker), or as a plain call (called directly)."""
        request = self.request
        # A call from inside a run (recursion) still sees that run's request: the mark
        # tells it apart, or it would re-enter the run's lease and release it entirely.
        if request.called_directly or not request.id or getattr(request, _RUN_MARK, False):
            return super().__call__(*args, **kwargs)
        setattr(request, _RUN_MARK, True)
        try:
            lease = self._enter_run(str(request.id), args, kwargs)
        except Ignore:
            raise  # a duplicate: the key is another task id's, not this run's to free
        except BaseException:
            # The run ended before it began (a database error on a connection the server
            # dropped, a soft time limit): nothing is queued or running under this id any
            # more, so the enqueue's lease would block the key for lock_ttl.
            self._release_entry(str(request.id), args, kwargs)
            raise
        setattr(request, _RUN_LEASE, lease)
        retrying = False
        try:
            # Not super().__call__: it would push a request without the task id.
            return self.run(*args, **kwargs)
        except Retry:
            retrying = True  # the retry is queued under the same task id: keep the lock
            raise
        except Reject as exc:
            # Rejected with requeue, the message goes back to the queue under the same task
            # id, as a retry does: keep the lock. Only an unacknowledged message can go
            # back, so only with acks_late (others were acknowledged when the run began),
            # and never in an eager run, which has no message.
            requeued = bool(getattr(exc, "requeue", False))  # not in the type stubs
            retrying = requeued and bool(self.acks_late) and not request.is_eager
            raise
        finally:
            if retrying or getattr(request, _HANDED_OVER, False):
                # No run holds it until the next one starts: the TTL its enqueue gave it
                # covers the wait, so auto-renew must stop (no run may be left to end it).
                lease._stop_renewals()
            elif lease.held or lease.lost:
                # (Not when on_replace released it before another replacement went out: a
                # second release raises, and that error would fail the replaced run.)
                # Found gone, the run outlived its lease (lock_ttl without auto-renew, or
                # renewals that failed) and was not protected to its end: a WARNING.
                _release_quietly(lease, f"task {self.name}[{request.id}] ended", entirely=True)

    def retry(self, *args: Any, **kwargs: Any) -> Retry:
        """``Task.retry``; a retry refused as a duplicate (another run took the key while
        this one outlived its lease) raises :class:`~locks.DuplicateTask`, and the run
        fails with it.

        Celery wraps any error of the retry's re-send in ``Reject(requeue=False)``, which
        it records as the Reject, not as the error. Only this Reject is unwrapped: one the
        run raises itself, whatever its reason, stays the run's Reject.

        With ``throw=False`` the retry is queued and the run goes on: its end keeps the lease
        for the retry, as when the Retry is raised.

        Example::

            raise self.retry(countdown=60)
        """
        try:
            sent = super().retry(*args, **kwargs)
        except Reject as exc:
            refused = getattr(exc, "reason", None)  # not in the type stubs
            if isinstance(refused, DuplicateTask):
                raise refused from None
            raise
        request = self.request
        # Returned, not raised (throw=False): the retry is queued under this run's task id.
        # Eager, nothing was queued: apply() runs a retry again only when it is raised.
        if getattr(request, _RUN_MARK, False) and not request.is_eager:
            setattr(request, _HANDED_OVER, True)
        return sent

    def on_replace(self, sig: Any) -> Any:
        """Replaced (``self.replace(...)``) by a run of this task with the same key, the run
        hands its lease over, as a retry keeps it; before any other replacement it releases
        its lease, since it ends right after.

        The replacement (the first task of a chain: the one that inherits this run's id)
        is sent out after this, and must not find the key taken by the run it replaces.

        Example::

            raise self.replace(self.s(invoice_id, attempt + 1))  # the same lock_key
        """
        request = self.request
        lease = getattr(request, _RUN_LEASE, None)
        if not getattr(request, _RUN_MARK, False) or lease is None:
            return super().on_replace(sig)
        first = sig.tasks[0] if isinstance(sig, _chain) and sig.tasks else sig
        key = self._run_key(tuple(request.args or ()), dict(request.kwargs or {}))
        if (
            getattr(first, "task", None) == self.name
            and first.options.get("task_id") == request.id
            and self.lock_name(first.args, first.kwargs) == key
        ):
            # It goes out under this run's task id: with the key header, apply_async
            # takes it for the re-enqueue it is, not for a duplicate.
            first.set(headers={**(first.options.get("headers") or {}), KEY_HEADER: key})
            setattr(request, _HANDED_OVER, True)
        else:
            _release_quietly(lease, f"task {self.name}[{request.id}] was replaced", entirely=True)
        try:
            return super().on_replace(sig)
        except Ignore:
            raise  # sent: the run ends here, as Celery means it to
        except BaseException:
            # Not sent: the run ends with this error, and its end releases what it holds.
            setattr(request, _HANDED_OVER, False)
            raise

    def _enter_run(
        self, task_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> leases.Lease:
        ttl, alias, _ = self._lock_options()
        key = self._run_key(args, kwargs)
        lease = leases.try_acquire(
            key,
            ttl=ttl,
            holder=task_id,
            using=alias,
            note=self._note(),
            auto_renew=self.lock_auto_renew,
        )
        if lease is None:
            holding = self._live_holding(key, alias)
            logger.warning(
                "skipping task %s[%s]: lock %r is held by %s, so this is a duplicate of a "
                "queued or running run (sent by code that bypassed apply_async?)",
                self.name,
                task_id,
                key,
                holding[0] if holding else "another holder",
            )
            raise Ignore()
        return lease

    def _release_entry(self, task_id: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Free the key the enqueue took for ``task_id``, whose run failed to begin.

        Never raises: the run's own error is on its way out, and must not be masked; the
        lease expires after ``lock_ttl`` anyway.
        """
        try:
            _, alias, _ = self._lock_options()
            key = self._run_key(args, kwargs)
            released = leases.release_holding(key, task_id, alias)
        except Exception:
            logger.exception(
                "task %s[%s] failed to begin, and freeing its lock failed too; the lock "
                "expires after lock_ttl",
                self.name,
                task_id,
            )
            return
        if released:
            logger.info("task %s[%s] failed to begin: released lock %r", self.name, task_id, key)

    def _run_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        request = self.request
        sent = request.get(KEY_HEADER) or (request.headers or {}).get(KEY_HEADER)
        if isinstance(sent, str):
            try:
                return validation.check_name(sent)
            except ValueError:
                logger.warning("task %s: ignoring bad lock key header %r", self.name, sent)
        return self.lock_name(args, kwargs)


def _release_quietly(
    lease: leases.Lease, why: str, *, entirely: bool = False, gone_ok: bool = False
) -> None:
    """Release without masking the caller's outcome: the lease expires by itself anyway.

    ``gone_ok``: the holding may rightly be gone already; finding so is no warning.
    """
    try:
        lease.release(entirely=entirely)
    except LockLost as exc:
        log = logger.debug if gone_ok else logger.warning
        log("%s, but lock %r was no longer its own: %s", why, lease.name, exc)
    except DatabaseError:
        logger.exception(
            "%s, but releasing lock %r failed; it expires at %s", why, lease.name, lease.expires_at
        )


def _delay(options: Mapping[str, Any], timezone: tzinfo) -> float:
    """Seconds from now until a message sent with these options may run (countdown, eta).

    A naive ``eta`` is in ``timezone`` (the Celery app's), as Celery reads it.
    """
    countdown, eta = options.get("countdown"), options.get("eta")
    if isinstance(countdown, int | float) and not isinstance(countdown, bool):
        seconds = float(countdown)
    else:
        if isinstance(eta, str):
            try:
                eta = datetime.fromisoformat(eta)
            except ValueError:
                return 0.0  # Celery refuses it itself
        if not isinstance(eta, datetime):
            return 0.0
        if eta.tzinfo is None:
            eta = eta.replace(tzinfo=timezone)
        seconds = (eta - datetime.now(UTC)).total_seconds()
    return 0.0 if math.isnan(seconds) else max(0.0, min(seconds, validation.MAX_TTL))


def _ends_the_run(signum: Any) -> bool:
    """Whether ``revoke(terminate=True, signal=signum)`` surely ends a prefork run.

    SIGKILL always does; SIGTERM does unless the worker remaps it (``REMAP_SIGTERM``), and
    then, as with any other signal (SIGUSR1's ``SoftTimeLimitExceeded``, say), the run may
    catch it and go on: its own end releases the lease, or it expires after ``lock_ttl``.
    """
    if signum == signal.SIGKILL:
        return True
    return signum in (signal.SIGTERM, None) and not os.environ.get("REMAP_SIGTERM")


def _release_revoked(sender: Any = None, request: Any = None, **signal_info: Any) -> None:
    """Free the key of a SingletonTask message the worker dropped or killed unfinished.

    Celery sends ``task_revoked`` (in the worker's main process) for a message discarded by
    ``revoke()`` or ``expires`` and for a run killed by ``revoke(terminate=True)``: no run
    ends, so without this the lease taken at enqueue would block the key for ``lock_ttl``.
    A run sent a signal it may survive keeps its lease (:func:`_ends_the_run`).
    """
    if not isinstance(sender, SingletonTask) or request is None or not request.id:
        return
    task_id = str(request.id)
    key = request.get(KEY_HEADER) or (request.headers or {}).get(KEY_HEADER)
    if not isinstance(key, str):
        return  # sent around apply_async: it never took a lease
    if signal_info.get("terminated") and not _ends_the_run(signal_info.get("signum")):
        logger.warning(
            "task %s[%s] was sent signal %s, which it may survive: lock %r stays held until "
            "its run ends (or for lock_ttl)",
            sender.name,
            task_id,
            signal_info.get("signum"),
            key,
        )
        return
    try:
        _, alias, _ = sender._lock_options()
        name = validation.check_name(key)
        try:
            released = leases.release_holding(name, task_id, alias)
        except (OperationalError, InterfaceError):
            # A kept connection (CONN_MAX_AGE > 0, no health checks) whose session the
            # server ended while the worker idled is found dead only by this statement,
            # and replaced: once more on the new one, or the key stays held for lock_ttl.
            # Releasing is idempotent, so a first try that did reach the server is harmless.
            # Not for errors of the statement itself (ProgrammingError, IntegrityError):
            # the database would only refuse it again.
            released = leases.release_holding(name, task_id, alias)
    except (TypeError, ValueError, DatabaseError, LockError):
        logger.exception(
            "task %s[%s] was revoked, but freeing lock %r failed", sender.name, task_id, key
        )
        return
    finally:
        # The main process runs no task, so no task_prerun/postrun looks after its lock
        # connection: kept open, a session the server ended while the worker idled (a
        # restart, a failover, wait_timeout) failed the next revoke's release, and that
        # key stayed held for lock_ttl. Closed when Django would close its own (at once
        # with CONN_MAX_AGE = 0; else checked before its next use, CONN_HEALTH_CHECKS).
        connection.close_old()
    if released:
        logger.info("task %s[%s] was revoked: released lock %r", sender.name, task_id, key)
    else:
        logger.info(
            "task %s[%s] was revoked; lock %r is not its own (free or another holder's): "
            "left alone",
            sender.name,
            task_id,
            key,
        )


def _close_old_connections(sender: Any = None, **signal_info: Any) -> None:
    """Before and after each task a worker runs, close the app's own connections that
    Django would close (``CONN_MAX_AGE``, errors, failed ``CONN_HEALTH_CHECKS``).

    Celery's Django fixup does this for Django's connections, not for the app's own: a
    worker's lock connection the server dropped while idle (a restart, a failover,
    ``wait_timeout``) would fail the next run at its start. Not in an eager run: it runs
    inside the caller's code, as Celery's fixup also leaves that alone.
    """
    request = getattr(sender, "request", None)
    if getattr(request, "is_eager", False):
        return
    connection.close_old()


# Connected on import: every process that runs a SingletonTask has imported this module
# (the task's base class lives here), and Celery is an optional dependency that the
# app's ready() must not import. weak=False: the receiver is a module function anyway.
task_revoked.connect(_release_revoked, weak=False, dispatch_uid="locks.celery.release_revoked")
task_prerun.connect(_close_old_connections, weak=False, dispatch_uid="locks.celery.close_old")
task_postrun.connect(_close_old_connections, weak=False, dispatch_uid="locks.celery.close_old_end")
