"""The ``gaptrace`` command line (click): the group, and what its commands share.

Commands are imported lazily (``LAZY_COMMANDS``); those that need torch (``decode``, ``capture``) print one line
naming the runtime extra when it is missing, so ``analyze``/``report``/``diff`` run on a machine without torch.
Every command turns bad input into one line on stderr and exit code 2 (:func:`fail`); the shared options and
checks live here too (``--memory-limit-gb``, the capture sidecar's warning line, the ``--rounds`` check). The
escape helpers are :mod:`gaptrace.text` (re-exported here).
"""
from __future__ import annotations

import errno
import importlib
import importlib.util
import os
import sys

import click

# the escape helpers live in gaptrace.text; re-exported for the commands that import them from here
from gaptrace.text import escape_controls, escape_json_controls, escape_line, escape_strings, shorten  # noqa: F401

# name -> "module:attribute" of a click command, imported only when the command runs (or --help lists it)
LAZY_COMMANDS = {
    "analyze": "gaptrace.analyze:analyze",
    "annotate": "gaptrace.annotate:annotate",
    "diff": "gaptrace.diff:diff",
    "decode": "gaptrace.runtime.cli:decode",
    "capture": "gaptrace.runtime.cli:capture",
    "report": "gaptrace.report.cli:report",
    "whatif": "gaptrace.whatif:whatif",
    "calibrate": "gaptrace.calibrate:calibrate",
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


# the commands that run the runtime, and the modules of the runtime extra they need (pip install 'gaptrace[runtime]')
RUNTIME_COMMANDS = ("decode", "capture")
RUNTIME_EXTRA_MODULES = ("torch", "safetensors", "tokenizers", "nvtx")


def _not_installed(module: str) -> bool:
    """True when ``module`` cannot be imported here (no spec found), without importing it."""
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):  # a parent package missing, or a module whose __spec__ is None
        return True


def runtime_extra_message(command: str, missing: str) -> str:
    """The one error line for ``gaptrace COMMAND`` run without a module of the runtime extra."""
    return f"`gaptrace {command}` needs {missing}: pip install 'gaptrace[runtime]'"


def _unavailable(name: str, missing: str) -> click.Command:
    """A stand-in for command ``name`` that cannot run here: whatever its arguments, one error line naming the
    extra to install, exit code 2."""
    @click.command(name=name, help=f"(unavailable: {missing} is not installed)",
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    def unavailable() -> None:
        fail(runtime_extra_message(name, missing))

    return unavailable


def exit_on_sigterm() -> None:
    """Turn SIGTERM into ``SystemExit(143)`` in the main thread, so a terminated command unwinds like an interrupted
    one: the temporary files of an atomic write (a trace export, a report) are removed by their ``finally`` blocks
    instead of left beside the output. No-op off the main thread (signal handlers live there)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


class LazyGroup(click.Group):
    """A click group whose subcommands live in other modules and are imported on first use.

    A runtime command (``RUNTIME_COMMANDS``) on a machine without torch is replaced by a stand-in that prints one
    line naming the extra to install and exits 2; a module of the runtime extra found missing while such a
    command runs (its imports sit inside the command) gives the same line, not a traceback."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        cmd = super().get_command(ctx, name)
        if cmd is not None or name not in LAZY_COMMANDS:
            return cmd
        if name in RUNTIME_COMMANDS and _not_installed("torch"):
            return _unavailable(name, "torch")
        module, attr = LAZY_COMMANDS[name].split(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as e:  # a module the command's own module imports is missing
            return _unavailable(name, e.name or str(e))

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as e:
            missing = (e.name or "").split(".")[0]
            if ctx.invoked_subcommand in RUNTIME_COMMANDS and missing in RUNTIME_EXTRA_MODULES:
                fail(runtime_extra_message(ctx.invoked_subcommand, missing))
            raise

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        """click's entry point, with usage errors (a bad option value, an unknown option or command, a missing
        argument) as one ``gaptrace: error:`` line and exit 2, like every other bad input."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        # numpy's floating-point RuntimeWarnings (overflow of a 1e308 duration, ...) would print beside the one
        # result or error line; the analyses turn non-finite values into None / gaps themselves
        import numpy as np
        np.seterr(all="ignore")
        exit_on_sigterm()
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


def given_on_command_line(param: str) -> bool:
    """Whether the running click command's ``param`` was set by the user (not left at its default)."""
    ctx = click.get_current_context(silent=True)
    return ctx is not None and ctx.get_parameter_source(param) != click.core.ParameterSource.DEFAULT


def rounds_not_found(res: dict, trace_path: str, round_name: str) -> str | None:
    """The error line when ``--rounds NAME`` was given on the command line and the trace has fewer than two
    annotations named NAME (or NAME_<n>): the round model it asked for is absent (the default name may be absent:
    most traces are not from the runtime). None when there is nothing to say."""
    if given_on_command_line("round_name") and res.get("devices") and not res.get("rounds"):
        return (f"{trace_path}: fewer than two annotations named {round_name!r} (or {round_name}_<n>) on the analysed "
                "device's rank: no verify rounds to model (--rounds)")
    return None


def sidecar_or_warn(trace_path: str, trace=None, window: str | None = None, notes: list | None = None,
                    label: str = "", echo: bool = True):
    """The capture sidecar next to ``trace_path`` (:func:`gaptrace.sidecar.read_sidecar_checked`) as a
    :class:`gaptrace.sidecar.Sidecar`, or None; one ``gaptrace: warning:`` line on stderr when one is there but
    cannot be used (not JSON, nested too deeply, not an object, a bad analysis_window, or, given the loaded
    ``trace``, what :func:`gaptrace.sidecar.check_sidecar` refuses), or when some of its fields will be skipped:
    the analysis goes on without it (or them). The same line, without the ``gaptrace: warning:`` prefix, is
    appended to ``notes`` when given (the ``warnings`` of ``--json`` output, so a CI that reads only the JSON
    learns it too). ``label`` ("A: ", "B: ") starts the line (diff's two traces). ``echo=False``: the line only goes
    to ``notes``, for the caller to print with :func:`warn` once the command has not failed (an error is then the
    only line on stderr)."""
    from gaptrace.sidecar import as_sidecar, check_sidecar, read_sidecar_checked, sidecar_path
    from gaptrace.trace import clean_text

    side, why = read_sidecar_checked(trace_path)
    fields = None
    if side is not None and trace is not None:
        side, why, fields = check_sidecar(side, trace, window, sidecar_path(os.fspath(trace_path).rstrip("/")))
    line = f"capture sidecar ignored: {why}" if why is not None else fields
    if line is not None:
        line = label + line
        if echo or notes is None:
            click.echo(f"gaptrace: warning: {escape_line(line)}", err=True)
        if notes is not None:
            notes.append(clean_text(line))
    return as_sidecar(side)


def nonempty(ctx, param, value):
    """click callback: an option given as an empty string (``--calibration ''``, ``--rounds ''``) is refused, not
    taken as "not given" (the default would be used without a word)."""
    if value is not None and not str(value).strip():
        raise click.BadParameter(f"{value!r}: an empty value names nothing", ctx=ctx, param=param)
    return value


def warn(lines) -> None:
    """Each of ``lines`` as one ``gaptrace: warning:`` line on stderr (controls escaped)."""
    for line in lines:
        click.echo(f"gaptrace: warning: {escape_line(line)}", err=True)


FAIL_LINE_MAX = 2000  # an error line longer than this is cut in its middle


def fail(message: str) -> "NoReturn":  # noqa: F821
    """Print one line naming the problem (its controls and line breaks escaped: it may quote the trace or a path;
    over 2,000 characters, its middle cut: a name of thousands quoted in it) and exit with code 2 (the convention
    for bad input)."""
    click.echo(f"gaptrace: error: {shorten(escape_line(message), FAIL_LINE_MAX, FAIL_LINE_MAX // 2 - 10)}", err=True)
    sys.exit(2)


if __name__ == "__main__":
    main()
