"""One live process per run directory: an advisory lock held on the directory for as long as a run writes there.

The output directory's rules (run_dir.py) say when a run may start in, resume from or overwrite a directory, but
they look only at the files there. A second process given the same directory while the first is still training
(a second `angpt train --resume`, or workers of a killed benchmark that live on) would pass those checks, then
continue, overwrite or delete files the first is still writing. `hold` closes that gap: it takes an exclusive
`flock` on the directory itself (no lock file, so an empty directory stays empty) and refuses, naming the
directory, when another process holds it. The kernel drops the lock when its holder exits, however it exits, so
no stale lock is ever left behind.

The lock is advisory and best effort: where the platform or file system has no `flock` on directories (Windows,
some network file systems), runs go on unguarded.
"""
from __future__ import annotations

import contextlib
import errno
import functools
import inspect
import os
from pathlib import Path

from .run_dir import RunDirError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


class RunDirInUseError(RunDirError):
    """Another live process holds the run directory."""


@contextlib.contextmanager
def hold(output_dir: str | os.PathLike, enabled: bool = True):
    """Hold `output_dir` for one run: create it if absent (and on exit remove again the directories this created,
    if the run left them empty), take the lock, release it on exit. `enabled=False` (ranks other than the main one
    of a distributed run, which share the directory with it) does nothing."""
    if not enabled:
        yield
        return
    path = Path(output_dir)
    created = [p for p in (path, *path.parents) if not p.exists()]  # the directory first, then its new parents
    path.mkdir(parents=True, exist_ok=True)
    fd = None if fcntl is None else os.open(path, os.O_RDONLY)  # Windows cannot open a directory
    try:
        if fd is not None:
            _lock(fd, path)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock
        for directory in created:
            try:
                directory.rmdir()
            except OSError:  # not empty: the run wrote there
                break


def holding_output_dir(function):
    """Decorator: `function` holds the directory passed as its `output_dir` argument (unless None) while it runs."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        output_dir = signature.bind(*args, **kwargs).arguments.get("output_dir")
        with contextlib.nullcontext() if output_dir is None else hold(output_dir):
            return function(*args, **kwargs)

    return wrapper


def _lock(fd: int, path: Path) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunDirInUseError(f"output directory {path} is in use by another running process; wait for it "
                                   "to finish or stop it, or choose another output directory") from None
        # ENOLCK, EBADF, EINVAL, EOPNOTSUPP: no directory locks on this file system; go on unguarded
