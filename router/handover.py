"""What survives when a request's output moves to another worker, and what the router does for
what does not (token-ID migration: the new worker prefills prompt + delivered tokens and goes on,
see router/resume.py).

The tokens carry over; the worker-side state derived from the output does not:
- a grammar (`json_schema`, `regex`, `ebnf`, `structural_tag`; OpenAI's `response_format` arrives
  as `json_schema`) is compiled afresh by the new worker and starts at its root, although the
  output is already inside the grammar: what it then allows can break the client's schema. Such
  a request is never moved by choice once it has a token (`migration_blocker`); when its worker
  is lost, the dispatcher restarts it from scratch if nothing reached the client yet, and ends
  it with an error naming the reason otherwise.
- stop strings and `stop_regex` patterns are matched by SGLang over the worker's own output only,
  so a match spanning the hand-over is missed: the router matches them itself over the joined
  text (`StopWatch`) until the new worker's output is long enough to hold any match whole. It
  runs only patterns whose matching cost scheduler/core/regex_guard.py bounds (the router's
  ingress refuses the others); a request with any other is never moved by choice.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scheduler.core.regex_guard import UnsafeRegex, pattern_cost

CONSTRAINT_PARAMS = ("json_schema", "regex", "ebnf", "structural_tag")
MAX_BYTES_PER_CHAR = 4  # UTF-8: byte-level tokenizers may spend this many tokens on one character
REPLACEMENT = "\ufffd"  # a character split across tokens decodes as this until it is complete

Decode = Callable[[Sequence[int]], str]


class MigrationRefused(RuntimeError):
    """An operator asked to move a request whose output cannot be carried over (HTTP 409)."""


def constraint_of(params: Mapping[str, Any]) -> str | None:
    """The sampling parameter that constrains the output with a grammar, if any."""
    return next((name for name in CONSTRAINT_PARAMS if params.get(name) not in (None, "")), None)


def stop_strings(params: Mapping[str, Any]) -> tuple[str, ...]:
    """The non-empty `stop` strings (SGLang takes one string or a list)."""
    stop = params.get("stop")
    values = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    return tuple(s for s in values if isinstance(s, str) and s)


def stop_regexes(params: Mapping[str, Any]) -> tuple[str, ...]:
    """The non-empty `stop_regex` patterns (one string or a list)."""
    value = params.get("stop_regex")
    values = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    return tuple(p for p in values if isinstance(p, str) and p)


@functools.lru_cache(maxsize=1024)  # asked on every migration check of a request with patterns
def regex_reach(pattern: str) -> int | None:
    """The longest text `pattern` can match, or None when its cost is unbounded (never run here)."""
    try:
        return pattern_cost(pattern).longest
    except UnsafeRegex:
        return None


def migration_blocker(params: Mapping[str, Any], generated: int, watches_stops: bool) -> str | None:
    """Why a request with `generated` tokens must stay on its worker (None: it may move).

    Before its first token nothing worker-side exists yet, so every request may move then.
    `watches_stops`: the router can match stop strings across the hand-over (it has a decoder).
    """
    if generated <= 0:
        return None
    name = constraint_of(params)
    if name is not None:
        return (
            f"its output is constrained by {name}; a worker resuming it after {generated} tokens"
            " would restart the grammar at its root"
        )
    regexes = stop_regexes(params)
    if any(regex_reach(p) is None for p in regexes):
        return "its stop_regex has no bounded matching cost, so the router cannot match it across the hand-over"
    if (stop_strings(params) or regexes) and not watches_stops:
        return "a stop match spanning the hand-over would be missed (the router has no decoder)"
    return None


class StopWatch:
    """Matches stop strings and patterns over the text around one hand-over, which no worker
    sees whole.

    It decodes a tail of the tokens delivered before the hand-over with the new worker's tokens,
    and stops watching once the new output is as long as the longest possible match: from then on
    a match lies wholly in the new worker's output, which the worker matches itself.
    """

    def __init__(
        self, stops: Sequence[str], delivered: Sequence[int], decode: Decode, regexes: Sequence[str] = ()
    ) -> None:
        self.stops = tuple(stops)
        reach = {p: regex_reach(p) for p in regexes}
        self.regexes = [(p, re.compile(p), n) for p, n in reach.items() if n]  # unbounded ones never run here
        self.longest = max([len(s) for s in self.stops] + [n for _, _, n in self.regexes] + [1])
        # enough tokens for the longest stop string's head, however many tokens a character takes
        self._head = list(delivered[-(MAX_BYTES_PER_CHAR * self.longest + 1) :])
        self._new: list[int] = []
        self._decode = decode
        self._boundary = len(decode(self._head).rstrip(REPLACEMENT))  # text position of the hand-over
        self.done = not self.stops and not self.regexes  # nothing the router may run

    def feed(self, tokens: Sequence[int]) -> tuple[int, str] | None:
        """Take the new worker's next tokens: (how many of them to keep, the stop string) when a
        stop string spanning the hand-over completes among them, else None."""
        if self.done:
            return None
        for keep in range(1, len(tokens) + 1):
            text = self._decode([*self._head, *self._new, *tokens[:keep]])
            matched = self._spanning(text)
            if matched is not None:
                self.done = True
                return keep, matched
        self._new.extend(tokens)
        text = self._decode([*self._head, *self._new]).rstrip(REPLACEMENT)
        self.done = len(text) >= self._boundary + self.longest - 1
        return None

    def _spanning(self, text: str) -> str | None:
        """The stop string or pattern whose match starts before the hand-over and ends after it."""
        b = self._boundary
        for stop in self.stops:
            start = text.find(stop, max(0, b - len(stop) + 1))
            if start != -1 and start < b < start + len(stop):
                return stop
        for source, pattern, reach in self.regexes:
            pos = max(0, b - reach + 1)
            while (m := pattern.search(text, pos)) is not None and m.start() < b:
                if m.end() > b:
                    return source
                pos = m.start() + 1
        return None
