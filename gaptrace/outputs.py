"""Where gaptrace may write: one check shared by every command that writes a file (report, capture).

Outputs are written to a temporary file in the target's directory and renamed over the target, so a crash never
leaves half a file. A rename replaces whatever sits at the path, so the target must be a regular file or absent:
a symlink is followed (the file it points to is replaced, the link stays), and a directory, a device, a FIFO or a
socket is refused, as is an output that is one of the command's own inputs, and a directory the process cannot
write to (checked up front, before any long-running work). Overwriting an existing file keeps its permission bits.
"""
from __future__ import annotations

import errno
import os
import stat
import tempfile

from gaptrace.text import shorten

__all__ = ["resolve_output", "write_text_atomic", "make_readable", "set_output_mode", "discard", "can_create_in"]


def resolve_output(path: str, inputs: tuple[str, ...] = ()) -> str:
    """The real path to write ``path`` to; ValueError (one line naming the path) when it cannot be written safely.

    Follows symlinks; refuses an empty path, a missing or unwritable directory, a non-regular or read-only existing
    target (no write permission bit: a rename would replace it regardless), any of
    ``inputs`` or of the files inside an input that is a directory (paths that do not exist are skipped; a symlink or
    hard link to an input counts as the input), and a symlink another user owns in a world-writable sticky
    directory.
    """
    if not path or path.endswith(os.sep):
        raise ValueError(f"{shorten(path)!r}: the output path is empty or ends in a separator; give a file name")
    said = shorten(path)
    real = os.path.realpath(path)
    d = os.path.dirname(real)
    if not os.path.isdir(d):
        try:
            os.stat(d)
            why = "is not a directory"
        except OSError as e:  # a symlink loop in a directory part, a name too long, a file where a directory is
            why = {errno.ENOENT: "does not exist", errno.ELOOP: "has a symlink loop in its path",
                   errno.ENAMETOOLONG: "has a name too long", errno.ENOTDIR: "is under a file, not a directory"
                   }.get(e.errno, f"cannot be used ({e.strerror or e})")
        raise ValueError(f"{said}: the output directory {shorten(d)} {why}")
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as e:  # a symlink loop, a name too long: no file can be written there
        raise ValueError(f"{said}: cannot be an output ({e.strerror or e})") from None
    if st is None:
        # a /proc/<pid>/fd link to a pipe or socket resolves to no path ("pipe:[N]") but stats as what it points to
        try:
            st = os.stat(path)
        except OSError:
            st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a device, FIFO or socket)"
        raise ValueError(f"{said}: the output path is {kind}; give a file name")
    if st is not None and not st.st_mode & 0o222:
        # a rename would replace it all the same: its mode says it is not to be written
        raise ValueError(f"{said}: the output file is read-only (mode {stat.S_IMODE(st.st_mode):04o}); remove it or "
                         "make it writable first")
    # no write bit on the directory: refused as for a non-root user (root passes os.access and could create there)
    if not os.stat(d).st_mode & 0o222 or not os.access(d, os.W_OK | os.X_OK) or not can_create_in(d):
        raise ValueError(f"{said}: the output directory {shorten(d)} is not writable")
    for p in _input_files(inputs):
        if os.path.realpath(p) == real or (st is not None and _same_file(p, st)):
            raise ValueError(f"{said}: the output would overwrite the input {shorten(p)}")
    if os.path.islink(path):
        _refuse_planted_link(path)
    return real


def named_inputs(*paths) -> tuple[str, ...]:
    """The files a command was named as inputs (an option's path, or None / "" when not given), as strings: what no
    output of it may replace (:func:`resolve_output`'s ``inputs``)."""
    return tuple(os.fspath(p) for p in paths if isinstance(p, (str, os.PathLike)) and os.fspath(p))


def can_create_in(d: str) -> bool:
    """Whether a file can be created and removed in directory ``d`` (a temporary one, removed at once): ``os.access``
    says yes to root for directories no file can be made in (/proc, /sys), and an append-only directory takes a new
    file but never the rename or removal of one."""
    try:
        fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-")
    except OSError:
        return False
    os.close(fd)
    try:
        os.unlink(tmp)
    except OSError:  # created but not removable (an append-only directory): no output can be put in place there
        return False
    return True


def _input_files(inputs: tuple[str, ...]) -> list[str]:
    """Every path a command reads for ``inputs``: each existing input, and for a directory every entry in it
    (a trace directory's per-rank files, a model directory's files): an output may be none of them."""
    out: list[str] = []
    for p in inputs:
        if not p or not os.path.lexists(p):
            continue
        out.append(p)
        if os.path.isdir(p):
            try:
                out += [os.path.join(p, n) for n in os.listdir(p)]
            except OSError:
                pass
    return out


def _same_file(p: str, st: os.stat_result) -> bool:
    """Whether ``p`` is the file ``st`` describes (a hard link to it counts)."""
    try:
        q = os.stat(p)
    except OSError:
        return False
    return (q.st_dev, q.st_ino) == (st.st_dev, st.st_ino)


def _refuse_planted_link(path: str) -> None:
    """ValueError when ``path`` is a symlink in a world-writable sticky directory (such as /tmp) owned by someone
    else than this user: another user may have planted it to make this process replace a file of theirs choosing
    (the case the kernel's ``fs.protected_symlinks`` guards against)."""
    d = os.path.dirname(os.path.abspath(path))
    try:
        dst, lst = os.stat(d), os.lstat(path)
    except OSError:
        return
    sticky_public = dst.st_mode & stat.S_ISVTX and dst.st_mode & stat.S_IWOTH
    if sticky_public and lst.st_uid != os.geteuid() and lst.st_uid != dst.st_uid:
        raise ValueError(f"{path}: the output is a symlink owned by another user in the world-writable directory "
                         f"{d}; refusing to follow it (remove it or write elsewhere)")


def make_readable(path: str) -> None:
    """Give a file made by ``tempfile.mkstemp`` (mode 0600) the mode a plain ``open`` would: 0666 less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def set_output_mode(tmp: str, dest: str) -> None:
    """Give the temporary ``tmp`` the permission bits it should have once renamed to ``dest``: those of ``dest``
    when it exists and is a regular file (overwriting never widens them), else :func:`make_readable`'s."""
    try:
        st = os.stat(dest)
    except OSError:
        st = None
    if st is not None and stat.S_ISREG(st.st_mode):
        os.chmod(tmp, stat.S_IMODE(st.st_mode))
    else:
        make_readable(tmp)


def discard(*paths: str | None) -> None:
    """Remove temporary files, ignoring the ones already gone (clean-up on a failure path: never raises)."""
    for p in paths:
        if p:
            try:
                os.unlink(p)
            except OSError:
                pass


def write_text_atomic(path: str, text: str, prefix: str = ".tmp-gaptrace-") -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same directory and ``os.replace``: the
    path holds the old content or the new, never half a file; the temporary file is removed on any error. An
    existing regular file at ``path`` keeps its permission bits."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        set_output_mode(tmp, path)
        os.replace(tmp, path)
    except BaseException:
        discard(tmp)
        raise
