"""Validation of the shipped default profile against its measured points."""

from __future__ import annotations

from pipesim.cli import main


def cli_ok(args, capsys):
    main(args)  # no SystemExit on success
    return capsys.readouterr().out


def test_validate_default_profile_within_10_percent(capsys):
    cli_ok(["validate", "--max-error", "10"], capsys)  # exit 0: every reference point within 10%
