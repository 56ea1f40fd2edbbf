"""The ``gaptrace`` command line (click).

Commands that need torch (``decode``, ``capture``) are imported lazily, so ``analyze``/``report``/``diff`` run on a
machine without torch. Every command turns bad input into one line on stderr and exit code 2.
"""
from __future__ import annotations

import errno
import importlib
import json
import os
import re
import sys

import click

# name -> "module:attribute" of a click command, imported only when the command runs (or --help lists it)
LAZY_COMMANDS = {
    "analyze": "gaptrace.analyze:analyze",
    "diff": "gaptrace.diff:diff",
    "decode": "gaptrace.runtime.cli:decode",
    "capture": "gaptrace.runtime.cli:capture",
    "report": "gaptrace.report.cli:report",
}


STDOUT_WRITE_ERRNOS = (errno.ENOSPC, errno.EIO, errno.EFBIG, errno.EDQUOT)


def _drop_stdout() -> None:
    """Point stdout's file descriptor at /dev/null, so that the interpreter's last flush of what could not be
    written does not fail again with a second message."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError):
        pass


class LazyGroup(click.Group):
    """A click group whose subcommands live in other modules and are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        cmd = super().get_command(ctx, name)
        if cmd is not None or name not in LAZY_COMMANDS:
            return cmd
        module, attr = LAZY_COMMANDS[name].split(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as e:  # e.g. torch missing for `decode`
            missing = e.name or str(e)

            @click.command(name=name, help=f"(unavailable: {missing} is not installed)")
            def unavailable() -> None:
                raise click.UsageError(f"`gaptrace {name}` needs {missing}: pip install 'gaptrace[runtime]'")

            return unavailable

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """click's entry point, with usage errors (a bad option value, an unknown option or command, a missing
        argument) as one ``gaptrace: error:`` line and exit 2, like every other bad input."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        # numpy's floating-point RuntimeWarnings (overflow of a 1e308 duration, ...) would print beside the one
        # result or error line; the analyses turn non-finite values into None / gaps themselves
        import numpy as np
        np.seterr(all="ignore")
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except getattr(click.exceptions, "NoArgsIsHelpError", ()) as e:  # bare `gaptrace` (click >= 8.2): the help
            e.show()
            sys.exit(e.exit_code)
        except click.UsageError as e:
            fail(" ".join(e.format_message().split()))
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        except BrokenPipeError:  # `gaptrace analyze T | head`: the reader left; nothing to say to it
            _drop_stdout()
            sys.exit(1)
        except OSError as e:  # stdout on a full disk or device (the commands' own files handle their errors)
            if e.errno not in STDOUT_WRITE_ERRNOS:
                raise
            _drop_stdout()
            fail(f"cannot write the output ({e.strerror or e})")
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gaptrace")
def main() -> None:
    """gaptrace: why was the GPU idle? Occupancy, idle-gap attribution, blocking syncs and graph-launch fit
    from a torch.profiler (Kineto) trace."""


def memory_limit_option(f):
    """``--memory-limit-gb GB``: the memory a trace load may use (``memory_limit_bytes`` in the callback's
    ``memory_limit_gb``; see :func:`memory_limit_bytes`)."""
    def finite(ctx, param, value):  # FloatRange lets nan and inf through (every comparison with nan is false)
        if value is not None and not (0 < value <= 1e6):
            raise click.BadParameter(f"{value} is not a memory size in GB (a number > 0 and <= 1e6)")
        return value

    return click.option("--memory-limit-gb", type=float, default=None, callback=finite,
                        metavar="GB", help="Refuse, before reading it, a trace whose load needs more memory than "
                                           "this (default: the memory available now).")(f)


def memory_limit_bytes(gb: float | None) -> int | None:
    """``--memory-limit-gb`` in bytes (GB = 10**9 bytes, as the refusal message prints), None for the default."""
    return None if gb is None else int(gb * 1e9)


# every character but printable ASCII, tab and newline: the candidates :func:`escape_controls` looks at one by one
_NOT_PLAIN = re.compile(r"[^\t\n\x20-\x7e]")
_NOT_ASCII_PRINTABLE = re.compile(r"[^\x20-\x7e]")  # the candidates escape_line looks at


def escape_controls(text: str) -> str:
    """``text`` safe to print on a terminal: every character ``repr`` would escape (``not str.isprintable()``: the
    C0 controls such as ESC and BEL, DEL, the C1 controls such as the 8-bit CSI, bidi overrides, line separators)
    is replaced by its ``repr`` escape (``\\x1b``, ``\\x07``, ``\\u202e``), except tab and newline. Printable
    text (µ, →, CJK) is unchanged. Names in a trace are untrusted: raw, an ESC in a kernel name could drive the
    terminal that prints the analysis."""
    return _repr_escape(_NOT_PLAIN, text)


def _repr_escape(candidates: re.Pattern, text: str) -> str:
    """Each match of ``candidates`` in ``text`` that is not printable replaced by its ``repr`` escape."""
    return candidates.sub(lambda m: m.group() if m.group().isprintable() else repr(m.group())[1:-1], text)


def escape_line(text: str) -> str:
    """:func:`escape_controls` that also escapes tab, newline and carriage return: ``text`` stays on one line. For
    strings from a trace inside a line of output (a newline in a frame name could forge a row or a second error
    line)."""
    return _repr_escape(_NOT_ASCII_PRINTABLE, text)


def escape_strings(obj):
    """``obj`` (dicts, lists and tuples of JSON-like values, as ``run_analysis`` returns them) with every string,
    keys included, passed through :func:`escape_line`; other values unchanged. Text renderers apply it first, so
    no name from the trace can break a row or a line."""
    if isinstance(obj, str):
        return escape_line(obj)
    if isinstance(obj, dict):
        return {escape_strings(k): escape_strings(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(escape_strings(v) for v in obj)
    return obj


def escape_json_controls(text: str) -> str:
    """JSON text (from ``json.dumps(..., ensure_ascii=False)``, which escapes only the C0 controls) with the other
    non-printable characters of :func:`escape_controls` written as JSON ``\\uXXXX`` escapes (surrogate pairs
    beyond the BMP): the text decodes to the same values and prints safely on a terminal."""
    return _NOT_PLAIN.sub(lambda m: m.group() if m.group().isprintable() else json.dumps(m.group())[1:-1], text)


def fail(message: str) -> "NoReturn":  # noqa: F821
    """Print one line naming the problem (its controls and line breaks escaped: it may quote the trace or a path)
    and exit with code 2 (the convention for bad input)."""
    click.echo(f"gaptrace: error: {escape_line(message)}", err=True)
    sys.exit(2)


if __name__ == "__main__":
    main()
