import pytest

from semver import InvalidVersion, Version


def v(text):
    return Version.parse(text)


def test_parse_parts():
    version = v("1.2.3-beta.1+build.5")
    assert (version.major, version.minor, version.patch) == (1, 2, 3)
    assert version.prerelease == ("beta", "1")
    assert version.build == ("build", "5")
    assert str(version) == "1.2.3-beta.1+build.5"


def test_parse_leading_v_and_blanks():
    assert v(" v2.0.1 ") == v("2.0.1")


def test_invalid():
    for text in ["1.2", "01.2.3", "1.2.3-", "1.2.3-01", "a.b.c", ""]:
        with pytest.raises(InvalidVersion):
            v(text)


def test_core_ordering():
    assert v("1.0.0") < v("2.0.0") < v("2.1.0") < v("2.1.1")
    assert v("1.10.0") > v("1.9.0")


def test_prerelease_below_release():
    assert v("1.0.0-alpha") < v("1.0.0")
    assert v("1.0.0-rc.1") < v("1.0.0")
    assert v("1.0.0") > v("1.0.0-rc.1")


def test_prerelease_ordering_from_spec():
    chain = ["1.0.0-alpha", "1.0.0-alpha.1", "1.0.0-alpha.beta", "1.0.0-beta",
             "1.0.0-beta.2", "1.0.0-rc.1", "1.0.0"]
    versions = [v(text) for text in chain]
    assert versions == sorted(versions)
    assert sorted(reversed(versions)) == versions


def test_build_metadata_ignored_in_ordering():
    assert v("1.0.0+a") == v("1.0.0+b")
    assert hash(v("1.0.0+a")) == hash(v("1.0.0"))


def test_bumps():
    assert str(v("1.2.3").bump_major()) == "2.0.0"
    assert str(v("1.2.3").bump_minor()) == "1.3.0"
    assert str(v("1.2.3").bump_patch()) == "1.2.4"
    assert str(v("1.2.3-rc.1").bump_patch()) == "1.2.3"


def test_is_prerelease():
    assert v("0.1.0-dev").is_prerelease
    assert not v("0.1.0").is_prerelease
