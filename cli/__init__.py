"""The command line: every `harness ...` subcommand's arguments and `main`, on top of everything.

Why a room of its own: the library modules below take arguments, not `argv`, so they can be
called from Python and tested without a shell; parsing, checking user input and turning a
user's mistake into a message and an exit status happen here and nowhere else.
"""
