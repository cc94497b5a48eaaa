"""What survives when a request's output moves to another worker, and what the router does for
what does not (token-ID migration: the new worker prefills prompt + delivered tokens and goes on,
see router/dispatcher.py).

The tokens carry over; the worker-side state derived from the output does not:
- a grammar (`json_schema`, `regex`, `ebnf`, `structural_tag`; OpenAI's `response_format` arrives
  as `json_schema`) is compiled afresh by the new worker and starts at its root, although the
  output is already inside the grammar: what it then allows can break the client's schema. Such
  a request is never moved by choice once it has a token (`migration_blocker`); when its worker
  is lost, the dispatcher restarts it from scratch if nothing reached the client yet, and ends
  it with an error naming the reason otherwise.
- stop strings are matched by SGLang over the worker's own output only, so one that spans the
  hand-over is missed: the router matches them itself over the joined text (`StopWatch`) until
  the new worker's output is long enough to see any stop string whole.
- a `stop_regex` match spanning the hand-over is not checked by the router (running client
  patterns on the router's event loop is what scheduler/core/regex_guard.py bounds on workers);
  a request with one is never moved by choice once it has a token.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

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
    if params.get("stop_regex"):
        return "a stop_regex match spanning the hand-over would be missed"
    if stop_strings(params) and not watches_stops:
        return "a stop string spanning the hand-over would be missed (the router has no decoder)"
    return None


class StopWatch:
    """Matches stop strings over the text around one hand-over, which no worker sees whole.

    It decodes a tail of the tokens delivered before the hand-over with the new worker's tokens,
    and stops watching once the new output is as long as the longest stop string: from then on a
    stop string lies wholly in the new worker's output, which the worker matches itself.
    """

    def __init__(self, stops: Sequence[str], delivered: Sequence[int], decode: Decode) -> None:
        self.stops = tuple(stops)
        self.longest = max(len(s) for s in self.stops)
        # enough tokens for the longest stop string's head, however many tokens a character takes
        self._head = list(delivered[-(MAX_BYTES_PER_CHAR * self.longest + 1) :])
        self._new: list[int] = []
        self._decode = decode
        self._boundary = len(decode(self._head).rstrip(REPLACEMENT))  # text position of the hand-over
        self.done = False

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
        """The stop string that starts before the hand-over and ends after it, if any."""
        for stop in self.stops:
            start = text.find(stop, max(0, self._boundary - len(stop) + 1))
            if start != -1 and start < self._boundary < start + len(stop):
                return stop
        return None
