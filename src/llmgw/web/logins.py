"""Failed sign-ins: throttled per account and per client address, and remembered for administrators.

Without it twenty wrong passwords in a second were all checked and answered at
once, so a password could be guessed as fast as scrypt allows. Each email
typed and each client address has a count of failures: the first few are free,
then every further failure locks that email (or address) out for twice as long
as the last, up to MAX_LOCK_S. The count is kept for whatever is typed, whether
an account has that email or not, so the answers never tell which emails have
accounts.

Attempts still being checked count as failures-to-be: twenty sent together
cannot all slip in before the first of them has failed.
"""

from __future__ import annotations

import collections
import contextlib
import math
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import attrs
import structlog

log = structlog.get_logger(__name__)

# Failures allowed before the first lockout: a person who mistypes a few times is never locked out.
ACCOUNT_FREE = 5
# Higher per address: the people behind one NAT or office proxy share it.
ADDRESS_FREE = 20
# The first lockout; each further failure doubles it.
FIRST_LOCK_S = 1.0
MAX_LOCK_S = 900.0
# A count with no failure for this long starts again from zero.
FORGET_AFTER_S = 3600.0
# Counts kept at most: emails are whatever a client types, and memory must not grow without end.
MAX_TRACKED = 100_000
# Failures shown to administrators.
RECENT = 50
# An email longer than this is kept cut short: it is only shown and counted.
_MAX_EMAIL = 254


class Throttled(Exception):
    """Too many failed sign-ins for this email or from this address; try again after retry_after_s."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"too many failed sign-ins; try again in {retry_after_s} s")
        self.retry_after_s = retry_after_s


@attrs.frozen
class FailedLogin:
    """One failed or refused sign-in, as the administrators' page shows it."""

    at: datetime
    email: str
    address: str
    # "wrong email or password", or "refused: locked for another N s".
    outcome: str


@attrs.define
class _Count:
    failures: int = 0
    # Attempts admitted and still being checked.
    pending: int = 0
    locked_until: float = 0.0
    last_failure: float = 0.0


def _lock_s(failures: int, free: int) -> float:
    """How long failures (at least free of them) lock their email or address out."""
    return float(min(FIRST_LOCK_S * 2 ** (failures - free), MAX_LOCK_S))


class Attempt:
    """One admitted sign-in; say how it went with failed() or succeeded(), else it counts as neither."""

    def __init__(self, throttle: LoginThrottle, email: str, address: str) -> None:
        self._throttle = throttle
        self.email = email
        self.address = address
        self._done = False

    def failed(self) -> None:
        self._end()
        self._throttle._failed(self.email, self.address)

    def succeeded(self) -> None:
        self._end()
        self._throttle._succeeded(self.email)

    def release(self) -> None:
        """The check never finished (the client went away): neither a failure nor a success."""
        if not self._done:
            self._end()

    def _end(self) -> None:
        assert not self._done, "an attempt ends once"
        self._done = True
        self._throttle._release(self.email, self.address)


class LoginThrottle:
    """The counts of failed sign-ins per email and per client address, in this process's memory.

    clock is monotonic seconds (injectable, so that tests need not wait out a lockout); wall
    says when a failure happened, for the administrators' page.
    """

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._clock = clock
        self._wall = wall
        self._counts: collections.OrderedDict[tuple[str, str], _Count] = collections.OrderedDict()
        self._recent: collections.deque[FailedLogin] = collections.deque(maxlen=RECENT)

    @contextlib.contextmanager
    def attempt(self, email: str, address: str) -> Iterator[Attempt]:
        """Admit a sign-in for email from address, or raise Throttled; release it however it ends."""
        attempt = self.begin(email, address)
        try:
            yield attempt
        finally:
            attempt.release()

    def begin(self, email: str, address: str) -> Attempt:
        """Admit a sign-in for email from address, or raise Throttled saying how long to wait."""
        email = _key(email)
        now = self._clock()
        waits = [
            wait
            for kind, name, free in (("email", email, ACCOUNT_FREE), ("address", address, ADDRESS_FREE))
            if (wait := self._wait_s(self._count(kind, name, now), free, now)) > 0
        ]
        if waits:
            retry = max(1, math.ceil(max(waits)))
            log.warning(
                "sign-in refused: too many failures", email=email, address=address, retry_after_s=retry
            )
            self._remember(email, address, f"refused: locked for another {retry} s")
            raise Throttled(retry)
        self._count("email", email, now).pending += 1
        self._count("address", address, now).pending += 1
        return Attempt(self, email, address)

    def recent(self) -> list[FailedLogin]:
        """The last RECENT failed or refused sign-ins, newest first."""
        return list(reversed(self._recent))

    @staticmethod
    def _wait_s(count: _Count, free: int, now: float) -> float:
        if now < count.locked_until:
            return count.locked_until - now
        # At least one attempt at a time once locked before; never more than would lock if all failed.
        if count.pending >= max(free - count.failures, 1):
            return _lock_s(count.failures + count.pending, free)
        return 0.0

    def _count(self, kind: str, name: str, now: float) -> _Count:
        key = (kind, name)
        count = self._counts.get(key)
        if count is None:
            count = self._counts[key] = _Count()
            self._evict()
        elif count.pending == 0 and now >= count.locked_until and now - count.last_failure > FORGET_AFTER_S:
            count.failures = 0
        self._counts.move_to_end(key)
        return count

    def _evict(self) -> None:
        # The least recently touched first; one still being checked stays, or its end would miscount.
        while len(self._counts) > MAX_TRACKED:
            key, oldest = next(iter(self._counts.items()))
            if oldest.pending:
                self._counts.move_to_end(key)
                continue
            del self._counts[key]

    def _release(self, email: str, address: str) -> None:
        for key in (("email", email), ("address", address)):
            if (count := self._counts.get(key)) is not None:
                count.pending -= 1

    def _failed(self, email: str, address: str) -> None:
        now = self._clock()
        locks = []
        for kind, name, free in (("email", email, ACCOUNT_FREE), ("address", address, ADDRESS_FREE)):
            count = self._count(kind, name, now)
            count.failures += 1
            count.last_failure = now
            if count.failures >= free:
                lock = _lock_s(count.failures, free)
                count.locked_until = now + lock
                locks.append(lock)
        outcome = "wrong email or password"
        if locks:
            outcome += f"; locked for {math.ceil(max(locks))} s"
        log.warning("failed sign-in", email=email, address=address, outcome=outcome)
        self._remember(email, address, outcome)

    def _succeeded(self, email: str) -> None:
        # Only the email's count: a right password for one account says nothing of the guesses an
        # address made at others.
        count = self._counts.get(("email", email))
        if count is not None and count.pending == 0:
            del self._counts[("email", email)]
        elif count is not None:
            count.failures, count.locked_until = 0, 0.0

    def _remember(self, email: str, address: str, outcome: str) -> None:
        self._recent.append(FailedLogin(at=self._wall(), email=email, address=address, outcome=outcome))


def _key(email: str) -> str:
    """The email as accounts compare it (without regard to case), cut short to be kept."""
    return email.strip().lower()[:_MAX_EMAIL]
