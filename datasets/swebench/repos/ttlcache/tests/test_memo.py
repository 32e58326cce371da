from ttlcache import TTLCache, make_key, memoize


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_results_are_cached():
    calls = []

    @memoize(TTLCache(maxsize=10))
    def square(x):
        calls.append(x)
        return x * x

    assert square(4) == 16
    assert square(4) == 16
    assert calls == [4]


def test_expired_results_are_recomputed():
    clock = FakeClock()
    cache = TTLCache(maxsize=10, ttl=30, clock=clock)
    calls = []

    @memoize(cache)
    def load(name):
        calls.append(name)
        return name.upper()

    load("x")
    clock.now = 29
    load("x")
    clock.now = 31
    load("x")
    assert calls == ["x", "x"]
    assert len(cache) == 1


def test_custom_key():
    @memoize(TTLCache(), key=lambda user, request_id: user)
    def profile(user, request_id):
        return (user, request_id)

    assert profile("ada", 1) == ("ada", 1)
    assert profile("ada", 2) == ("ada", 1)


def test_wrapper_attributes():
    cache = TTLCache()

    @memoize(cache)
    def double(x):
        """Double x."""
        return 2 * x

    assert double.cache is cache
    assert double.uncached(3) == 6
    assert double.__doc__ == "Double x."
    assert len(cache) == 0


def test_default_cache_used_without_arguments():
    @memoize()
    def triple_unique_arg(x):
        return 3 * x

    assert triple_unique_arg(1111) == 3333
    assert triple_unique_arg.cache.get((1111,)) == 3333


def test_make_key_ignores_keyword_order():
    assert make_key((1,), {"a": 1, "b": 2}) == make_key((1,), {"b": 2, "a": 1})
    assert make_key((1, 2), {}) == (1, 2)
