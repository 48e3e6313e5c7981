"""The history checker: ``check()`` finds violations of the lock contract in a merged history.

Every rule uses only what is certain from the client side, so it raises no false alarm
(an operation that failed with a database error, or whose process was killed, may or
may not have taken effect, and counts both ways):

``token-reuse``
    one token is never granted afresh twice, nor to two holders.
``token-order``
    tokens rise in hold order: a holding granted before another's acquire began has
    the smaller token.
``two-holders``
    once a holding is granted, no older holding of the name still renews, re-enters or
    releases successfully (its row must have been gone or expired).
``early-takeover``
    a newer holding granted while an older one was neither released nor broken took
    over an expired row: its grant time is not before the older one's expiry, both by
    the database clock.
``live-lease-lost``
    a lease is never reported lost while it was surely live (no break, no release of
    its own, and less than its TTL since its last grant or renewal was sent).
``stale-write``
    a fenced write is never accepted after a write with a greater token was accepted.
``refused-write``
    a fenced write is refused only if a write with a greater token may have come first.
``release-lost``
    no lock row is left behind by a holding whose every grant was released with success
    (unless its process had an acquire of the name fail with a database error before the
    last release: that one may have re-entered it unseen).
``row-overlap``
    two processes never hold the row lock of one name at the same time.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path

from tests.history import ERROR, LOST, OK, PENDING, STALE, Op

#: How far the database clock may trail the monotonic clock in the checks: SQLite's clock
#: ticks in milliseconds, and a statement is timed on the server a moment after it is sent.
SLACK = 0.01
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
SUMMARY = Path(__file__).resolve().parent.parent / "var" / "reliability.jsonl"


@dataclass
class Holding:
    """One fresh grant of a lease and everything its holder did with it."""

    name: str
    token: int
    grants: list[Op] = field(default_factory=list)  # the fresh grant and the re-entries
    renews: list[Op] = field(default_factory=list)  # successful renewals
    releases: list[Op] = field(default_factory=list)  # every release attempt
    lost: list[Op] = field(default_factory=list)  # renewals/releases that found it lost

    @cached_property
    def first(self) -> Op:
        """The grant that started the holding."""
        return min(self.grants, key=lambda op: op.m0)

    @cached_property
    def live_ops(self) -> list[Op]:
        """Operations that succeeded only because the lease was live at the time."""
        reentries = [op for op in self.grants if op is not self.first]
        ok_releases = [op for op in self.releases if op.result == OK]
        return reentries + self.renews + ok_releases

    @cached_property
    def last_live(self) -> float:
        return max((op.m0 for op in self.live_ops), default=-math.inf)

    @cached_property
    def release_began(self) -> float:
        return min((op.m0 for op in self.releases), default=math.inf)

    def expiry_known_before(self, moment: float) -> datetime:
        """The latest expiry (database clock) granted by calls that ended before ``moment``."""
        done = [op.expires_at for op in self.grants + self.renews if op.end < moment]
        return max((at for at in done if at is not None), default=EPOCH)

    def surely_live_until(self) -> float:
        """Monotonic time until which the lease surely stayed live by its TTL alone."""
        return max((op.m0 + (op.ttl or 0.0) for op in self.grants + self.renews), default=0.0)

    def fully_released(self) -> bool:
        """Whether every grant of it was released with success."""
        released = sum(op.result == OK for op in self.releases)
        return released >= len(self.grants) and not any(op.uncertain for op in self.releases)


@dataclass
class Report:
    """What :func:`check` looked at and what it found."""

    ops: int
    by_op: dict[str, int]
    holdings: int
    writes: int
    violations: list[str]

    def assert_clean(self) -> None:
        """Fail with the violations listed, if there are any.

        Example::

            check(load(paths)).assert_clean()
        """
        assert not self.violations, f"{len(self.violations)} violations:\n" + "\n".join(
            self.violations[:30]
        )


def _holdings(ops: Sequence[Op], violations: list[str]) -> dict[str, list[Holding]]:
    by_key: dict[tuple[str, int], Holding] = {}
    holders: dict[tuple[str, int], set[str | None]] = defaultdict(set)
    for op in ops:
        if op.token is None or op.op not in ("acquire", "renew", "release"):
            continue
        key = (op.name, op.token)
        holding = by_key.setdefault(key, Holding(op.name, op.token))
        if op.op == "acquire" and op.result == OK:
            holders[key].add(op.holder)
            holding.grants.append(op)
        elif op.op == "renew" and op.result == OK:
            holding.renews.append(op)
        elif op.op == "release":
            holding.releases.append(op)
        if op.result == LOST:
            holding.lost.append(op)
    for (name, token), seen in holders.items():
        fresh = [op for op in by_key[(name, token)].grants if op.count == 1]
        if len(seen) > 1 or len(fresh) > 1:
            violations.append(
                f"token-reuse: {name!r} token {token} granted afresh {len(fresh)} times "
                f"to {sorted(map(str, seen))}"
            )
    grouped: dict[str, list[Holding]] = defaultdict(list)
    for holding in by_key.values():
        if holding.grants:
            grouped[holding.name].append(holding)
    for group in grouped.values():
        group.sort(key=lambda h: h.token)
    return grouped


def _check_pair(a: Holding, b: Holding, breaks: list[Op], violations: list[str]) -> None:
    """``a`` has the smaller token, ``b`` the greater one."""
    name, granted = a.name, b.first
    if a.last_live <= granted.end and a.release_began < granted.end:
        return  # released before b's grant could have happened, and never live after it
    if granted.end < a.first.m0:
        violations.append(
            f"token-order: {name!r} token {b.token} was granted before token {a.token}'s "
            "acquire began"
        )
        return
    for op in a.live_ops:
        if op.m0 > granted.end:
            violations.append(
                f"two-holders: {name!r} token {a.token} {op.op} succeeded after token "
                f"{b.token} was granted ({op.m0 - granted.end:.3f} s later)"
            )
    excused = a.release_began < granted.end or any(
        op.m0 < granted.end and op.end > a.first.m0 for op in breaks
    )
    expiry = a.expiry_known_before(granted.m0)
    if not excused and granted.acquired_at is not None and granted.acquired_at < expiry:
        violations.append(
            f"early-takeover: {name!r} token {b.token} granted at {granted.acquired_at} "
            f"while token {a.token} was live until {expiry} and never released or broken"
        )


def _check_lost(holding: Holding, breaks: list[Op], violations: list[str]) -> None:
    live_until = holding.surely_live_until() - SLACK
    for op in holding.lost:
        excused = any(other.m0 < op.end for other in holding.releases if other is not op) or any(
            other.m0 < op.end for other in breaks
        )
        if not excused and op.end < live_until:
            violations.append(
                f"live-lease-lost: {holding.name!r} token {holding.token} {op.op} reported "
                f"lost {live_until - op.end:.3f} s before its TTL could have run out"
            )


def _token(op: Op) -> int:
    return -1 if op.token is None else op.token


def _check_writes(writes: list[Op], violations: list[str]) -> None:
    accepted = sorted((op for op in writes if op.result == OK), key=lambda op: op.end)
    ends = [op.end for op in accepted]
    best = list(itertools.accumulate((_token(op) for op in accepted), max))
    for later in accepted:
        before = bisect.bisect_left(ends, later.m0)  # accepted writes that ended before it
        if before and best[before - 1] > _token(later):
            violations.append(
                f"stale-write: {later.name!r} write with token {later.token} accepted after "
                f"token {best[before - 1]} had written"
            )
    tried = sorted((op for op in writes if op.result != STALE), key=lambda op: op.m0)
    starts = [op.m0 for op in tried]
    most = list(itertools.accumulate((_token(op) for op in tried), max))
    for refused in (op for op in writes if op.result == STALE):
        before = bisect.bisect_left(starts, refused.end)
        if not before or most[before - 1] <= _token(refused):
            violations.append(
                f"refused-write: {refused.name!r} write with token {refused.token} refused "
                "although no greater token had tried to write"
            )


def _row_spans(ops: Sequence[Op]) -> dict[str, list[tuple[float, float, str]]]:
    """Per name, the (start, end, process) spans in which a process surely held its row lock."""
    by_proc: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        by_proc[op.proc].append(op)
    spans: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for proc, mine in by_proc.items():
        for start in (op for op in mine if op.op == "row_lock" and op.result == OK):
            after = [op for op in mine if op.m0 > start.end and op.name == start.name]
            unlock = next((op for op in after if op.op == "row_unlock"), None)
            if unlock is not None:
                spans[start.name].append((start.end, unlock.m0, proc))
            else:  # killed while holding: held at least until its last recorded event
                last = max((op.end for op in after if op.m1 is not None), default=start.end)
                spans[start.name].append((start.end, last, proc))
    return spans


def _check_rows(ops: Sequence[Op], violations: list[str]) -> None:
    for name, spans in _row_spans(ops).items():
        for (_s1, e1, p1), (s2, e2, p2) in itertools.combinations(sorted(spans), 2):
            if p1 != p2 and s2 < e1:
                violations.append(
                    f"row-overlap: {name!r} row lock held by {p1} and {p2} at once "
                    f"for {min(e1, e2) - s2:.3f} s"
                )


def check(ops: Sequence[Op], final_rows: Iterable[tuple[str, int]] = ()) -> Report:
    """Check a merged history; ``final_rows`` are the (name, token) rows left at the end.

    Example::

        report = check(load(paths), Lock.objects.values_list("name", "token"))
        report.assert_clean()
    """
    violations: list[str] = []
    grouped = _holdings(ops, violations)
    breaks: dict[str, list[Op]] = defaultdict(list)
    writes: dict[str, list[Op]] = defaultdict(list)
    for op in ops:
        if op.op == "break" and op.result in (OK, ERROR, PENDING):
            breaks[op.name].append(op)
        elif op.op == "write" and op.token is not None:
            writes[op.name].append(op)
    for name, group in grouped.items():
        for a, b in itertools.combinations(group, 2):
            _check_pair(a, b, breaks[name], violations)
        for holding in group:
            _check_lost(holding, breaks[name], violations)
    for resource in writes.values():
        _check_writes(resource, violations)
    _check_rows(ops, violations)
    index = {(h.name, h.token): h for group in grouped.values() for h in group}
    # An acquire that failed with a database error (the server went away mid-statement)
    # may still have committed: a re-entry then counts once more than the client knows,
    # and its releases leave the row behind, to expire.
    unsure: dict[tuple[str, str], list[float]] = defaultdict(list)
    for op in ops:
        if op.op == "acquire" and op.uncertain:
            unsure[(op.name, op.proc)].append(op.m0)
    for name, token in final_rows:
        left = index.get((name, token))
        if left is None or not left.fully_released():
            continue
        done = max(op.end for op in left.releases)
        if not any(m0 < done for m0 in unsure[(name, left.first.proc)]):
            violations.append(
                f"release-lost: {name!r} token {token} is still in the table although "
                f"all {len(left.grants)} grants of it were released"
            )
    return Report(
        ops=len(ops),
        by_op=dict(Counter(op.op for op in ops)),
        holdings=sum(len(group) for group in grouped.values()),
        writes=sum(len(resource) for resource in writes.values()),
        violations=violations,
    )


def summarize(fault: str, backend: str, injected: int, report: Report) -> None:
    """Append one line to ``var/reliability.jsonl`` for the docs' table.

    Example::

        summarize("SIGKILL lease holder", "postgresql", 1, report)
    """
    SUMMARY.parent.mkdir(exist_ok=True)
    with open(SUMMARY, "a", encoding="utf-8") as out:
        line = {
            "fault": fault,
            "backend": backend,
            "injected": injected,
            "ops": report.ops,
            "violations": len(report.violations),
        }
        out.write(json.dumps(line) + "\n")


def main(argv: list[str]) -> None:
    """``python -m tests.history_check summary``: var/reliability.jsonl as a Markdown table."""
    if argv != ["summary"]:
        raise SystemExit("usage: python -m tests.history_check summary")
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    with open(SUMMARY, encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line)
            total = totals[(row["fault"], row["backend"])]
            for i, key in enumerate(("injected", "ops", "violations")):
                total[i] += row[key]
            total[3] += 1
    print("| fault | backend | runs | injected | operations checked | violations |")
    print("|---|---|---|---|---|---|")
    for (fault, backend), (injected, ops, bad, runs) in sorted(totals.items()):
        print(f"| {fault} | {backend} | {runs} | {injected} | {ops} | {bad} |")


if __name__ == "__main__":
    main(sys.argv[1:])
