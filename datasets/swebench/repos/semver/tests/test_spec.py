import pytest

from semver import Requirement, max_satisfying, satisfies


def test_exact():
    assert satisfies("1.2.3", "=1.2.3")
    assert satisfies("1.2.3", "1.2.3")
    assert not satisfies("1.2.4", "1.2.3")


def test_range():
    req = ">=1.2.0 <2.0.0"
    assert satisfies("1.2.0", req)
    assert satisfies("1.99.0", req)
    assert not satisfies("2.0.0", req)
    assert not satisfies("1.1.9", req)


def test_caret():
    assert satisfies("1.9.9", "^1.2.3")
    assert not satisfies("2.0.0", "^1.2.3")
    assert satisfies("0.2.9", "^0.2.3")
    assert not satisfies("0.3.0", "^0.2.3")
    assert satisfies("0.0.3", "^0.0.3")
    assert not satisfies("0.0.4", "^0.0.3")


def test_tilde():
    assert satisfies("1.4.9", "~1.4.2")
    assert not satisfies("1.5.0", "~1.4.2")
    assert satisfies("1.9.0", "~1")


def test_prereleases_need_opt_in():
    assert not satisfies("2.0.0-alpha", ">=1.0.0")
    assert satisfies("2.0.0-beta", ">=2.0.0-alpha")
    assert not satisfies("2.1.0-beta", ">=2.0.0-alpha")


def test_invalid_requirement():
    with pytest.raises(ValueError):
        Requirement("")
    with pytest.raises(ValueError):
        Requirement(">>1.0")


def test_max_satisfying():
    assert max_satisfying(["1.2.0", "1.9.3", "2.0.0"], "~1.9") == "1.9.3"
    assert max_satisfying(["1.2.0", "1.9.3"], ">=3") is None
