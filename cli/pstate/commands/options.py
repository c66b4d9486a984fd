"""Option bundles shared by several subcommands (one definition each)."""

from __future__ import annotations

import functools
import os

import click

from pstate.kernel import eventlayout
from pstate.stream import schema
from pstate.stream.durations import Duration
from pstate.stream.filters import Filter

STATE_NAMES = [n for n in schema.STATES if n != schema.UNKNOWN]


class Choice(click.Choice):
    """click.Choice whose completions keep each choice's own spelling (click
    offers case-insensitive choices in lower case: "d" for "D")."""

    def shell_complete(self, ctx, param, incomplete):
        from click.shell_completion import CompletionItem

        low = incomplete.lower()
        return [CompletionItem(c) for c in map(str, self.choices)
                if (c.lower().startswith(low) if not self.case_sensitive else c.startswith(incomplete))]


class ByKey(Choice):
    """--by: one of the choices, or 'title:REGEX' (the role is REGEX's first
    group where it matches a title: analysis.services.parse_by)."""

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.startswith("title:"):
            import re

            try:
                re.compile(value[len("title:"):])
            except re.error as e:
                self.fail(f"{value[len('title:'):]!r} is not a regular expression: {e}", param, ctx)
            return value
        return super().convert(value, param, ctx)

    def get_metavar(self, param, ctx=None):
        return "[" + "|".join(map(str, self.choices)) + "|title:REGEX]"


# kernel letter -> state name, for --state D and the like
STATE_LETTERS = schema.STATE_LETTERS


class StateName(Choice):
    """A state name or kernel letter; completes from both. Kernel states a
    newer kernel adds (state_<letter>) are accepted too."""

    def __init__(self):
        super().__init__(STATE_NAMES, case_sensitive=False)

    def shell_complete(self, ctx, param, incomplete):
        from click.shell_completion import CompletionItem

        letters = [CompletionItem(letter, help=name) for letter, name in STATE_LETTERS.items()
                   if letter.startswith(incomplete)]  # S and s are not the same letter
        return super().shell_complete(ctx, param, incomplete) + letters

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.startswith("state_"):
            return value
        if isinstance(value, str) and value in STATE_LETTERS:  # accept kernel letters: S, D, T, ...
            return STATE_LETTERS[value]
        return super().convert(value, param, ctx)


def _apply(fn, decorators):
    for d in reversed(decorators):
        fn = d(fn)
    return fn


def _task_filters() -> list:
    return [
        click.option("-p", "--pid", "pids", type=int, multiple=True, metavar="PID",
                     help="Only this process (tgid) and its threads. Repeatable."),
        click.option("-t", "--tid", "tids", type=int, multiple=True, metavar="TID",
                     help="Only this thread. Repeatable."),
        click.option("-c", "--comm", "comms", multiple=True, metavar="COMM",
                     help="Only tasks with this exact name (comm, 15 bytes). Repeatable."),
        click.option("--include-idle", is_flag=True,
                     help="Also include the per-CPU idle tasks (tid 0), excluded by default."),
    ]


def filter_options(fn, *, titles: bool = False):
    """-p/-t/-c/--state/--min-dur/--cpu/--cgroup/--include-idle (titles:
    and --title, for commands that read a stream), giving a `filt` Filter."""
    task = _task_filters()
    decorators = task[:3] + [
        click.option("--state", "states", type=StateName(), multiple=True, metavar="STATE",
                     help="Only transitions into or out of this state (name or kernel letter, "
                          "e.g. D, stopped, preempted). Repeatable."),
        click.option("--min-dur", type=Duration("s"), default=0, metavar="DURATION",
                     help="Only transitions whose left state lasted at least this long, e.g. 5ms."),
        click.option("--cpu", "cpus", type=click.IntRange(0, eventlayout.DEFINES["FILTER_CPUS"] - 1), multiple=True,
                     metavar="CPU",
                     help="Only events on this CPU. Repeatable."),
        click.option("--cgroup", "cgroups", multiple=True, metavar="PATH",
                     help="Only processes in this cgroup (v2 path, e.g. /system.slice/nginx.service) "
                          "or below it. Repeatable."),
    ]
    if titles:
        decorators.append(click.option(
            "--title", "titles", multiple=True, metavar="PATTERN",
            help="Only processes whose title (as ps shows it, from the process records) matches "
                 "this shell pattern, e.g. 'postgres: *writer*'. Repeatable."))
    decorators += task[3:]

    @functools.wraps(fn)  # keeps the options declared below this bundle
    def wrapper(**kw):
        kw["filt"] = Filter(
            pids=tuple(kw.pop("pids")), tids=tuple(kw.pop("tids")), comms=tuple(kw.pop("comms")),
            states=tuple(dict.fromkeys(kw.pop("states"))), cpus=tuple(kw.pop("cpus")),
            min_dur_ns=kw.pop("min_dur"), include_idle=kw.pop("include_idle"),
            cgroups=tuple(kw.pop("cgroups")), titles=tuple(kw.pop("titles", ())),
        )
        return fn(**kw)

    return _apply(wrapper, decorators)


def read_filter_options(fn):
    """filter_options with --title: the bundle of commands that read a stream."""
    return filter_options(fn, titles=True)


def probes_option(fn):
    """--probes for the commands that load BPF programs (record, snap)."""
    return click.option(
        "--probes", type=click.Choice(["auto", "tp_btf", "tracepoint"]), default=None, envvar="PSTATE_PROBES",
        help="How the programs attach to sched_switch and the wake-ups: tp_btf (BTF-typed raw tracepoints, "
             "the cheaper way; needs the kernel's BTF, Linux 5.5+), tracepoint (classic tracepoints), or "
             "auto: tp_btf when this kernel has and accepts it, else tracepoint (`pstate doctor` says which "
             "this machine gets). Example: --probes tracepoint.  [default: auto; env: PSTATE_PROBES]")(fn)


def output_options(fn):
    """-o/--output and --unbuffered for commands that write a stream."""
    return _apply(fn, [
        click.option("-o", "--output", type=click.Path(allow_dash=True), default=None,
                     metavar="FILE", help="Write to FILE instead of standard output."),
        click.option("-u", "--unbuffered", is_flag=True,
                     help="Flush every batch of lines at once (the default on a terminal)."),
    ])


def input_options(fn):
    """FILES... (or stdin) and --strict for commands that read streams."""
    return _apply(fn, [
        click.argument("files", nargs=-1, type=click.Path(allow_dash=True)),
        click.option("--strict", is_flag=True,
                     help="Exit non-zero (65) on any malformed, truncated or skipped input line."),
    ])


class Command(click.Command):
    """A command whose options with an optional value (is_flag=False and a
    flag_value: stats --stacks, heat --latency) never take the argument
    after them as their value when it is an input: "-" or an existing file
    or directory (`stats --stacks rec.jsonl` reads rec.jsonl with --stacks
    alone). Write --opt=VALUE to give a value that names a file."""

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, free_inputs(args, self.params))


def free_inputs(args: list[str], params) -> list[str]:
    """args with `--opt NEXT` of an optional-value option written
    `--opt=FLAG_VALUE` when NEXT is an input rather than its value (see
    Command)."""
    optional = {name: p for p in params if isinstance(p, click.Option) and p._flag_needs_value
                for name in p.opts if name.startswith("--")}
    if not optional:
        return args
    out = []
    i = 0
    while i < len(args):
        arg = args[i]
        out.append(arg)
        i += 1
        if arg == "--":
            out.extend(args[i:])
            break
        p = optional.get(arg)
        if p is None or i >= len(args) or args[i][:1] == "-" and args[i] != "-":
            continue
        if args[i] == "-" or os.path.exists(args[i]):
            out[-1] = f"{arg}={p.flag_value}"
    return out


class RenamedCommand(Command):
    """A command whose options had other spellings: each old spelling still
    works for one release, rewritten to the new one with a warning on stderr.
    `renamed` maps old -> new (e.g. {"-n": "--top"}); the docs list it."""

    def __init__(self, *args, renamed: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.renamed = dict(renamed or {})

    def parse_args(self, ctx, args):
        return super().parse_args(ctx, rename_args(args, self.renamed, ctx.command_path))


def rename_args(args: list[str], renamed: dict[str, str], prog: str) -> list[str]:
    """args with every old spelling of `renamed` replaced by its new one
    (`-n5`, `--old=V` and `--old V` alike), warning once per spelling."""
    out, warned = [], set()
    for i, arg in enumerate(args):
        if arg == "--":
            out.extend(args[i:])
            break
        old = _old_spelling(arg, renamed)
        if old is None:
            out.append(arg)
            continue
        new = renamed[old]
        if old not in warned:
            warned.add(old)
            click.echo(f"{prog}: {old} is deprecated and goes in the next release: use {new}", err=True)
        rest = arg[len(old):]
        if not rest:
            out.append(new)
        else:
            out.extend([new, rest[1:] if rest.startswith("=") else rest])
    return out


def _old_spelling(arg: str, renamed: dict[str, str]) -> str | None:
    for old in renamed:
        if arg == old or (old.startswith("--") and arg.startswith(old + "=")) or \
                (not old.startswith("--") and len(old) == 2 and arg.startswith(old) and not arg.startswith("--")):
            return old
    return None


def size_bytes(text: str) -> int:
    """'256M' -> bytes (k/M/G suffixes: --buffer-size, --flight-memory).
    ValueError or IndexError otherwise."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().rstrip("b")
    mult = units.get(t[-1:])
    return int(float(t[:-1]) * mult if mult else float(t))


class Size(click.ParamType):
    """A size of at least 1M (k/M/G suffixes): --flight-memory."""

    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            n = size_bytes(value)
        except (ValueError, IndexError):
            n = 0
        if n < 1 << 20:
            self.fail(f"{value!r} is not a size of at least 1M (e.g. 256M, 2G)", param, ctx)
        return n


def flight_options(fn):
    """record's --flight options, as one argument `flight` (None without --flight)."""
    opts = [
        click.option("--flight", "flight_window", type=Duration(), metavar="DURATION",
                     help="Flight recorder: keep the last DURATION of events in memory and write them to a "
                          "new file in -o DIR when a --trigger fires or on SIGUSR1; nothing is written before."),
        click.option("--flight-memory", type=Size(), default="256M", show_default=True, metavar="SIZE",
                     help="Memory the --flight ring may use; the window shrinks to what fits (the trigger "
                          "record says which window it covers)."),
        click.option("--trigger", "triggers", multiple=True, metavar="COND",
                     help="With --flight: write a file when COND holds: STATE>=DURATION (a task left STATE "
                          "after at least DURATION, e.g. D>=100ms), runq>=DURATION (a run-queue wait), "
                          "comm=NAME:STATE (NAME entered STATE). WHO=VALUE: before a condition limits it to "
                          "some tasks' events: comm=NAME, pid=PID[,PID..], cgroup=PATH (with the cgroups below "
                          "it), title=REGEX (a process title, as ps shows it), e.g. pid=42:D>=100ms. "
                          "Repeatable."),
        click.option("--after", "after_ns", type=Duration(), default="1s", show_default=True, metavar="DURATION",
                     help="With --flight: keep recording this long past a trigger before writing the file."),
        click.option("--max-dumps", type=click.IntRange(1), default=10, show_default=True, metavar="N",
                     help="With --flight: write at most N files in a run."),
        click.option("--hold-off", "hold_off_ns", type=Duration(), default="10s", show_default=True,
                     metavar="DURATION", help="With --flight: ignore triggers this long after a file was written."),
    ]

    @functools.wraps(fn)  # keeps the options declared below this bundle
    def wrapper(**kw):
        window = kw.pop("flight_window")
        given = {k: kw.pop(k) for k in ("flight_memory", "triggers", "after_ns", "max_dumps", "hold_off_ns")}
        if window is None:
            if given["triggers"]:
                raise click.UsageError("--trigger needs --flight DURATION")
            kw["flight"] = None
        else:
            kw["flight"] = dict(window_ns=window, memory=given["flight_memory"], triggers=given["triggers"],
                                after_ns=given["after_ns"], max_dumps=given["max_dumps"],
                                hold_off_ns=given["hold_off_ns"])
        return fn(**kw)

    for opt in reversed(opts):
        wrapper = opt(wrapper)
    return wrapper
