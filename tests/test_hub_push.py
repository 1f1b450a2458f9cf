"""`push_to_hub` / `carryover-hf push` against a mocked `huggingface_hub.HfApi` (never the network)."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest
from huggingface_hub import HfApi, ModelCard
from transformers import AutoModel

from carryover_hf.hub import CheckpointError, push_to_hub
from carryover_hf.hub import push as push_module
from carryover_hf.tools.testing import tiny_drafter, tiny_target


@pytest.fixture(scope="module")
def drafter():
    target = tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4)
    return tiny_drafter(target, num_hidden_layers=1, block_size=4, target_name_or_path="org/tiny-target")


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())}


def mocked_api() -> tuple[mock.MagicMock, dict]:
    """An HfApi stand-in that records what upload_folder would have sent."""
    api = mock.create_autospec(HfApi, instance=True)
    uploaded = {}

    def upload_folder(**kwargs):
        uploaded.update(snapshot(kwargs["folder_path"]))  # read now: the folder is temporary
        return mock.Mock(commit_url="https://huggingface.co/org/tiny-carryover-dflash/commit/abc")

    api.upload_folder.side_effect = upload_folder
    return api, uploaded


def test_push_uploads_the_dry_run_folder_exactly(drafter, tmp_path):
    evaluation = [{"category": "qa", "acceptance_length": 2.25, "acceptance_length_ci": [2.1, 2.4]}]
    dry = push_to_hub(drafter, "org/tiny-carryover-dflash", evaluation=evaluation, dry_run=tmp_path / "dry")
    assert set(snapshot(dry)) == {"README.md", "config.json", "generation_config.json", "model.safetensors"}

    api, uploaded = mocked_api()
    url = push_to_hub(drafter, "org/tiny-carryover-dflash", evaluation=evaluation, private=True, api=api)
    assert url.endswith("/commit/abc")
    api.create_repo.assert_called_once_with("org/tiny-carryover-dflash", repo_type="model", private=True,
                                            exist_ok=True)
    call = api.upload_folder.call_args.kwargs
    assert call["repo_id"] == "org/tiny-carryover-dflash" and call["repo_type"] == "model"
    assert uploaded == snapshot(dry)
    card = ModelCard(uploaded["README.md"].decode())
    assert card.data.base_model == "org/tiny-target" and "2.25 [2.10, 2.40]" in card.text


def test_push_from_a_saved_folder_copies_only_configs_and_safetensors(drafter, tmp_path):
    drafter.save_pretrained(tmp_path / "saved")
    (tmp_path / "saved" / "notes.txt").write_text("local scratch")
    (tmp_path / "saved" / "training_args.bin").write_bytes(b"pickle")
    api, uploaded = mocked_api()
    push_to_hub(tmp_path / "saved", "org/tiny-carryover-dflash", api=api)
    assert set(uploaded) == {"README.md", "config.json", "generation_config.json", "model.safetensors"}
    assert uploaded["model.safetensors"] == (tmp_path / "saved" / "model.safetensors").read_bytes()


def test_push_validates_before_any_upload(drafter, tmp_path):
    api, _ = mocked_api()
    with pytest.raises(ValueError):
        push_to_hub(drafter, "not a repo id", api=api)
    target = tiny_target("llama", vocab_size=64, hidden_size=64, num_hidden_layers=4)
    target.save_pretrained(tmp_path / "target")
    with pytest.raises(CheckpointError, match="not a Carryover drafter"):
        push_to_hub(tmp_path / "target", "org/tiny-carryover-dflash", api=api)
    api.create_repo.assert_not_called()
    api.upload_folder.assert_not_called()


def test_push_command(drafter, tmp_path, monkeypatch, capsys):
    drafter.save_pretrained(tmp_path / "saved")
    (tmp_path / "eval.json").write_text(json.dumps([{"category": "math", "acceptance_length": 3.0, "speedup": 2.0}]))
    args = [str(tmp_path / "saved"), "org/tiny-carryover-dflash", "--evaluation", str(tmp_path / "eval.json"),
            "--training-data", "regenerated prompts"]
    assert push_module.main(args + ["--dry-run", str(tmp_path / "dry")]) == 0
    assert "| math | 3.00 | 2.00x |" in (tmp_path / "dry" / "README.md").read_text()

    api, uploaded = mocked_api()
    monkeypatch.setattr(push_module, "HfApi", mock.Mock(return_value=api))
    assert push_module.main(args) == 0
    assert "Uploaded: https://huggingface.co/org/tiny-carryover-dflash/commit/abc" in capsys.readouterr().out
    assert uploaded == snapshot(tmp_path / "dry")
    assert push_module.main([str(tmp_path / "missing"), "org/x-carryover-dflash"]) == 1


def test_push_command_sets_the_proposal_defaults_and_refuses_a_bad_one_before_writing(drafter, tmp_path, capsys):
    drafter.save_pretrained(tmp_path / "saved")
    base = [str(tmp_path / "saved"), "org/tiny-carryover-dflash"]
    options = ["--lookup-drafts", "10", "--proposal-backoff", "8", "--draft-confidence-threshold", "0.6"]
    assert push_module.main(base + options + ["--dry-run", str(tmp_path / "dry")]) == 0
    config = json.loads((tmp_path / "dry" / "generation_config.json").read_text())
    assert (config["lookup_drafts"], config["proposal_backoff"], config["draft_confidence_threshold"]) == (10, 8, 0.6)
    assert config["lookup_backoff"] is None and config["use_carryover"] is True  # not given: as saved
    assert not {"lookup_drafts", "use_carryover"} & set(json.loads((tmp_path / "dry" / "config.json").read_text()))
    assert "context lookup of 10 tokens" in (tmp_path / "dry" / "README.md").read_text()
    assert config["round_policy"] is None  # not given: as saved (the rules)
    assert push_module.main(base + options + ["--round-policy", "cost", "--dry-run", str(tmp_path / "cost")]) == 0
    assert AutoModel.from_pretrained(tmp_path / "cost").generation_config.round_policy == "cost"
    card = (tmp_path / "cost" / "README.md").read_text()
    assert 'cost-aware round policy (`round_policy="cost"`' in card and "context lookup of 10 tokens" in card
    assert push_module.main(base + ["--carry", "off", "--dry-run", str(tmp_path / "off")]) == 0
    loaded = AutoModel.from_pretrained(tmp_path / "off")
    assert loaded.generation_config.use_carryover is False and loaded.generation_config.lookup_drafts is None
    weights = (tmp_path / "dry" / "model.safetensors", tmp_path / "saved" / "model.safetensors")
    assert weights[0].read_bytes() == weights[1].read_bytes()

    for bad, message in ((["--proposal-backoff", "-1"], "proposal_backoff must be a whole number of rounds"),
                         (["--draft-confidence-threshold", "1.5"], "draft_confidence_threshold must lie in")):
        assert push_module.main(base + bad + ["--dry-run", str(tmp_path / "bad")]) == 1
        assert message in capsys.readouterr().err
        assert not (tmp_path / "bad").exists()
