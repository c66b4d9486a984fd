"""pstate doctor: can this machine run record and snap? If not, how to fix it."""

from __future__ import annotations

import sys

import click

from pstate.engines.doctor import doctor

EPILOG = """\b
Examples:
  sudo pstate doctor              check everything, including a live test
  sudo pstate doctor --no-live    skip compiling and running BPF
  sudo pstate doctor --kernel-headers /usr/src/linux-headers-6.1.0-57-amd64

\b
Privileges: pstate record and snap need root, or the capabilities CAP_BPF
and CAP_PERFMON plus read access to tracefs (and CAP_SYS_ADMIN to mount
it). Never make pstate or python setuid. stats, heat and replay need no
privilege.
"""

@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--kernel-headers", type=click.Path(file_okay=False), envvar="PSTATE_KERNEL_HEADERS",
              metavar="DIR", help="Kernel header tree to check instead of the one found automatically.")
@click.option("--live/--no-live", default=True, show_default=True,
              help="Compile and attach the BPF program and record a test workload.")
@click.option("--live-timeout", type=click.FloatRange(min=1), default=60, show_default=True, metavar="SECONDS",
              help="How long the live test's record may take (a first compile on an emulated machine takes "
                   "minutes).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True,
              help="Output format.")
def cli(kernel_headers, live, live_timeout, fmt):
    """Check that this machine can run pstate record and snap.

    Checks privileges, the bcc module, tracefs (mounting it when missing),
    the sched tracepoints, state decoding from the kernel's own format, how
    record and snap attach each tracepoint (tp_btf, raw or classic) and where record's
    events are buffered, the kernel header tree BCC will use, the snap
    collector, and, live, that the BPF program compiles, attaches and
    reports correctly decoded events, and whether any thread switches with
    no switch-out traced (the kernel's own counts in /proc against two seconds
    of recording of the threads that switch): such a thread reads as running
    all the time. Prints a table of ok / PROBLEM / fix; exits non-zero when
    something is missing.
    """
    sys.exit(doctor(kernel_headers, live, live_timeout, fmt))
