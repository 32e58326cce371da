import pytest

from globmatch import GlobError, match, translate


def test_star_stays_in_segment():
    assert match("src/*.py", "src/a.py")
    assert not match("src/*.py", "src/pkg/a.py")


def test_basename_patterns():
    assert match("*.py", "pkg/sub/mod.py")
    assert not match("*.py", "pkg/sub/mod.pyc")


def test_question_mark():
    assert match("file?.txt", "file1.txt")
    assert not match("file?.txt", "file10.txt")


def test_character_classes():
    assert match("log[0-9].txt", "log7.txt")
    assert not match("log[!0-9].txt", "log7.txt")
    assert match("log[!0-9].txt", "logx.txt")
    assert match("[]]", "]")


def test_double_star_between_dirs():
    assert match("src/**/test_*.py", "src/pkg/test_a.py")
    assert match("src/**/test_*.py", "src/pkg/sub/test_b.py")
    assert not match("src/**/test_*.py", "lib/pkg/test_a.py")


def test_double_star_at_end():
    assert match("build/**", "build/x/y.o")
    assert not match("build/**", "builder/y.o")


def test_double_star_does_not_glue_segments():
    assert not match("src/**/a.py", "src/ba.py")
    assert not match("docs/**/index.md", "docs/myindex.md")


def test_double_star_must_be_segment():
    with pytest.raises(GlobError):
        translate("src/a**b")


def test_unclosed_class_and_empty():
    with pytest.raises(GlobError):
        translate("[abc")
    with pytest.raises(GlobError):
        translate("")


def test_specials_escaped():
    assert match("a+b(1).txt", "a+b(1).txt")
    assert not match("a.b", "axb")


def test_path_normalization_and_case():
    assert match("docs/*.md", "./docs/intro.md")
    assert match("docs/*.md", "docs\\intro.md")
    assert match("*.MD", "README.md", case_sensitive=False)
    assert not match("*.MD", "README.md")
