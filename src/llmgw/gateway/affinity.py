"""Where a request goes when its engine may already hold its prompt: a session's replica, or a prefix's.

Engines keep the KV cache of the prompts they have just served (llama-server reuses a slot's
cached prefix; vLLM and SGLang cache prefixes), so a conversation's next turn, or a prompt that
shares a long system prompt with one just served, costs no prefill on the replica that saw it.

Both choices give way to load: a replica is chosen for its cache only while its requests in flight,
this one counted, stay within `load_factor` × the mean over the model's ready replicas (consistent
hashing with bounded loads, Mirrokni, Thorup and Zadimoghaddam 2018). Both choose among the ready
replicas they are given and nothing else, so a replica that is draining, failed or gone is never
picked for what it remembers.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

# Points each replica has on the hash ring: enough that replicas share the sessions within a few
# percent of evenly, few enough that a ring of a dozen replicas builds in well under a millisecond.
_POINTS_PER_REPLICA = 64
# Rings kept for the sets of ready replicas seen lately; a set changes when a replica joins or leaves,
# so a handful covers every model, and the cache is cleared rather than grown past it.
_RINGS = 64
# Sessions whose replica is remembered. A session forgotten goes back to its place on the ring, which
# is where it started unless it had moved, so forgetting costs at most one cold prefill.
_SESSIONS = 65536
# Characters in one block of a completion's prompt (a chat's blocks are its messages): a prompt
# matches a replica's by whole blocks, so a shorter shared start is not worth routing for.
BLOCK_CHARS = 1024
# The owner the prefix index gives a prefix that more than one replica has served: a shared system
# prompt, typically, which every replica then caches. Choosing by it would send every new
# conversation to whichever replica served that prompt last, piling them onto one; a request whose
# longest remembered prefix is shared goes to the fewest in flight instead.
_SHARED = ""
# Characters of one prompt the index hashes: the first 64K. The decision's cost stays bounded on a
# prompt of megabytes, and two prompts alike in their first 64K characters are one conversation anyway.
_MAX_CHARS = 65536


def load_bound(endpoints: Sequence[str], in_flight: Mapping[str, int], factor: float) -> int:
    """The most requests in flight a replica may have, this one counted, to be chosen for its cache.

    factor × the mean, rounded up, so that some replica is always within it (their bounds add up to
    at least the load); and never less than one above the mean rounded up. Without that floor, two
    replicas at a load of two had a bound of two: a conversation whose replica held two requests
    while the other held none moved, paying its whole history's prefill to save a wait behind two
    requests the engine batches with it, and the prefix index then followed it to the other replica.
    """
    total = 0
    for endpoint in endpoints:
        total += in_flight.get(endpoint, 0)
    mean = (total + 1) / len(endpoints)
    return max(math.ceil(factor * mean), math.ceil(mean) + 1)


class Sessions:
    """Session affinity: a session stays on one replica while it is within the load bound."""

    def __init__(self, capacity: int = _SESSIONS) -> None:
        self._capacity = capacity
        # Keyed by the session key's hash, not the key: a client's `user` may be a megabyte long.
        self._homes: OrderedDict[tuple[str, int], str] = OrderedDict()
        self._rings: dict[tuple[str, ...], tuple[list[int], list[str]]] = {}

    def choose(
        self,
        model: str,
        session: str,
        endpoints: Sequence[str],
        in_flight: Mapping[str, int],
        factor: float,
    ) -> str:
        """The ready replica for session: its home while within the bound, else the next on the ring.

        A session that moves stays where it moved to: that replica now holds its cache. Replicas
        joining move no session; one leaving moves only the sessions it had.
        """
        bound = load_bound(endpoints, in_flight, factor)
        point = hash(session)
        key = (model, point)
        home = self._homes.get(key)
        if home is not None and home in endpoints and in_flight.get(home, 0) < bound:
            self._homes.move_to_end(key)
            return home
        points, owners = self._ring(endpoints)
        start = bisect.bisect(points, point)
        chosen = ""
        seen = set[str]()
        for i in range(len(points)):
            owner = owners[(start + i) % len(points)]
            if owner in seen:
                continue
            if in_flight.get(owner, 0) < bound:
                chosen = owner
                break
            seen.add(owner)
            if len(seen) == len(endpoints):
                break
        if not chosen:
            # Unreachable while the bound rounds up (some replica is always within it); kept so a
            # change to the bound can never leave a request without a replica.
            chosen = min(endpoints, key=lambda e: in_flight.get(e, 0))
        self._homes[key] = chosen
        self._homes.move_to_end(key)
        if len(self._homes) > self._capacity:
            self._homes.popitem(last=False)
        return chosen

    def _ring(self, endpoints: Sequence[str]) -> tuple[list[int], list[str]]:
        """The hash ring of these replicas: its sorted points, and each point's replica."""
        key = tuple(endpoints)
        ring = self._rings.get(key)
        if ring is None:
            # Sorted by endpoint, not the table's order, so one set of replicas is always one ring.
            pairs = sorted(
                (hash(f"{endpoint}#{i}"), endpoint)
                for endpoint in sorted(set(endpoints))
                for i in range(_POINTS_PER_REPLICA)
            )
            ring = ([point for point, _ in pairs], [endpoint for _, endpoint in pairs])
            if len(self._rings) >= _RINGS:
                self._rings.clear()
            self._rings[key] = ring
        return ring


def prompt_blocks(model: str, payload: Mapping[str, Any]) -> list[int]:
    """The hashes of a request's prompt prefixes: one per chat message, each covering those before it.

    A chat grows by whole messages, so a message is the unit a conversation's next turn shares with
    its last; a completion's `prompt` is cut every BLOCK_CHARS characters instead. Read from the body
    the pipeline already parsed, with Python's own string hashing (in C): no tokenizer, no rendering
    and no copy of the prompt is kept. Values of the wrong type count as nothing: the engine, not
    the router, answers for what it accepts.
    """
    blocks: list[int] = []
    chained = hash(model)
    budget = _MAX_CHARS
    messages = payload.get("messages")
    if isinstance(messages, list):
        for message in messages:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, list):
                # Text parts only: an image's bytes are not worth hashing to route by.
                content = tuple(p.get("text") for p in content if isinstance(p, dict))
                size = sum(len(t) for t in content if isinstance(t, str))
            else:
                size = len(content) if isinstance(content, str) else 0
            if size > budget:
                # Past the budget the prompt is one long tail: its choice was made by what came before.
                break
            budget -= size
            try:
                chained = hash((chained, message.get("role"), content))
            except TypeError:
                # Unhashable content (a dict, say): the engine will refuse it; route by what came before.
                break
            blocks.append(chained)
        return blocks
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        prompt = "\n".join(prompt)
    if isinstance(prompt, str):
        end = min(len(prompt), _MAX_CHARS) // BLOCK_CHARS * BLOCK_CHARS
        for start in range(0, end, BLOCK_CHARS):
            chained = hash((chained, prompt[start : start + BLOCK_CHARS]))
            blocks.append(chained)
    return blocks


class PrefixIndex:
    """Which replica most recently served each prompt prefix, for a bounded number of prefixes.

    Approximate by design: a prefix's hash names one replica, the one that served it, or none in
    particular once several have (_SHARED); and the prefixes least recently served are forgotten
    first, a generation at a time: recorded into the newer of two tables, the older dropped whole
    when the newer is full: two dicts swapped whole, where a true LRU would reorder a list on every
    request. A prompt's prefixes are recorded together, so what is remembered of a prompt is a
    prefix of it.
    """

    def __init__(self, capacity: int) -> None:
        self._half = max(1, capacity // 2)
        self._new: dict[int, str] = {}
        self._old: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._new) + len(self._old)

    def _owner(self, block: int) -> str | None:
        owner = self._new.get(block)
        return owner if owner is not None else self._old.get(block)

    def choose(
        self,
        blocks: Sequence[int],
        endpoints: Sequence[str],
        in_flight: Mapping[str, int],
        factor: float,
    ) -> str | None:
        """The ready replica within the bound that served the longest prefix of blocks; None if none did."""
        low = self.matched(blocks)
        if not low:
            return None
        bound = load_bound(endpoints, in_flight, factor)
        for i in range(low - 1, -1, -1):
            owner = self._owner(blocks[i])
            if owner == _SHARED:
                # Several replicas hold it, and so every shorter prefix: placed by load.
                return None
            if owner is None or owner not in endpoints:
                continue
            load = in_flight.get(owner, 0)
            if i == 0 and len(blocks) > 1:
                # Only the first message (a system prompt) matched, of a prompt that goes on: the
                # cheapest start to prefill again, once, after which that replica holds it too. Followed
                # only while its replica is among the least loaded, or every new conversation would
                # pile onto the one replica that served the system prompt first.
                return owner if all(load <= in_flight.get(e, 0) for e in endpoints) else None
            if load < bound:
                return owner
        return None

    def matched(self, blocks: Sequence[int]) -> int:
        """How many of blocks, from the first, some replica is remembered to have served."""
        new, old = self._new, self._old
        # Found by halving: what is remembered of a prompt is a prefix of it (see the class), so
        # this costs a few lookups, not one per block, on a long prompt.
        low, high = 0, len(blocks)
        while low < high:
            middle = (low + high) // 2
            if blocks[middle] in new or blocks[middle] in old:
                low = middle + 1
            else:
                high = middle
        return low

    def record(self, blocks: Sequence[int], endpoint: str) -> None:
        """endpoint has just been sent a prompt of these blocks: it now holds their prefixes."""
        blocks = blocks[: self._half]
        if len(self._new) + len(blocks) > self._half:
            self._old, self._new = self._new, {}
        new, old = self._new, self._old
        for block in blocks:
            owner = new.get(block)
            if owner is None:
                owner = old.get(block, endpoint)
            new[block] = endpoint if owner == endpoint else _SHARED
