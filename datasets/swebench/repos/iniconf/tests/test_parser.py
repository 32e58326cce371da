import pytest

from iniconf import ConfigError, load, parse

SAMPLE = """\
# global settings
name = demo

[server]
host = 0.0.0.0
Port: 8080
debug = off

; the database
[database]
url = postgres://db/app
pool = 5
"""


def test_sections_and_values():
    cfg = parse(SAMPLE)
    assert cfg.sections() == ["server", "database"]
    assert cfg.get("server", "host") == "0.0.0.0"
    assert cfg.get("database", "url") == "postgres://db/app"


def test_keys_are_case_insensitive():
    cfg = parse(SAMPLE)
    assert cfg.get("server", "port") == "8080"
    assert cfg.get("server", "PORT") == "8080"


def test_default_section_is_inherited():
    cfg = parse(SAMPLE)
    assert cfg.get("server", "name") == "demo"
    assert "name" in cfg.options("database")


def test_inline_comments_after_whitespace():
    cfg = parse("[a]\nx = 1  # one\ny = two ; second\nz = 3\t# tab\n")
    assert cfg.get("a", "x") == "1"
    assert cfg.get("a", "y") == "two"
    assert cfg.get("a", "z") == "3"


def test_continuation_lines():
    cfg = parse("[a]\nhosts = alpha\n  beta\n  gamma\nnext = 1\n")
    assert cfg.get("a", "hosts") == "alpha\nbeta\ngamma"
    assert cfg.getlist("a", "hosts") == ["alpha", "beta", "gamma"]
    assert cfg.get("a", "next") == "1"


def test_empty_value():
    cfg = parse("[a]\nempty =\n")
    assert cfg.get("a", "empty") == ""


def test_bad_line_reports_position():
    with pytest.raises(ConfigError, match="cfg.ini:3"):
        parse("[a]\nx = 1\nnot an option\n", source="cfg.ini")


def test_load_from_file(tmp_path):
    path = tmp_path / "app.ini"
    path.write_text(SAMPLE, encoding="utf-8")
    assert load(path).getint("database", "pool") == 5


def test_later_values_win():
    cfg = parse("[a]\nx = 1\n[a]\nx = 2\n")
    assert cfg.get("a", "x") == "2"
