"""The README's reference parts agree with the code: settings, system checks, the command.

Each reads a part of README.md a user copies or looks things up in, and compares it with
what the code defines, so that a setting, check or option added, renamed or given another
default fails here until the README says so too.
"""

from __future__ import annotations

import argparse
import re

from locks.conf import DEFAULTS
from locks.management.commands.locks import Command
from tests.conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
CHECKS = (ROOT / "locks" / "checks.py").read_text(encoding="utf-8")


def fenced_block(after: str, language: str) -> str:
    """The first ```language block of the README after the line ``after``."""
    start = README.index(f"\n{after}\n")
    match = re.compile(rf"^```{language}\n(.*?)^```$", re.M | re.S).search(README, start)
    assert match is not None, f"no {language} block after {after!r}"
    return match.group(1)


def test_the_settings_block_lists_every_setting_with_its_default() -> None:
    namespace: dict[str, object] = {}
    exec(fenced_block("### Settings", "python"), namespace)
    assert namespace["LOCKS"] == DEFAULTS


def test_the_system_checks_table_lists_every_check() -> None:
    section = README[README.index("\n## System checks\n") :]
    section = section[: section.index("\n## ", 1)]
    documented = set(re.findall(r"^\| `(locks\.[EW]\d{3})` \|", section, re.M))
    defined = set(re.findall(r'id="(locks\.[EW]\d{3})"', CHECKS))
    assert documented == defined


def test_the_command_synopsis_names_every_option() -> None:
    synopsis = fenced_block("**Command line.**", "")
    documented = {
        line.split()[2]: set(re.findall(r"--[a-z-]+", line))
        for line in synopsis.splitlines()
        if line.startswith("manage.py locks ")
    }
    parser = Command().create_parser("manage.py", "locks")
    (subcommands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    defined = {
        name: {
            option
            for action in sub._actions
            for option in action.option_strings
            # Hidden: Django's own options, which every command takes (--settings, ...).
            if option.startswith("--") and option != "--help" and action.help != argparse.SUPPRESS
        }
        for name, sub in subcommands.choices.items()
    }
    assert documented == defined
