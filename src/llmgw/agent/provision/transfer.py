"""An engine archive's download as an install's detail: "downloading X (12 of 16 MB)".

Its size alone, said once when the server gave it, stayed on the node's
status for the minutes a slow mirror took: "downloading
llama-b1-bin-ubuntu-x64.tar.gz (391 KB)" read the same at the first byte,
at the last, and while nothing arrived at all. Here the amount is said again
as it grows (when its words change, and by a hundredth of the file at least,
so a gigabyte of CUDA runtime is not a thousand heartbeats), and a download
that receives nothing for a while says so, counting on, until bytes arrive.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType

# How long a download may receive nothing before its detail says so.
STALL_S = 60.0
# Said again after at least this share of the file arrived.
_STEPS = 100


class DownloadReport:
    """The progress callback of one download (ReleaseClient.download's progress), saying its detail.

    Used as `with`: the watch for a stall starts on entering (a server that never answers
    counts too) and stops on leaving.
    """

    def __init__(self, asset: str, say: Callable[[str], None], stall_s: float = STALL_S) -> None:
        self._asset = asset
        self._say = say
        self._stall_s = stall_s
        self._done = 0
        self._size: int | None = None
        # What was last said of the amount, and at how many bytes.
        self._said = ""
        self._said_at = 0
        # Stall periods in a row with nothing received.
        self._stalls = 0
        self._timer: asyncio.TimerHandle | None = None

    def __enter__(self) -> DownloadReport:
        self._say(f"downloading {self._asset}")
        self._watch()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def __call__(self, done: int, size: int | None) -> None:
        """done bytes of the file (of size, when known) are on disk."""
        stalled = self._stalls > 0
        self._done, self._size, self._stalls = done, size, 0
        self._watch()
        amount = amount_of(done, size)
        step = (size or 0) // _STEPS
        if stalled or (amount != self._said and (not self._said or done - self._said_at >= step)):
            self._said, self._said_at = amount, done
            self._say(f"downloading {self._asset} ({amount})")

    def _watch(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self._stall_s, self._stalled)

    def _stalled(self) -> None:
        self._stalls += 1
        self._timer = asyncio.get_running_loop().call_later(self._stall_s, self._stalled)
        quiet = f"nothing received for {self._stalls * self._stall_s:g} s"
        said = f"{self._said}; {quiet}" if self._said else quiet
        self._say(f"downloading {self._asset} ({said})")


def amount_of(done: int, size: int | None) -> str:
    """ "12 of 16 MB" in the unit of the whole (binary, as `ls -h` says it); "12 MB" without it."""
    scale = size if size is not None else done
    unit, shift = next(
        ((u, s) for u, s in (("GB", 30), ("MB", 20), ("KB", 10)) if scale >= 1 << s), ("bytes", 0)
    )

    def said(n: int) -> str:
        # Gigabytes with a decimal: "1 of 3 GB" would stay put for a third of the download.
        return f"{n / (1 << 30):.1f}" if unit == "GB" else str(n >> shift)

    return f"{said(done)} {unit}" if size is None else f"{said(done)} of {said(size)} {unit}"
