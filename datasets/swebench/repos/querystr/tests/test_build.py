from querystr import build, parse, quote


def test_quote():
    assert quote("a b&c") == "a+b%26c"
    assert quote("é") == "%C3%A9"
    assert quote("a/b", safe="/") == "a/b"
    assert quote("a b", space_as_plus=False) == "a%20b"


def test_build_mapping_and_lists():
    assert build({"q": "x y", "tag": ["a", "b"], "n": 3}) == "q=x+y&tag=a&tag=b&n=3"


def test_build_pairs_and_none():
    assert build([("a", None), ("b", True), ("c", False)]) == "b=true&c=false"
    assert build({"a": None}, skip_none=False) == "a="


def test_round_trip_plain_text():
    params = {"name": "Ada Lovelace", "city": "São Paulo", "note": "a&b=c"}
    assert parse(build(params)) == {k: [v] for k, v in params.items()}
