"""`cli.main` imports only the command module that runs: `harness --help` lists every command
from its table, and a command's own options come from its module alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cli.main import COMMANDS, build_parser

ROOT = Path(__file__).resolve().parent.parent


def _cli_modules_after(code: str) -> list[str]:
    """The `cli.*` modules a fresh interpreter has imported after running `code`."""
    script = (f"import sys\n{code}\n"
              "print('\\n' + ' '.join(sorted(m for m in sys.modules if m.startswith('cli.'))))")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()[-1].split()  # the help comes first


def test_the_top_level_help_imports_no_command_module():
    loaded = _cli_modules_after(
        "from cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass")
    assert loaded == ["cli.errors", "cli.main", "cli.paths"]  # cli.paths: the stdlib only


def test_a_command_imports_only_its_own_module():
    loaded = _cli_modules_after(
        "from cli.main import main\n"
        "try:\n    main(['model', '--help'])\nexcept SystemExit:\n    pass")
    assert set(loaded) == {"cli.errors", "cli.main", "cli.paths", "cli.model"}


def test_the_help_lists_every_command_with_its_line(capsys):
    try:
        build_parser([]).parse_args(["--help"])
    except SystemExit:
        pass
    out = " ".join(capsys.readouterr().out.split())
    for name, command in COMMANDS.items():
        assert f"{name} {' '.join(command.help.split())}" in out


def test_every_command_module_registers_its_options():
    parser = build_parser()  # every module imported: each one's register(parser) works
    args = parser.parse_args(["serve", "--policy", "vllm"])
    assert args.command == "serve" and args.policy == "vllm" and callable(args.func)
    args = parser.parse_args(["model", "list"])
    assert callable(args.func)
