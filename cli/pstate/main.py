"""The pstate command group. Subcommands are imported only when they run, so
stats, heat and replay never import bcc and work without root."""

from __future__ import annotations

import importlib
import sys

import click

from pstate import __version__, lifecycle
from pstate.exitcodes import ExitCode

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 80}

# name -> (module under pstate.commands, one-line summary shown by `pstate -h`)
COMMANDS = {
    "record": ("record", "Stream every scheduler state transition as JSON lines (BPF, root)."),
    "snap": ("snap", "Write point-in-time snapshots of per-task state times (BPF, root)."),
    "replay": ("replay", "Re-emit a recording as a stream, at its pace or faster."),
    "stats": ("stats", "Summarise a stream, a recording or snapshots: time per state, latencies."),
    "heat": ("heat", "Draw terminal heat maps of states and latencies, or a live dashboard."),
    "export": ("export", "Export a recording as a trace for Perfetto's UI or chrome://tracing."),
    "doctor": ("doctor", "Check that this machine can run pstate record and snap; say how to fix it."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"pstate.commands.{COMMANDS[name][0]}")
        return module.cli

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # A closed output pipe (`pstate ... | head`) is a normal end, not
            # an error; click would otherwise turn it into exit status 1.
            from pstate.stream.streamio import silence_stdout

            silence_stdout()
            ctx.exit(ExitCode.OK)

    def shell_complete(self, ctx, incomplete):
        # Complete subcommand names from the table: importing every command
        # (and bcc) on each TAB would be slow.
        from click.shell_completion import CompletionItem

        if incomplete.startswith("-"):
            return super().shell_complete(ctx, incomplete)
        return [CompletionItem(name, help=summary) for name, (_m, summary) in COMMANDS.items()
                if name.startswith(incomplete)]

    def format_commands(self, ctx, formatter):
        # Summaries come from the table above so `pstate -h` imports nothing.
        rows = [(name, summary) for name, (_mod, summary) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


EPILOG = """\b
Examples:
  sudo pstate record -d 10 -o rec.jsonl   10 s of transitions to a file
  sudo pstate record | pstate stats       summarise live, Ctrl-C to end
  sudo pstate record -p 1234 --state D    one process, only D sleeps
  pstate stats rec.jsonl --by tid --hist  per-thread times and histograms
  pstate replay rec.jsonl --speed 10 | pstate heat --live
  pstate export rec.jsonl -o rec.pftrace  open it in ui.perfetto.dev
  sudo pstate snap --dir /var/lib/pstate  one snapshot, e.g. from cron
  pstate doctor                           check bcc, headers, tracefs

Every command has its own --help and man page (man pstate-record).
"""


@click.group(cls=LazyGroup, context_settings=CONTEXT_SETTINGS, epilog=EPILOG)
@click.version_option(__version__, "-V", "--version", prog_name="pstate")
def cli():
    """Observe process and thread scheduler states with BPF, as JSON lines.

    record streams transitions (running, runnable, preempted, sleeping S,
    uninterruptible D, stopped T, zombie, exit, fork, exec, ...) with the time
    spent in the state left; stats, heat and replay read such streams from a
    pipe or a file; snap writes periodic snapshots for offline analysis.
    """



def main() -> None:
    """Run the command line and exit with its status. A signal no command
    took (pstate.lifecycle) ends it with that signal's status."""
    lifecycle.install()  # (entry.run did already, before the imports)
    code = _run()
    lifecycle.block()
    left = lifecycle.exit_code()
    sys.exit(code if code or left is None else left)


def _run() -> int:
    try:
        try:
            rv = cli.main(prog_name="pstate", standalone_mode=False)
        except click.exceptions.Abort:
            click.echo("pstate: interrupted", err=True)
            return int(ExitCode.SIGINT)
        except click.ClickException as e:
            e.show()
            return e.exit_code
        except KeyboardInterrupt:
            return int(ExitCode.SIGINT)
        except lifecycle.Terminated as e:
            return lifecycle.code_of(e.signum)
        except SystemExit as e:
            rv = e.code
        sys.stdout.flush()
    except BrokenPipeError:
        # A closed output pipe (`pstate ... | head`) is a normal end, not an error.
        from pstate.stream.streamio import silence_stdout

        silence_stdout()
        return int(ExitCode.OK)
    return rv if isinstance(rv, int) else int(ExitCode.OK)


if __name__ == "__main__":
    main()
