"""Run folders: owned by one process at a time, written so that a crash or a
full disk leaves only whole files.

Contract: `claim(path)` creates the folder, checks it is writable (with room
for Hydra's snapshot) and takes an exclusive lock on it for the life of the
process (ConfigError, exit 2, when another process holds it, an earlier run
left its events or summary there, or it cannot be written); `claim_fresh(path)`
does the same but picks `path-2`, `path-3`, ... when `path` is taken (two
runs started in the same second); `write_atomic(path, data)` writes a temp
file and renames it, so readers see the old file or the new one, never half.
"""

from __future__ import annotations

import errno
import fcntl
import os
import tempfile
from pathlib import Path

from specpipe.errors import ConfigError, SpecpipeError

_held: dict[str, int] = {}  # real path -> the directory fd holding the lock (released when the process ends)


def claim(path: str | Path, option: str = "hydra.run.dir") -> Path:
    """Create `path`, check it is writable and holds no earlier run, and lock it for this process.

    Args:
        path: the run folder.
        option: the setting that chose it, named in the error message.
    """
    folder = Path(path).expanduser()
    key = os.path.realpath(folder)
    if key in _held:
        return folder
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise ConfigError(
            f"cannot create the run folder {folder} ({exc.strerror}): choose a writable {option}=<folder>"
        ) from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
            raise ConfigError(
                f"the run folder {folder} is in use by another run: give this run its own {option}=<folder>"
            ) from exc
        raise ConfigError(
            f"cannot lock the run folder {folder} ({exc.strerror}): choose another {option}=<folder>"
        ) from exc
    earlier = [name for name in RUN_FILES if (folder / name).exists()]
    if earlier:  # a finished (or crashed) run: its events and summary are results, never replaced
        os.close(fd)
        raise ConfigError(
            f"the run folder {folder} holds an earlier run ({', '.join(earlier)}): give this run its own "
            f"{option}=<folder> (or delete {folder} to replace it)"
        )
    try:
        _probe(folder)
    except OSError as exc:
        os.close(fd)
        if created:  # leave no empty folder behind a start that failed
            try:
                folder.rmdir()
            except OSError:
                pass
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ConfigError(
                f"the disk holding the run folder {folder} is full ({exc.strerror}): free some space "
                f"or choose another {option}=<folder>"
            ) from exc
        raise ConfigError(
            f"the run folder {folder} is not writable ({exc.strerror}): choose another {option}=<folder>"
        ) from exc
    _held[key] = fd
    return folder


RUN_FILES = ("events.jsonl", "summary.json")  # what a run writes into its folder: present = a run was here
PROBE_BYTES = 32 * 1024  # Hydra's .hydra/ snapshot (three files of 4 KiB blocks) and the first event lines


def _probe(folder: Path) -> None:
    """Write PROBE_BYTES into the folder and remove them: Hydra writes its snapshot there before any of
    our code runs, so a full disk must be found now, not as Hydra's ENOSPC traceback."""
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-") as probe:
        probe.write(b"\0" * PROBE_BYTES)
        probe.flush()
        os.fsync(probe.fileno())


def claim_fresh(path: str | Path, option: str = "hydra.run.dir") -> Path:
    """`path` if no other process has claimed it, else the first free `path-2`, `path-3`, ..."""
    base = Path(path).expanduser()
    for n in range(1, 1000):
        folder = base if n == 1 else base.with_name(f"{base.name}-{n}")
        made = [p for p in (folder.parent, *folder.parent.parents) if not p.exists()]
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            folder.mkdir()  # atomic: exactly one process creates each name
        except FileExistsError:
            continue
        except OSError as exc:
            raise ConfigError(
                f"cannot create the run folder {folder} ({exc.strerror}): choose a writable {option}=<folder>"
            ) from exc
        try:
            return claim(folder, option)
        except ConfigError:
            for empty in (folder, *made):  # a full disk: take back the folders this call made
                try:
                    empty.rmdir()
                except OSError:
                    break
            raise
    raise ConfigError(f"no free run folder next to {base}: choose {option}=<folder>")


def claimed() -> list[str]:
    """The run folders this process holds (real paths)."""
    return list(_held)


def release(path: str | Path) -> None:
    """Drop this process's lock on `path` (tests; a process that runs again elsewhere)."""
    fd = _held.pop(os.path.realpath(Path(path).expanduser()), None)
    if fd is not None:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` through a temp file + rename: never a half-written file.

    Raises:
        SpecpipeError: when the disk is full or the folder cannot be written
            (the temp file is removed; an older `path` stays as it was).
    """
    path = Path(path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())  # mkstemp's 0600 would hide the file from other users
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise SpecpipeError(f"cannot write {path} ({exc.strerror})") from exc


def claim_override(argv: list[str]) -> str | None:
    """Claim the folder named by a `hydra.run.dir=...` override before Hydra writes into it.

    Returns:
        A one-line message when it cannot be claimed, else None. Sweeps (-m)
        and argv without the override are left alone (the default run folder
        is claimed fresh by the `specpipe_fresh_dir` resolver, conf/hydra/specpipe.yaml).
    """
    if any(a in ("-m", "--multirun") for a in argv):
        return None
    wanted = [a for a in argv if a.split("=", 1)[0].lstrip("+~") == "hydra.run.dir"]
    if not wanted:
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        (override,) = OverridesParser.create().parse_overrides(wanted[-1:])
        claim(str(override.value()))
    except ConfigError as exc:
        return str(exc)
    except Exception:  # noqa: BLE001  (a malformed override: Hydra reports it in its own words)
        return None
    return None


def fresh_dir_resolver(path: str) -> str:
    """OmegaConf resolver `${specpipe_fresh_dir:outputs/...}`: the default run folder, claimed
    by this process (`-2`, `-3`, ... when two runs start in the same second). One result per
    process, however often Hydra resolves it."""
    if path not in _fresh:
        try:
            _fresh[path] = str(claim_fresh(path))
        except ConfigError as exc:
            import sys

            print(f"{_tool or Path(sys.argv[0]).name}: error: {exc}", file=sys.stderr)
            raise SystemExit(exc.exit_code) from None
    return _fresh[path]


_fresh: dict[str, str] = {}
_tool = ""  # the console script's name for messages (`python -m specpipe.cli` has argv[0] `__main__.py`)


def name_tool(tool: str) -> None:
    """Name the command in the resolver's one-line errors (shell.hydra_main calls it)."""
    global _tool
    _tool = tool


def tool_name() -> str:
    """The command `name_tool` named ("" before hydra_main ran)."""
    return _tool


def reserve_space(folder: Path, size: int = 64 * 1024) -> Path | None:
    """Hold `size` bytes (or the most of 64/16/4 KiB that fits) in a hidden file, so that
    when the disk fills up during a run, freeing it makes room for the summary."""
    path = Path(folder) / ".summary-reserve"
    for n in (size, 16 * 1024, 4 * 1024):
        try:
            with open(path, "wb") as f:
                os.posix_fallocate(f.fileno(), 0, n) if hasattr(os, "posix_fallocate") else f.write(b"\0" * n)
            return path
        except OSError:
            continue
    try:
        path.unlink()
    except OSError:
        pass
    return None


def free_space(reserved: Path | None) -> None:
    if reserved is not None:
        try:
            reserved.unlink()
        except OSError:
            pass


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def hydra_output_dir() -> str | None:
    """This job's run folder while Hydra runs it, else None (a library call)."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return HydraConfig.get().runtime.output_dir
    return None
