"""Generate the man pages and shell completions from the click definitions.

    python -m pstate.docs.docgen            rewrite man/*.1, man/pstate-events.5, completions/*
    python -m pstate.docs.docgen --check    exit 1, naming the refresh command, if they are stale
    python -m pstate.docs.docgen --out DIR  write under DIR instead of the checkout

SYNOPSIS, OPTIONS, DESCRIPTION and EXAMPLES come from the click commands (their
params, help text and epilog); pstate-events(5) comes from schema.py; the prose
that click has no place for lives in manprose.py; measured figures come from
bench/results/latest.json (figures.py), which also fills the generated regions
of README.md and docs/performance.md. Output is byte-stable: a fixed date, a
fixed help width, nothing read from the machine.
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path

import click
from click.formatting import join_options
from click.shell_completion import get_completion_class

from pstate import __version__
from pstate.docs import commandprose, figures, flagtable, formatprose, manprose
from pstate.docs.commandtree import HELP_WIDTH, PROG, load_command, root_context
from pstate.stream import reports, schema
from pstate import exitcodes
from pstate.exitcodes import ExitCode, PstateError

# Release date of each version: the date in the pages' title lines, so
# regenerating never changes them. A new version needs its date here.
RELEASES = {"0.1.0": "2026-11-30"}
REFRESH_COMMAND = "make artifacts"
COMPLETIONS = {"bash": "completions/pstate.bash", "zsh": "completions/_pstate",
               "fish": "completions/pstate.fish"}
COMPLETE_VAR = "_PSTATE_COMPLETE"
GENERATED_DIRS = ("man", "completions")  # every file in them is generated
HEADER = ('.\\" Generated from the pstate click commands, schema.py and manprose.py\n'
          '.\\" by `python -m pstate.docs.docgen`. Do not edit: run `make artifacts`.\n')

# --- roff text -----------------------------------------------------------------

# Characters groff knows by name; any other non-ASCII character becomes \[uXXXX].
_GLYPHS = {"\u2265": "\\(>=", "\u2264": "\\(<=", "\u2192": "\\(->", "\u2190": "\\(<-",
           "\u00d7": "\\(mu", "\u00b5": "\\(mc", "\u2014": "\\(em", "\u2013": "\\(en",
           "\u2018": "\\(oq", "\u2019": "\\(cq", "\u201c": "\\(lq", "\u201d": "\\(rq",
           "\u2026": "\\&...", "\u00a0": "\\ ", "\u2212": "\\-"}


def esc(text: str) -> str:
    """Escape text for roff: backslashes, hyphens (as \\- so copied options
    work) and non-ASCII characters. Line starts are handled by safe_line."""
    out = []
    for ch in text.replace("\\", "\\e").replace("-", "\\-"):
        if ord(ch) < 128:
            out.append(ch)
        else:
            out.append(_GLYPHS.get(ch, f"\\[u{ord(ch):04X}]"))
    return "".join(out)


def safe_line(line: str) -> str:
    """A text line that roff cannot take for a request or macro call."""
    return "\\&" + line if line.startswith((".", "'")) else line


def bold(text: str) -> str:
    return f"\\fB{esc(text)}\\fR"


def italic(text: str) -> str:
    return f"\\fI{esc(text)}\\fR"


def inline(text: str) -> str:
    """Escape prose, rendering `code` spans in bold."""
    parts = re.split(r"`([^`]+)`", text)
    return "".join(bold(p) if i % 2 else esc(p) for i, p in enumerate(parts))


_ABBREV = re.compile(r"(?:\b(?:e\.g|i\.e|etc|vs|cf)\.)$")


def fill(text: str) -> list[str]:
    """A filled paragraph, one sentence per source line (the roff convention)."""
    words = " ".join(text.split())
    lines, start = [], 0
    for m in re.finditer(r"(?<=[.!?])\s+(?=[A-Z(`])", words):
        if _ABBREV.search(words[start:m.start()]):
            continue
        lines.append(words[start:m.start()])
        start = m.end()
    lines.append(words[start:])
    return [safe_line(inline(line)) for line in lines if line]


def verbatim(lines: list[str]) -> list[str]:
    """Lines shown as they are, in a constant-width, no-fill block."""
    body = [safe_line(esc(line.rstrip())) if line.strip() else "" for line in lines]
    body = [line if line else ".sp" for line in body]
    return [".RS 4", ".nf", *body, ".fi", ".RE"]


def _dedent(lines: list[str]) -> list[str]:
    indent = min((len(x) - len(x.lstrip()) for x in lines if x.strip()), default=0)
    return [x[indent:] for x in lines]


def blocks(text: str) -> list[str]:
    """Render help-style text: paragraphs split by blank lines; an indented
    paragraph, or one marked with click's \\b that has indented lines, is
    shown verbatim; a paragraph of "- " items becomes a bullet list."""
    out: list[str] = []
    for para in re.split(r"\n\s*\n", inspect.cleandoc(text).strip("\n")):
        lines = para.split("\n")
        if not para.strip():
            continue
        if lines[0].strip() == "\b":
            # click's "do not rewrap": keep it only for laid-out text (an
            # indented line); plain prose is better filled to the page.
            if any(x[:1] in (" ", "\t") for x in lines[1:]):
                out += [".PP", *verbatim(lines[1:])]
            else:
                out += [".PP", *fill(" ".join(lines[1:]))]
        elif all(x.startswith((" ", "\t")) for x in lines if x.strip()):
            out += [".PP", *verbatim(_dedent(lines))]
        elif lines[0].startswith("- "):
            items: list[str] = []
            for line in lines:
                if line.startswith("- "):
                    items.append(line[2:])
                else:
                    items[-1] += " " + line.strip()
            for item in items:
                out += [".IP \\(bu 2", *fill(item)]
        else:
            out += [".PP", *fill(para)]
    return out


def definitions(items, term=bold) -> list[str]:
    """A .TP list of (term, description) pairs; a bare string is a paragraph."""
    out: list[str] = []
    for item in items:
        if isinstance(item, str):
            out += blocks(item)
        else:
            name, desc = item
            out += [".TP", term(name) if callable(term) else name, *fill(desc)]
    return out


def section(title: str) -> str:
    return f'.SH "{title}"' if " " in title else f".SH {title}"


def man_ref(ref: str) -> str:
    """"pstate-stats(1)" -> a bold name and a roman section number."""
    m = re.fullmatch(r"([^()]+)\((\w+)\)", ref)
    if not m:
        raise ValueError(f"see-also reference must look like name(N): {ref!r}")
    return f"{bold(m.group(1))}({m.group(2)})"


def see_also(refs: list[str]) -> list[str]:
    refs = list(dict.fromkeys(refs))
    return [section("SEE ALSO"), ",\n".join(man_ref(r) for r in refs)]


def release_date() -> str:
    try:
        return RELEASES[__version__]
    except KeyError:
        raise PstateError(f"no release date for version {__version__}", ExitCode.SOFTWARE,
                          hint=f"add it to RELEASES in {__name__}") from None


def title_line(name: str, sec: int, manual: str) -> str:
    return f'.TH {esc(name.upper())} {sec} "{release_date()}" "pstate {esc(__version__)}" "{manual}"'


def name_summary(summary: str) -> str:
    """A one-line summary as the NAME section wants it: no final period,
    lower-case start unless the first word is an acronym."""
    summary = summary.strip().rstrip(".")
    if len(summary) > 1 and summary[0].isupper() and not summary[1].isupper():
        summary = summary[0].lower() + summary[1:]
    return summary


# --- reading click commands ----------------------------------------------------

def command_context(parent: click.Context, name: str, cmd: click.Command) -> click.Context:
    settings = {**cmd.context_settings, "terminal_width": HELP_WIDTH,
                "max_content_width": HELP_WIDTH}
    return click.Context(cmd, parent=parent, info_name=name, **settings)


def help_text(cmd: click.Command) -> str:
    return inspect.cleandoc(cmd.help or "").partition("\f")[0]


def _metavar(param: click.Parameter, ctx: click.Context) -> str:
    mv = param.make_metavar(ctx)
    if isinstance(param.type, click.Choice) and param.metavar is None:
        mv = "{" + mv.strip("[]") + "}"
    return mv


def _italic_words(text: str) -> str:
    """Italicise the names in a metavar like "[FILES]..." but not its
    brackets; a space inside a metavar does not break the line, a choice's
    "|" may."""
    parts = re.split(r"([\[\]{}|]|\.\.\.)", text)
    # a line may break after a choice's "|" (\: is an invisible break point)
    return "".join((esc(p) + ("\\:" if p == "|" else "")) if i % 2 else italic(p).replace(" ", "\\ ")
                   for i, p in enumerate(parts) if p)


def synopsis_item(param: click.Parameter, ctx: click.Context) -> str | None:
    if isinstance(param, click.Argument):
        return _italic_words(param.make_metavar(ctx))
    if not isinstance(param, click.Option) or param.hidden:
        return None
    opts = sorted(param.opts, key=lambda o: (len(o) > 2 and o.startswith("--"), o))
    text = bold(opts[0])
    if param.secondary_opts:
        text += "|" + bold(param.secondary_opts[0])
    if not param.is_flag and not param.count:
        text += "\\ " + _italic_words(_metavar(param, ctx))
    if not param.required:
        text = f"[{text}]"
    if param.multiple or param.count:
        text += "..."
    return text


def option_term(param: click.Option, ctx: click.Context) -> str:
    def opts_text(opts):
        names, _slash = join_options(opts)
        return ", ".join(bold(o) for o in names.split(", "))

    term = opts_text(param.opts)
    if param.secondary_opts:
        term += " / " + opts_text(param.secondary_opts)
    if not param.is_flag and not param.count:
        term += " " + _italic_words(_metavar(param, ctx))
    return term


def options_section(ctx: click.Context, arg_help: dict[str, str]) -> list[str]:
    out: list[str] = []
    params = sorted(ctx.command.get_params(ctx), key=lambda p: not isinstance(p, click.Argument))
    for param in params:  # operands first, then options in their order
        if isinstance(param, click.Argument):
            desc = getattr(param, "help", None) or arg_help.get(param.name or "")
            if desc:
                out += [".TP", _italic_words(param.make_metavar(ctx)), *fill(desc)]
        elif isinstance(param, click.Option):
            record = param.get_help_record(ctx)
            if record is None:  # hidden
                continue
            out += [".TP", option_term(param, ctx)]
            out += fill(record[1]) if record[1] else []
    return out


def _split_example(line: str) -> tuple[str, str]:
    """"cmd   what it does" or "cmd  # what it does" -> (cmd, description)."""
    m = re.match(r"(.*?\S)(?:\s+#\s*|\s{2,})(\S.*)$", line)
    return (m.group(1), m.group(2)) if m else (line, "")


def parse_examples(epilog: str) -> list[tuple[str, list]]:
    """An epilog ("\\b\\nExamples:\\n  cmd   description ...") as blocks:
    ("examples", [(command, description), ...]) or ("text", paragraph)."""
    out: list[tuple[str, list]] = []
    for para in re.split(r"\n\s*\n", epilog.strip("\n")):
        lines = [x for x in para.split("\n") if x.strip() != "\b"]
        if not lines:
            continue
        if re.fullmatch(r"\s*examples?:\s*", lines[0], re.IGNORECASE):
            lines = lines[1:]
        rows = [x for x in lines if x.strip()]
        if not rows or not rows[0].startswith((" ", "\t")):
            out.append(("text", [para]))
            continue
        base = min(len(x) - len(x.lstrip()) for x in rows)
        examples: list[list[str]] = []
        pending_comment = ""
        for raw in rows:
            indent, line = len(raw) - len(raw.lstrip()), raw.strip()
            if line.startswith("#"):
                pending_comment = (pending_comment + " " + line.lstrip("# ")).strip()
            elif indent > base and examples:
                cmd, desc = examples[-1]
                if cmd.endswith("\\"):  # a command continued on the next line
                    examples[-1][0] = cmd + "\n" + line
                else:
                    examples[-1][1] = (desc + " " + line).strip()
            else:
                cmd, desc = _split_example(line)
                examples.append([cmd, (pending_comment + " " + desc).strip()])
                pending_comment = ""
        out.append(("examples", [tuple(e) for e in examples]))
    return out


def command_text(cmd: str) -> str:
    """A command line in bold, never hyphenated inside a word."""
    return "\\fB" + " ".join("\\%" + esc(w) for w in cmd.split(" ")) + "\\fR"


def examples_section(epilog: str | None) -> list[str]:
    """Example commands in bold, each followed by what it does. Lines are not
    justified here: stretched spaces would make commands hard to copy."""
    out: list[str] = [".na"]
    for kind, content in parse_examples(epilog or ""):
        if kind == "text":
            out += blocks(content[0])
            continue
        for cmd, desc in content:
            lines = cmd.split("\n")
            if len(lines) == 1 and desc:
                out += [".TP", command_text(cmd), *fill(desc)]
                continue
            out += [".PP", "\n.br\n".join(command_text(x) for x in lines)]
            if desc:
                out += [".RS", *fill(desc), ".RE"]
    return out + [".ad"]


# --- exit status ---------------------------------------------------------------

def codes_in_source(module_name: str) -> set[ExitCode]:
    """Exit codes a command's own module and its engine's (the module of the
    one engine entry it imports) name (ExitCode.X)."""
    module = sys.modules.get(module_name)
    try:
        source = inspect.getsource(module) if module else ""
    except (OSError, TypeError):
        return set()
    for engine in re.findall(r"^from (pstate\.engines\.\w+) import ", source, re.M):
        try:
            source += inspect.getsource(importlib.import_module(engine))
        except (OSError, TypeError):
            pass
    return {ExitCode[m] for m in re.findall(r"ExitCode\.([A-Z_]+)", source)
            if m in ExitCode.__members__}


def exit_status_section(notes: dict, extra: set[ExitCode] = frozenset()) -> list[str]:
    codes = sorted({ExitCode.OK, ExitCode.USAGE, *notes, *extra})
    items = []
    for code in codes:
        text = notes.get(code) or exitcodes.MEANINGS[code]
        items.append((str(int(code)), text))
    return [section("EXIT STATUS"), *definitions(items)]


# --- pages ---------------------------------------------------------------------

def prose_sections(prose: dict) -> dict[str, list[str]]:
    """The manprose sections of a page, rendered, keyed by section title."""
    out = {}
    if prose.get("fields"):
        out["FIELDS"] = [section("FIELDS"), *definitions(prose["fields"])]
    if prose.get("overhead"):
        text = prose["overhead"].format(**overhead_figures())
        out["OVERHEAD"] = [section("OVERHEAD"), *blocks(text)]
    if prose.get("environment"):
        out["ENVIRONMENT"] = [section("ENVIRONMENT"), *definitions(prose["environment"])]
    if prose.get("files"):
        out["FILES"] = [section("FILES"), *definitions(prose["files"])]
    if prose.get("requirements"):
        out["REQUIREMENTS"] = [section("REQUIREMENTS"), *blocks(prose["requirements"])]
    if prose.get("security"):
        out["SECURITY"] = [section("SECURITY"), *blocks(prose["security"])]
    if prose.get("caveats"):
        out["CAVEATS"] = [section("CAVEATS"), *blocks(prose["caveats"])]
    return out


_FIGURES: dict[str, str] = {}


def overhead_figures() -> dict[str, str]:
    """The OVERHEAD sections' figures, from the bench results of the checkout."""
    if not _FIGURES:
        _FIGURES.update(figures.overhead_figures(figures.load(checkout_root())))
    return _FIGURES


def subcommand_page(parent: click.Context, name: str, summary: str) -> str:
    from pstate.main import COMMANDS

    cmd = load_command(parent, name)
    return command_page(parent, name, cmd, summary, f"pstate.commands.{COMMANDS[name][0]}")


def command_page(parent: click.Context, name: str, cmd: click.Command, summary: str,
                 module_name: str | None = None) -> str:
    """The man page of one subcommand, from its click definition and prose."""
    ctx = command_context(parent, name, cmd)
    prose = manprose.PAGES.get(name, {})
    page_name = f"{PROG}-{name}"

    params = sorted(cmd.get_params(ctx), key=lambda p: isinstance(p, click.Argument))
    synopsis = [item for p in params if (item := synopsis_item(p, ctx))]
    lines = [HEADER.rstrip("\n"), title_line(page_name, 1, "pstate manual"),
             section("NAME"), f"{esc(page_name)} \\- {esc(name_summary(summary))}",
             section("SYNOPSIS"), f".SY {esc(PROG)}\\ {esc(name)}", *synopsis, ".YS",
             section("DESCRIPTION"), *blocks(help_text(cmd))]
    if prose.get("description"):
        lines += blocks(prose["description"])
    if commandprose.NOTES.get(name):
        lines += blocks(commandprose.NOTES[name])
    lines += [section("OPTIONS"), *options_section(ctx, prose.get("arguments", {}))]
    extra = prose_sections(prose)
    lines += extra.get("FIELDS", []) + extra.get("OVERHEAD", []) + extra.get("SECURITY", [])
    if cmd.epilog:
        lines += [section("EXAMPLES"), *examples_section(cmd.epilog)]
    found = codes_in_source(module_name) if module_name else set()
    lines += exit_status_section(exitcodes.BY_COMMAND.get(name, {}), found)
    lines += extra.get("ENVIRONMENT", []) + extra.get("FILES", []) + extra.get("CAVEATS", [])
    lines += see_also([f"{PROG}(1)", *prose.get("see_also", []), "pstate-events(5)"])
    return "\n".join(lines) + "\n"


def overview_page(ctx: click.Context) -> str:
    from pstate.main import COMMANDS

    cli = ctx.command
    prose = manprose.PAGES.get(PROG, {})
    summary, _sep, description = help_text(cli).partition("\n\n")
    synopsis = [item for p in cli.get_params(ctx) if (item := synopsis_item(p, ctx))]
    synopsis += [italic("COMMAND"), f"[{italic('ARGS')}]..."]
    commands = [(f"{bold(name)}  ({bold(f'{PROG}-{name}')}(1))", text)
                for name, (_mod, text) in COMMANDS.items()]
    lines = [HEADER.rstrip("\n"), title_line(PROG, 1, "pstate manual"),
             section("NAME"), f"{esc(PROG)} \\- {esc(name_summary(summary))}",
             section("SYNOPSIS"), f".SY {esc(PROG)}", *synopsis, ".YS",
             section("DESCRIPTION"), *blocks(description)]
    if prose.get("description"):
        lines += blocks(prose["description"])
    lines += [section("COMMANDS"), *definitions(commands, term=None)]
    lines += [section("OPTIONS"), *options_section(ctx, {})]
    lines += flag_table_section()
    extra = prose_sections(prose)
    lines += extra.get("REQUIREMENTS", []) + extra.get("OVERHEAD", []) + extra.get("SECURITY", [])
    if cli.epilog:
        lines += [section("EXAMPLES"), *examples_section(cli.epilog)]
    lines += exit_status_section({}, set(ExitCode))
    lines += extra.get("ENVIRONMENT", []) + extra.get("FILES", []) + extra.get("CAVEATS", [])
    lines += see_also([f"{PROG}-{name}(1)" for name in COMMANDS] + ["pstate-events(5)",
                                                                  *prose.get("see_also", [])])
    return "\n".join(lines) + "\n"


def flag_table_section() -> list[str]:
    """OPTIONS OF EVERY COMMAND: each spelling once, with its value type and the
    commands that take it (one meaning each: tests/contract/test_flagtable.py)."""
    rows = flagtable.option_rows()
    items = [(bold(spellings), what) for spellings, what in flagtable.table_lines(rows)]
    renamed = sorted({f"{old} ({r.command}: now {r.spellings[-1]})" for r in rows for old in r.renamed_from})
    lines = [section("OPTIONS OF EVERY COMMAND"),
             *fill("Each option means the same in every command that takes it; a DURATION is "
                   "written 500ms, 5s or 1m, and a plain number is seconds.")]
    lines += definitions(items, term=None)
    if renamed:
        lines += fill("Old spellings still accepted in this release, with a warning: "
                      + ", ".join(renamed) + ".")
    return lines


def field_type(typ: str) -> str:
    if typ.endswith("?"):
        return f"{typ[:-1]}, may be null or absent"
    return typ


def schema_fields(fields: dict[str, tuple[str, str]]) -> list[str]:
    out = []
    for name, (typ, desc) in fields.items():
        out += [".TP", f"{bold(name)} ({italic(field_type(typ))})", *fill(desc)]
    return out


def events_page() -> str:
    prose = formatprose.EVENTS
    lines = [HEADER.rstrip("\n"), title_line("pstate-events", 5, "File Formats"),
             section("NAME"), f"pstate\\-events \\- {esc(prose['summary'])}",
             section("SYNOPSIS"), *verbatim(prose["synopsis"].strip("\n").split("\n")),
             section("DESCRIPTION"), *blocks(prose["description"]),
             section("READING"), *blocks(prose["reading"]),
             section("RECORDS"), *blocks(prose["records"]),
             ".PP", "Every record has these fields:", *schema_fields(schema.COMMON_FIELDS)]
    for rtype, (desc, fields) in schema.RECORDS.items():
        lines += [f'.SS "{rtype}"' if " " in rtype else f".SS {rtype}", *fill(desc + ".")]
        lines += schema_fields(fields)
    lines += [section("STATES"), *blocks(prose["states"])]
    for name, (letter, category, desc) in schema.STATES.items():
        lines += [".TP", f"{bold(name)} ({esc(letter)}, {italic(category)})", *fill(desc)]
    lines += [".PP", *fill("The categories group states in summaries:")]
    categories = sorted({cat for _l, cat, _d in schema.STATES.values()},
                        key=list(formatprose.STATE_CATEGORIES).index)
    lines += definitions([(c, formatprose.STATE_CATEGORIES[c]) for c in categories], term=italic)
    older = {letter: name for letter, name in schema.LETTER_NAMES.items() if name not in schema.STATES}
    if older:
        names = ", ".join(f"`{letter}` {name}" for letter, name in sorted(older.items()))
        lines += [".PP", *fill(prose["older_letters"].format(letters=names))]
    lines += [section("CAUSES"), *blocks(prose["causes"])]
    lines += definitions(list(schema.CAUSES.items()))
    lines += [section("SNAPSHOTS"), *blocks(prose["snapshots"]),
              ".SS \"Snapshot meta record\"", *definitions(prose["snapshot_meta"]),
              ".SS \"Task rows\"", ".PP", "One per thread:", *definitions(snapshot_task_fields()),
              ".SS \"Hist rows\"", *blocks(prose["snapshot_hist"]), *definitions(snapshot_hist_fields()),
              ".SS \"Fold rows\"", *blocks(prose["snapshot_fold"]), *definitions(snapshot_fold_fields()),
              ".SS \"End record\"", *definitions(prose["snapshot_end"])]
    lines += [section("REPORTS"), *blocks(prose["reports"])]
    for name, (desc, fields) in reports.REPORTS.items():
        lines += [f".SS {name}", *fill(desc + ".")]
        lines += report_fields(fields)
    lines += [section("EXAMPLES"), *blocks(prose["examples"])]
    lines += see_also([f"{PROG}(1)", *prose["see_also"]])
    return "\n".join(lines) + "\n"


def report_fields(fields: dict[str, tuple[str, str]]) -> list[str]:
    """A report's fields by path; a path standing for several keys has no type."""
    out = []
    for path, (typ, desc) in fields.items():
        term = f"{bold(path)} ({italic(field_type(typ))})" if typ else bold(path)
        out += [".TP", term, *fill(desc)]
    return out


def snapshot_hist_fields() -> list[tuple[str, str]]:
    """The fields of a hist row (snapshots/histograms.py), with their types."""
    from pstate.snapshots import histograms

    return [(name, f"({typ}) {desc}") for name, (typ, desc) in histograms.HIST_RECORD[1].items()]


def snapshot_fold_fields() -> list[tuple[str, str]]:
    """The fields of a fold row (snapshots/folds.py), with their types."""
    from pstate.snapshots import folds

    return [(name, f"({typ}) {desc}") for name, (typ, desc) in folds.FOLD_RECORD[1].items()]


def snapshot_task_fields() -> list[tuple[str, str]]:
    """The task row fields in snapdir's order, described in manprose; the
    per-state time fields share one entry."""
    from pstate.snapshots import snapdir

    state_fields = {f"{s}_ns" for s in snapdir.STATE_FIELDS}
    described = formatprose.EVENTS["snapshot_task"]
    items = []
    for field in snapdir.ROW_FIELDS:
        name = "<state>_ns" if field in state_fields else field
        if name in (n for n, _d in items):
            continue
        if name not in described:
            raise PstateError(f"snapshot field {name!r} has no description", ExitCode.SOFTWARE,
                              hint="add it to EVENTS['snapshot_task'] in formatprose.py")
        fields = ", ".join(f"{s}_ns" for s in snapdir.STATE_FIELDS)
        items.append((name, described[name].format(fields=fields)))
    return items


def completion_script(shell: str) -> str:
    from pstate.main import cli

    return get_completion_class(shell)(cli, {}, PROG, COMPLETE_VAR).source()


def render_all() -> dict[str, str]:
    """Every generated file: path relative to the checkout -> text."""
    from pstate.main import COMMANDS

    ctx = root_context()
    files = {f"man/{PROG}.1": overview_page(ctx)}
    for name, (_mod, summary) in COMMANDS.items():
        files[f"man/{PROG}-{name}.1"] = subcommand_page(ctx, name, summary)
    files["man/pstate-events.5"] = events_page()
    for shell, path in COMPLETIONS.items():
        files[path] = completion_script(shell)
    return files


def stale_files(root: Path, files: dict[str, str]) -> list[str]:
    """Paths under root that differ from files, are missing, or are left
    over from something no longer generated."""
    stale = [p for p, text in files.items()
             if not (root / p).is_file() or (root / p).read_bytes() != text.encode()]
    for d in GENERATED_DIRS:
        if (root / d).is_dir():
            stale += [f"{d}/{f.name}" for f in sorted((root / d).iterdir())
                      if f.is_file() and not f.name.startswith(".") and f"{d}/{f.name}" not in files]
    return sorted(stale)


def write_all(root: Path, files: dict[str, str]) -> list[str]:
    """Write the files that changed; returns their paths."""
    changed = []
    for path, text in files.items():
        target = root / path
        if target.is_file() and target.read_bytes() == text.encode():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(text.encode())
        changed.append(path)
    return changed


def checkout_root() -> Path:
    root = Path(__file__).resolve().parents[3]
    if not (root / "pyproject.toml").is_file():
        raise PstateError("not running from a pstate checkout", ExitCode.USAGE,
                          hint="pass --out DIR")
    return root


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--check", is_flag=True,
              help="Write nothing; exit 1 if a generated file is stale or missing.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write under this directory instead of the checkout.")
def main(check: bool, out: Path | None) -> None:
    """Regenerate man pages and shell completions from the click commands."""
    root = out or checkout_root()
    files = render_all()
    # README.md and docs/performance.md are edited in the checkout: their
    # generated regions are filled from the checkout's text and checked there.
    documents = figures.render_documents(checkout_root())
    if check:
        stale = stale_files(root, files) + [p for p in stale_files(checkout_root(), documents) if p in documents]
        if stale:
            click.echo(f"man pages/completions are stale: run `{REFRESH_COMMAND}` "
                       f"(python -m pstate.docs.docgen)\n  " + "\n  ".join(stale), err=True)
            sys.exit(1)
        return
    for path in write_all(root, {**files, **documents}):
        click.echo(f"wrote {path}", err=True)
    leftovers = [p for p in stale_files(root, files) if p not in files]
    for path in leftovers:
        click.echo(f"not generated any more, remove it: {path}", err=True)


if __name__ == "__main__":
    main(prog_name="python -m pstate.docs.docgen")
