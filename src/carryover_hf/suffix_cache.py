"""A suffix cache: draft tokens from the longest earlier match of the sequence's end, with frequency-scored
continuations (the idea of SuffixDecoding, arXiv 2411.04975; written here from the paper's description).

Token sequences are indexed by every n-gram of length 1..`max_match` they contain, each n-gram pointing at the
positions right after its occurrences. A proposal looks up the sequence's last `max_match` tokens, then shorter
suffixes down to `min_match`, and stops at the longest one that occurred. From the positions that followed it,
it grows a continuation one token at a time: the most frequent next token, kept while its share of the occurrences
that still agree is at least `min_share`. How many tokens it may draft grows with the match:
`ceil(alpha * match_length)`, at most `max_drafts`. A long, frequent match drafts long; a short or ambiguous one
drafts little or nothing.

Two scopes feed a proposal:

* the live sequence of one `generate` call (prompt and output so far): `SuffixSession`, indexed as tokens arrive;
* earlier sequences kept across calls: `SuffixCache.add` (a finished session adds its sequence when the cache keeps
  outputs), bounded by `max_tokens` and evicting the oldest sequences first.

Occurrences in the live sequence count `live_weight` times as much as cached ones (the current text is the best
predictor of itself). A `SuffixCache` may be shared by threads of one process: every method holds its lock.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SuffixProposal:
    """Drafted tokens, the suffix length that matched, and the share of occurrences behind each draft."""

    tokens: tuple[int, ...]
    match_length: int
    shares: tuple[float, ...]


class _Index:
    """n-grams (1..max_match) of token sequences -> (sequence id, position after the n-gram)."""

    def __init__(self, max_match: int):
        self.max_match = max_match
        self.sequences: dict[int, list[int]] = {}
        self.positions: dict[tuple[int, ...], list[tuple[int, int]]] = defaultdict(list)

    def extend(self, key: int, tokens: Sequence[int]) -> None:
        """Appends `tokens` to sequence `key` and indexes the n-grams that end at each new token."""
        sequence = self.sequences.setdefault(key, [])
        for token in tokens:
            sequence.append(int(token))
            end = len(sequence)
            # the n-grams ending at the previous token are now followed by this one: index them at `end - 1`
            for n in range(1, min(self.max_match, end - 1) + 1):
                self.positions[tuple(sequence[end - 1 - n : end - 1])].append((key, end - 1))

    def remove(self, key: int) -> int:
        sequence = self.sequences.pop(key, [])
        grams = {tuple(sequence[s : s + n]) for n in range(1, self.max_match + 1) for s in range(len(sequence) - n)}
        for gram in grams:  # each occurrence list filtered once
            kept = [hit for hit in self.positions.get(gram, ()) if hit[0] != key]
            if kept:
                self.positions[gram] = kept
            else:
                self.positions.pop(gram, None)
        return len(sequence)

    def followers(self, gram: tuple[int, ...]) -> list[tuple[int, int]]:
        return self.positions.get(gram, [])

    def token(self, key: int, position: int) -> int | None:
        sequence = self.sequences[key]
        return sequence[position] if position < len(sequence) else None


def _grow(
    scopes: list[tuple[_Index, list[tuple[int, int]], float]], max_tokens: int, min_share: float
) -> tuple[list[int], list[float]]:
    """Greedy continuation over the occurrences of all scopes: (index, [(key, position)], weight) each."""
    tokens: list[int] = []
    shares: list[float] = []
    live = [(index, list(hits), weight) for index, hits, weight in scopes]
    while len(tokens) < max_tokens:
        votes: Counter = Counter()
        for index, hits, weight in live:
            for key, position in hits:
                token = index.token(key, position)
                if token is not None:
                    votes[token] += weight
        total = sum(votes.values())
        if not total:
            break
        token, weight = votes.most_common(1)[0]
        share = weight / total
        if share < min_share:
            break
        tokens.append(token)
        shares.append(share)
        live = [
            (index, [(k, p + 1) for k, p in hits if index.token(k, p) == token], w) for index, hits, w in live
        ]
    return tokens, shares


class SuffixCache:
    """Sequences kept across `generate` calls (prompts and outputs), bounded, thread-safe; see the module text.

    Args:
        max_match: longest suffix looked up (and longest n-gram indexed).
        min_match: shortest suffix that may propose.
        max_drafts: most tokens one proposal drafts.
        alpha: draft at most `ceil(alpha * match_length)` tokens.
        min_share: stop a continuation where its most frequent next token has less than this share.
        max_tokens: tokens kept across calls; the oldest sequences go first when a new one would pass it. The index
            holds about `max_match` entries per token (roughly 1 KB per kept token in CPython at the defaults).
        live_weight: how much an occurrence in the live sequence counts against one in the cache.
        keep_outputs: whether finished sessions add their sequences to the cache.
    """

    def __init__(
        self,
        max_match: int = 8,
        min_match: int = 2,
        max_drafts: int = 16,
        alpha: float = 2.0,
        min_share: float = 0.3,
        max_tokens: int = 200_000,
        live_weight: float = 2.0,
        keep_outputs: bool = True,
    ):
        if not 1 <= min_match <= max_match:
            raise ValueError(f"min_match must lie in [1, max_match={max_match}], got {min_match}.")
        if max_drafts < 1 or alpha <= 0 or not 0.0 < min_share <= 1.0 or max_tokens < 1 or live_weight <= 0:
            raise ValueError(
                "max_drafts and max_tokens must be at least 1, alpha and live_weight positive, min_share in (0, 1]; "
                f"got max_drafts={max_drafts}, max_tokens={max_tokens}, alpha={alpha}, live_weight={live_weight}, "
                f"min_share={min_share}."
            )
        self.max_match, self.min_match, self.max_drafts = max_match, min_match, max_drafts
        self.alpha, self.min_share, self.max_tokens = alpha, min_share, max_tokens
        self.live_weight, self.keep_outputs = live_weight, keep_outputs
        self._index = _Index(max_match)
        self._order: OrderedDict[int, int] = OrderedDict()  # key -> length, oldest first
        self._next_key = 0
        self._tokens = 0
        self._lock = threading.RLock()
        self._open: list[SuffixSession] = []  # sessions whose sequences join the cache when the next one starts

    # -- the cache across calls -------------------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        with self._lock:
            return self._tokens

    @property
    def num_sequences(self) -> int:
        with self._lock:
            return len(self._order)

    def add(self, tokens: Iterable[int]) -> None:
        """Keeps a sequence (a prompt, an output, a document) for later proposals, evicting the oldest ones if the
        cache would pass `max_tokens`; a sequence longer than `max_tokens` keeps its last `max_tokens` tokens."""
        tokens = [int(t) for t in tokens][-self.max_tokens :]
        if not tokens:
            return
        with self._lock:
            while self._order and self._tokens + len(tokens) > self.max_tokens:
                key, _ = self._order.popitem(last=False)
                self._tokens -= self._index.remove(key)
            key = self._next_key
            self._next_key += 1
            self._index.extend(key, tokens)
            self._order[key] = len(tokens)
            self._tokens += len(tokens)

    def clear(self) -> None:
        with self._lock:
            self._index = _Index(self.max_match)
            self._order.clear()
            self._tokens = 0

    def session(self, prompt: Iterable[int]) -> "SuffixSession":
        """The live sequence of one `generate` call, starting with its prompt. Sessions not finished yet are finished
        first (a `generate` call has no end hook: its sequence joins the cache when the next call starts)."""
        with self._lock:
            earlier, self._open = self._open, []
        for session in earlier:
            session.finish()
        session = SuffixSession(self, prompt)
        with self._lock:
            self._open.append(session)
        return session

    # -- proposals ----------------------------------------------------------------------------------------------------
    def _propose(self, live: _Index | None, sequence: Sequence[int], max_drafts: int) -> SuffixProposal | None:
        limit = min(max_drafts, self.max_drafts)
        if limit < 1:
            return None
        with self._lock:
            for n in range(min(self.max_match, len(sequence)), self.min_match - 1, -1):
                gram = tuple(int(t) for t in sequence[len(sequence) - n :])
                scopes = [(self._index, list(self._index.followers(gram)), 1.0)]
                if live is not None:
                    scopes.append((live, list(live.followers(gram)), self.live_weight))
                if not any(hits for _, hits, _ in scopes):
                    continue
                tokens, shares = _grow(scopes, min(limit, math.ceil(self.alpha * n)), self.min_share)
                if tokens:
                    return SuffixProposal(tuple(tokens), n, tuple(shares))
                return None  # the longest match is ambiguous: a shorter one would only be more so
        return None

    def propose(self, sequence: Sequence[int], max_drafts: int | None = None) -> SuffixProposal | None:
        """Drafts after `sequence` from the cached sequences alone (no live session)."""
        return self._propose(None, sequence, self.max_drafts if max_drafts is None else max_drafts)


class SuffixSession:
    """One sequence as it grows (prompt, then accepted tokens), proposing from itself and its cache."""

    def __init__(self, cache: SuffixCache, prompt: Iterable[int]):
        self.cache = cache
        self._live = _Index(cache.max_match)
        self._live.extend(0, list(prompt))
        self.finished = False

    @property
    def tokens(self) -> list[int]:
        return self._live.sequences[0]

    def extend(self, tokens: Iterable[int]) -> None:
        """Accepted tokens join the live sequence."""
        self._live.extend(0, list(tokens))

    def propose(self, max_drafts: int | None = None) -> SuffixProposal | None:
        limit = self.cache.max_drafts if max_drafts is None else max_drafts
        return self.cache._propose(self._live, self.tokens, limit)

    def finish(self) -> None:
        """Adds the whole sequence to the cache when it keeps outputs (later calls can then draft from it); once."""
        if self.cache.keep_outputs and not self.finished:
            self.cache.add(self.tokens)
        self.finished = True


__all__ = ["SuffixCache", "SuffixProposal", "SuffixSession"]
