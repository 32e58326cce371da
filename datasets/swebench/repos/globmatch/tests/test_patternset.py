from globmatch import PatternSet, filter_paths


def test_excludes_and_last_match_wins():
    rules = ["*.md", "!CHANGES.md"]
    assert filter_paths(rules, ["README.md", "CHANGES.md", "setup.py"]) == ["README.md"]


def test_reinclude():
    selector = PatternSet(["build/**", "!build/keep/*", "build/keep/important.txt"])
    assert selector.matches("build/a.o")
    assert not selector.matches("build/keep/b.txt")
    assert selector.matches("build/keep/important.txt")


def test_comments_and_blanks_ignored():
    selector = PatternSet(["# comment", "", "  *.txt  "])
    assert selector.rules == [(True, "*.txt")]
    assert selector.matches("notes.txt")
