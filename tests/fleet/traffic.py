"""Steady chat traffic through a gateway from one host, every outcome kept: what a roll must not break."""

from __future__ import annotations

import threading
import time

import attrs

from .cluster import Reply, http
from .netns import Host, wait_until


@attrs.define
class Traffic:
    """Clients on host posting chat completions to gateway until stopped: (when, status) of each.

    Each of `clients` pauses `pause_s` after each answer: 2 clients and 0.1 s, at most 20 a second.
    Status 0: no answer at all; negative: an answer without a completion.
    """

    host: Host
    gateway: str
    model: str
    key: str
    clients: int = 2
    pause_s: float = 0.1
    outcomes: list[tuple[float, int]] = attrs.Factory(list)
    _stop: threading.Event = attrs.Factory(threading.Event)
    _threads: list[threading.Thread] = attrs.Factory(list)

    def start(self) -> None:
        for _ in range(self.clients):
            client = threading.Thread(target=lambda: self.host.call_here(self._ask), daemon=True)
            client.start()
            self._threads.append(client)

    def _ask(self) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        headers = {"Authorization": f"Bearer {self.key}"}
        while not self._stop.is_set():
            reply: Reply = http("POST", f"{self.gateway}/v1/chat/completions", body, headers, timeout_s=30.0)
            ok = isinstance(reply.body, dict) and "choices" in reply.body
            self.outcomes.append((time.monotonic(), reply.status if ok else -reply.status))
            time.sleep(self.pause_s)

    def wait_for(self, more: int, timeout_s: float = 60.0) -> None:
        goal = len(self.outcomes) + more
        wait_until(lambda: len(self.outcomes) >= goal, timeout_s, f"{more} more requests answered")

    def stop(self) -> list[tuple[float, int]]:
        """Stop the clients once their requests in flight are answered; every outcome."""
        self._stop.set()
        for client in self._threads:
            client.join(timeout=60)
        return list(self.outcomes)

    def failed(self) -> list[tuple[float, int]]:
        return [o for o in self.outcomes if o[1] != 200]
