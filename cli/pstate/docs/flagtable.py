"""The table of every option of every command, from the click commands.

One row per option and command: its spellings, its meaning (the parameter
it sets) and its value type. tests/contract/test_flagtable.py holds the toolkit to
one meaning and one value type per spelling; pstate(1) prints the table.
"""

from __future__ import annotations

from dataclasses import dataclass

import click

# parameters that the same spelling sets under different internal names but
# with one meaning for the user (the snapshot directory is "out_dir" in code)
_SAME_MEANING = {"out_dir": "dir"}


@dataclass(frozen=True)
class OptionRow:
    command: str
    spellings: tuple[str, ...]
    meaning: str  # the parameter the option sets
    value: str  # DURATION, INTEGER, NUMBER, CHOICE, PATH, TEXT, STATE, TIME or FLAG
    help: str
    renamed_from: tuple[str, ...] = ()  # old spellings still accepted for one release


def value_type(param: click.Option) -> str:
    """A parameter's value type as the user writes it."""
    if param.is_flag and not param.type.name == "choice" or param.count:
        return "FLAG"
    typ = param.type
    name = getattr(typ, "name", "")
    if name in ("integer", "integer range"):
        return "INTEGER"
    if name in ("float", "float range"):
        return "NUMBER"
    if name == "choice":
        return "STATE" if type(typ).__name__ == "StateName" else "CHOICE"
    if name in ("path", "file", "directory"):
        return "PATH"
    return name.upper() if name not in ("text",) else "TEXT"


def command_rows(name: str, cmd: click.Command) -> list[OptionRow]:
    renamed = getattr(cmd, "renamed", {})
    rows = []
    for param in cmd.params:
        if not isinstance(param, click.Option) or param.hidden:
            continue
        spellings = tuple(param.opts + param.secondary_opts)
        old = tuple(o for o, new in renamed.items() if new in spellings)
        rows.append(OptionRow(name, spellings, _SAME_MEANING.get(param.name, param.name),
                              value_type(param), param.help or "", old))
    return rows


def option_rows() -> list[OptionRow]:
    """Every visible option of every pstate command, in command order."""
    from pstate.docs.commandtree import load_command, root_context
    from pstate.main import COMMANDS

    ctx = root_context()
    rows = []
    for name in COMMANDS:
        rows += command_rows(name, load_command(ctx, name))
    return rows


def by_spelling(rows: list[OptionRow]) -> dict[str, list[OptionRow]]:
    """spelling -> the rows that use it."""
    out: dict[str, list[OptionRow]] = {}
    for row in rows:
        for s in row.spellings:
            out.setdefault(s, []).append(row)
    return out


def conflicts(rows: list[OptionRow]) -> list[str]:
    """Spellings with more than one meaning or value type across commands
    (old spellings kept for one release are rewritten before parsing and are
    not spellings of the command any more)."""
    out = []
    spelled = by_spelling(rows)
    for spelling, used in sorted(spelled.items()):
        kinds = {(r.meaning, r.value) for r in used}
        if len(kinds) > 1:
            where = ", ".join(f"{r.command}: {r.meaning} ({r.value})" for r in used)
            out.append(f"{spelling} means different things: {where}")
    return out


def table_lines(rows: list[OptionRow]) -> list[tuple[str, str]]:
    """(spelling, "value; commands") pairs for pstate(1), one per meaning."""
    merged: dict[tuple, list[str]] = {}
    for row in rows:
        merged.setdefault((row.spellings, row.value), []).append(row.command)
    items = []
    for (spellings, value), commands in sorted(merged.items(), key=lambda kv: kv[0][0][-1].lstrip("-")):
        what = "" if value == "FLAG" else f"{value}; "
        items.append((", ".join(spellings), f"{what}{', '.join(commands)}"))
    return items
