"""The click command tree the generators read (docgen's pages and
completions, flagtable's table): the root context at a fixed width and
each subcommand by name."""

from __future__ import annotations

import click

from pstate.exitcodes import ExitCode, PstateError

PROG = "pstate"
HELP_WIDTH = 80  # never the terminal's: output must not depend on where it runs


def root_context() -> click.Context:
    from pstate.main import cli

    settings = {**cli.context_settings, "terminal_width": HELP_WIDTH,
                "max_content_width": HELP_WIDTH}
    return click.Context(cli, info_name=PROG, **settings)


def load_command(ctx: click.Context, name: str) -> click.Command:
    """The click command behind a subcommand name; a module that does not
    import is an error, never skipped."""
    try:
        cmd = ctx.command.get_command(ctx, name)
    except Exception as e:  # any import-time failure of a command module
        raise PstateError(f"cannot import the {name!r} command (pstate.commands.{name}): "
                          f"{type(e).__name__}: {e}", ExitCode.SOFTWARE,
                          hint="fix the module, then run `make artifacts` again") from e
    if cmd is None:
        raise PstateError(f"no command {name!r} in pstate.main.COMMANDS", ExitCode.SOFTWARE)
    return cmd
