"""Steady chat traffic through gateways from one host, every outcome kept: what a roll must not break."""

from __future__ import annotations

import threading
import time
from typing import Any

import attrs

from .cluster import Reply, http
from .netns import Host, wait_until


@attrs.define
class Traffic:
    """Clients on host posting chat completions to gateways until stopped: (when, status) of each.

    Client i sends to gateways[i % len(gateways)] and, when that one does not answer at all (its
    listener closed: a server stopping), sends the request once more to the next, as a load balancer
    retries a connection refused on another backend. Each of `clients` pauses `pause_s` after each
    answer: 2 clients and 0.1 s, at most 20 a second. Status 0: no answer from any; negative: an
    answer without a completion.
    """

    host: Host
    gateways: list[str]
    model: str
    # The API key sent, if any.
    key: str = ""
    clients: int = 2
    pause_s: float = 0.1
    outcomes: list[tuple[float, int]] = attrs.Factory(list)
    # Requests answered by the next gateway after the first did not answer.
    failed_over: int = 0
    # (when, the gateway, its status, its body) of every request without a completion.
    failures: list[tuple[float, str, int, Any]] = attrs.Factory(list)
    _stop: threading.Event = attrs.Factory(threading.Event)
    _threads: list[threading.Thread] = attrs.Factory(list)

    def start(self) -> None:
        for i in range(self.clients):
            turn = i % len(self.gateways)
            order = self.gateways[turn:] + self.gateways[:turn]
            client = threading.Thread(
                target=lambda order=order: self.host.call_here(lambda: self._ask(order)), daemon=True
            )
            client.start()
            self._threads.append(client)

    def _ask(self, order: list[str]) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else None
        while not self._stop.is_set():
            for tries, gateway in enumerate(order):
                reply: Reply = http("POST", f"{gateway}/v1/chat/completions", body, headers, timeout_s=30.0)
                if reply.status != 0:
                    self.failed_over += tries > 0
                    break
            ok = isinstance(reply.body, dict) and "choices" in reply.body
            self.outcomes.append((time.monotonic(), reply.status if ok else -reply.status))
            if not ok:
                self.failures.append((time.monotonic(), gateway, reply.status, reply.body))
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

    def failed(self) -> list[int]:
        """The status of every request that did not get a completion."""
        return [status for _, status in self.outcomes if status != 200]

    def rate(self) -> float:
        """Requests answered a second, from the first to the last."""
        return len(self.outcomes) / max(self.outcomes[-1][0] - self.outcomes[0][0], 1e-9)
