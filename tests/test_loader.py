"""Model loading: mlx-lm / Hugging Face folders (path and local HF cache),
weight precisions, and clear errors."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.utils import save_config, save_model

from specpipe.engine.load.loader import load_engine
from specpipe.engine.load.tiny import build_tiny, byte_tokenizer, tiny_config
from specpipe.errors import SpecpipeError

IDS = mx.array([5, 70, 71, 72, 32, 99, 100], dtype=mx.uint32)


def logits_of(engine):
    return engine.forward(IDS, engine.make_cache()).logits


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A tiny qwen2 saved the way mlx-lm saves models, with its tokenizer."""
    folder = tmp_path_factory.mktemp("tiny-qwen2")
    model, config = build_tiny("qwen2", seed=4)
    save_model(folder, model)
    save_config({**tiny_config("qwen2"), "eos_token_id": 258}, folder / "config.json")
    byte_tokenizer().save_pretrained(folder)
    return folder, model


def test_folder_loads_the_same_model(model_folder):
    folder, model = model_folder
    engine = load_engine(path=str(folder), precision="float32")
    assert engine.info.source == "folder" and engine.info.arch == "qwen2" and engine.info.sha256
    expected = model(IDS[None], cache=None)[0]
    assert mx.allclose(logits_of(engine), expected, atol=1e-5).item()
    assert engine.tokenizer.decode(engine.tokenizer.encode("hello")) == "hello"
    assert 258 in engine.eos_token_ids


def test_repo_id_found_in_local_hf_cache(model_folder, tmp_path, monkeypatch):
    folder, _ = model_folder
    snapshot = tmp_path / "hub" / "models--tiny--qwen2" / "snapshots" / "abc123"
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(folder, target_is_directory=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    engine = load_engine(path="tiny/qwen2", precision="float32")
    assert engine.info.name == "tiny/qwen2" and engine.info.arch == "qwen2"


def test_folder_without_config_is_refused(tmp_path):
    with pytest.raises(SpecpipeError, match="no config.json"):
        load_engine(path=str(tmp_path))


def test_unknown_repo_id_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(SpecpipeError, match="is not downloaded.*hf download nobody/nothing"):
        load_engine(path="nobody/nothing")


@pytest.mark.parametrize(
    "precision, expect", [("bfloat16", "bfloat16"), ("float16", "float16"), ("mlx8", "q8"), ("mlx4", "q4")]
)
def test_precisions(precision, expect):
    engine = load_engine(
        "tiny-random",
        precision=precision,
        arch="llama",
        tiny={"hidden_size": 128, "intermediate_size": 256, "head_dim": 32},
    )
    assert expect in engine.info.precision
    reference = load_engine(
        "tiny-random",
        precision="float32",
        arch="llama",
        tiny={"hidden_size": 128, "intermediate_size": 256, "head_dim": 32},
    )
    a, b = logits_of(engine), logits_of(reference)
    # lower precision moves logits (4-bit on random Gaussian weights: ~25%), but it is the same model
    cosine = (mx.sum(a * b) / mx.sqrt(mx.sum(a * a) * mx.sum(b * b))).item()
    assert cosine > 0.9, cosine


def test_unknown_precision():
    with pytest.raises(SpecpipeError, match="quant="):
        load_engine("tiny-random", precision="int3")


def test_smollm2_stored_stays_quantized_and_auto_is_float32_on_cpu(smollm2_gguf):
    stored = load_engine("smollm2-135m", precision="stored")
    assert "q4" in stored.info.precision and "q8" in stored.info.precision
    auto = load_engine("smollm2-135m", precision="auto")
    assert auto.info.precision == "float32"
    # the float32 model is the dequantized stored model: same greedy tokens
    assert mx.argmax(logits_of(stored), axis=-1).tolist() == mx.argmax(logits_of(auto), axis=-1).tolist()


@pytest.mark.parametrize("arch", ["gemma4_text", "gemma4"])
def test_a_model_loaded_on_one_thread_runs_forwards_on_another(arch):
    """gemma4's RoPE keeps its frequencies outside its parameters (`_freqs`): the loader evaluates them too, or
    the server's worker thread, which runs every forward, fails with "no Stream(cpu, 0) in current thread"."""
    import threading

    engine = load_engine("tiny-random", precision="float32", arch=arch, seed=0)
    errors: list[str] = []

    def forward() -> None:
        try:
            mx.eval(logits_of(engine))
        except RuntimeError as exc:
            errors.append(str(exc))

    worker = threading.Thread(target=forward)
    worker.start()
    worker.join()
    assert errors == []
