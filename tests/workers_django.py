"""Worker processes for the Django integration tests: ``python -m tests.workers_django ...``.

Each prints JSON events, one per line, on stdout.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.workers import emit, run


def get(url: str) -> None:
    """One GET request; report status, Retry-After and body."""
    try:
        with urllib.request.urlopen(url, timeout=180) as response:
            status, headers, body = response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        status, headers, body = exc.code, exc.headers, exc.read()
    emit(
        event="response",
        status=status,
        retry_after=headers.get("Retry-After"),
        body=body.decode("utf-8", "replace"),
        ended=time.time(),
    )


def hold_until(name: str, ttl: float, holder: str, gate: str) -> None:
    """Hold ``name`` until the gate file exists; then renew and release, reporting each."""
    import locks

    lease = locks.acquire(name, ttl=ttl, timeout=30, holder=holder, note="held by a test worker")
    emit(event="acquired", token=lease.token, holder=lease.holder)
    deadline = time.monotonic() + 240
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    for step in (lease.renew, lease.release):
        try:
            step()
            emit(event=step.__name__, outcome="ok")
        except locks.LockLost as exc:
            emit(event=step.__name__, outcome="LockLost", error=str(exc))


SCENARIOS = {
    "get": lambda a: get(a[0]),
    "hold_until": lambda a: hold_until(a[0], float(a[1]), a[2], a[3]),
}


def main() -> None:
    run(SCENARIOS)


if __name__ == "__main__":
    main()
