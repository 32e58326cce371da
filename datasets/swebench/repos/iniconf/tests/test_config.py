import pytest

from iniconf import ConfigError, MissingOption, parse


@pytest.fixture
def cfg():
    return parse(
        "[types]\ncount = 12\nmask = 0x1f\nratio = 0.25\nflag = Yes\noff = off\n"
        "tags = red, green ,blue\nbad = twelve\n"
    )


def test_getint(cfg):
    assert cfg.getint("types", "count") == 12
    assert cfg.getint("types", "mask") == 31


def test_getfloat(cfg):
    assert cfg.getfloat("types", "ratio") == 0.25


def test_getbool(cfg):
    assert cfg.getbool("types", "flag") is True
    assert cfg.getbool("types", "off") is False


def test_getlist(cfg):
    assert cfg.getlist("types", "tags") == ["red", "green", "blue"]


def test_wrong_type(cfg):
    with pytest.raises(ConfigError, match="types.bad"):
        cfg.getint("types", "bad")
    with pytest.raises(ConfigError):
        cfg.getbool("types", "bad")


def test_missing_and_fallback(cfg):
    with pytest.raises(MissingOption):
        cfg.get("types", "nope")
    with pytest.raises(MissingOption):
        cfg.get("nosection", "count")
    assert cfg.get("types", "nope", fallback="x") == "x"
    assert cfg.getint("types", "nope", fallback=None) is None


def test_set_and_items(cfg):
    cfg.set("new", "Key", "value")
    assert dict(cfg.items("new")) == {"key": "value"}
