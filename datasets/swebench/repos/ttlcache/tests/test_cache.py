import pytest

from ttlcache import TTLCache


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_set_get():
    cache = TTLCache()
    cache.set("a", 1)
    assert cache.get("a") == 1
    assert cache.get("missing") is None
    assert cache.get("missing", 0) == 0


def test_lru_eviction_respects_reads():
    cache = TTLCache(maxsize=2)
    cache.set("a", 1)
    cache.set("b", 2)
    assert cache.get("a") == 1
    cache.set("c", 3)
    assert "a" in cache and "c" in cache
    assert "b" not in cache
    assert cache.stats.evictions == 1


def test_overwrite_refreshes_order():
    cache = TTLCache(maxsize=2)
    cache.set("a", 1)
    cache.set("b", 2)
    cache.set("a", 10)
    cache.set("c", 3)
    assert cache.keys() == ["a", "c"]
    assert cache.get("a") == 10


def test_ttl_expiry():
    clock = FakeClock()
    cache = TTLCache(ttl=5, clock=clock)
    cache.set("a", 1)
    clock.now += 4.9
    assert cache.get("a") == 1
    clock.now += 0.1
    assert cache.get("a") is None
    assert cache.stats.expirations == 1


def test_per_entry_ttl_and_no_ttl():
    clock = FakeClock()
    cache = TTLCache(ttl=5, clock=clock)
    cache.set("short", 1, ttl=1)
    cache.set("forever", 2, ttl=None)
    clock.now += 100
    assert "short" not in cache
    assert cache.get("forever") == 2
    assert len(cache) == 1


def test_purge():
    clock = FakeClock()
    cache = TTLCache(ttl=1, clock=clock)
    for key in "abc":
        cache.set(key, key)
    clock.now += 2
    cache.set("d", "d")
    assert cache.purge() == 3
    assert cache.keys() == ["d"]


def test_delete_and_clear():
    cache = TTLCache()
    cache.set("a", 1)
    assert cache.delete("a")
    assert not cache.delete("a")
    cache.set("b", 2)
    cache.clear()
    assert len(cache) == 0


def test_stats():
    cache = TTLCache()
    cache.set("a", 1)
    cache.get("a")
    cache.get("b")
    assert (cache.stats.hits, cache.stats.misses) == (1, 1)


def test_invalid_maxsize():
    with pytest.raises(ValueError):
        TTLCache(maxsize=0)
