"""The suffix cache: longest-match lookup, frequency-scored continuations, growth with the match, scopes, bounds."""

import threading

import pytest

from carryover_hf.suffix_cache import SuffixCache


def test_the_live_sequence_drafts_what_followed_its_suffix_earlier():
    cache = SuffixCache(max_match=4, min_match=2, alpha=2.0, max_drafts=8)
    session = cache.session([5, 6, 7, 8, 9, 1, 2, 5, 6, 7])
    proposal = session.propose()
    assert proposal.match_length == 3 and proposal.tokens == (8, 9, 1, 2, 5, 6)  # ceil(2 * 3) drafts
    assert all(share == 1.0 for share in proposal.shares)
    session.extend([8])
    assert session.propose().tokens[:3] == (9, 1, 2) and session.propose().match_length == 4
    assert cache.session([1, 2, 3]).propose() is None  # nothing occurred before
    assert session.propose(max_drafts=2).tokens == (9, 1)


def test_the_most_frequent_continuation_wins_and_an_ambiguous_one_stops():
    cache = SuffixCache(max_match=2, min_match=2, alpha=4.0, min_share=0.6, live_weight=1.0)
    for follower in (3, 3, 3, 4):
        cache.add([1, 2, follower, 9])
    proposal = cache.propose([7, 1, 2])
    assert proposal.tokens == (3, 9) and proposal.shares == (0.75, 1.0)
    cache.add([1, 2, 4, 9])
    cache.add([1, 2, 4, 9])  # now 3 of 6 say 3, 3 say 4: no token has a share of 0.6
    assert cache.propose([7, 1, 2]) is None


def test_outputs_of_earlier_calls_help_later_ones():
    cache = SuffixCache(max_match=3, min_match=2)
    first = cache.session([40, 41])
    first.extend([10, 11, 12, 13, 14])
    assert cache.propose([50, 10, 11]) is None  # not finished: the cache holds nothing yet
    first.finish()
    assert cache.num_sequences == 1 and cache.num_tokens == 7
    assert cache.session([50, 10, 11]).propose().tokens == (12, 13, 14)
    private = SuffixCache(keep_outputs=False)
    session = private.session([1, 2, 3])
    session.finish()
    assert private.num_sequences == 0


def test_memory_is_bounded_by_evicting_the_oldest_sequences():
    cache = SuffixCache(max_match=2, min_match=2, max_tokens=10)
    cache.add([1, 2, 3, 4])
    cache.add([5, 6, 7, 8])
    assert cache.propose([0, 1, 2]).tokens[0] == 3
    cache.add([9, 10, 11, 12])  # 12 tokens would pass 10: the first sequence goes
    assert cache.num_tokens == 8 and cache.num_sequences == 2
    assert cache.propose([0, 1, 2]) is None and cache.propose([0, 5, 6]).tokens[0] == 7
    assert not any(key == 0 for hits in cache._index.positions.values() for key, _ in hits)  # no stale entries
    cache.add(range(100, 130))  # longer than the bound: its last 10 tokens stay
    assert cache.num_tokens == 10 and cache.num_sequences == 1
    cache.clear()
    assert cache.num_tokens == 0 and cache.propose([120, 121]) is None


def test_threads_can_share_a_cache():
    cache = SuffixCache(max_match=3, min_match=2, max_tokens=2_000)
    errors = []

    def work(seed):
        try:
            for i in range(60):
                cache.add([seed, i % 7, (i + 1) % 7, (i + 2) % 7])
                cache.propose([seed, i % 7, (i + 1) % 7])
        except Exception as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(100, 104)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and cache.num_tokens <= 2_000 and cache.num_tokens == 4 * cache.num_sequences


@pytest.mark.parametrize("kwargs", [dict(min_match=0), dict(min_match=5, max_match=4), dict(max_drafts=0),
                                    dict(alpha=0), dict(min_share=0), dict(max_tokens=0), dict(live_weight=0)])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(ValueError):
        SuffixCache(**kwargs)


def test_a_new_session_finishes_the_earlier_ones():
    cache = SuffixCache(max_match=3, min_match=2)
    first = cache.session([1, 2, 3, 4, 5])
    assert cache.num_sequences == 0
    second = cache.session([9, 2, 3])
    assert cache.num_sequences == 1 and second.propose().tokens[:2] == (4, 5)
    first.finish()  # already finished: not added twice
    assert cache.num_sequences == 1
