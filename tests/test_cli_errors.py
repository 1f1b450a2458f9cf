"""Every `carryover-hf` command reports bad input in one line that names the option, exits non-zero, and prints no
traceback; any other exception is a bug and keeps its traceback."""

from __future__ import annotations

import types

import pytest

from carryover_hf.tools import cli
from carryover_hf.errors import InputNotFoundError, UsageError


@pytest.mark.parametrize(
    "argv, status, message",
    [
        (["train", "--dataset", "/nonexistent"], 2, "--dataset '/nonexistent' is neither"),
        (["train", "--drafter", "/nonexistent", "--dataset", "rows.jsonl"], 2, "--drafter '/nonexistent': no "),
        (["features", "--dataset", "/nonexistent", "--output", "{tmp}/features"], 2, "--dataset '/nonexistent'"),
        (["init", "no-such-config", "{tmp}/init"], 1, "No hub config 'no-such-config'"),
        (["init", "qwen3-4b-dflash", "{tmp}/init", "--target", "/nonexistent"], 1, "/nonexistent does not exist"),
        (["demo", "--drafter", "/nonexistent"], 2, "--drafter '/nonexistent' is neither a folder nor a repo id"),
        (["bench", "--target", "tiny", "--prompts", "/nonexistent"], 2, "No prompt file or suite folder"),
        (["regenerate", "--prompts_dir", "/nonexistent", "--output", "{tmp}/run"], 2, "No prompt file or suite"),
        (["prompts", "show", "--prompts-dir", "/nonexistent"], 2, "No prompt file or suite folder '/nonexistent'"),
        (["push", "/nonexistent", "org/x-carryover-dflash", "--dry-run", "{tmp}/up"], 1, "/nonexistent is not a"),
        (["push", "{tmp}", "org/x-carryover-dflash", "--evaluation", "/nonexistent.json"], 1, "--evaluation /no"),
        (["convert", "{tmp}", "{tmp}/out"], 1, "has no config.json"),
    ],
)
def test_bad_input_is_one_line(argv, status, message, tmp_path, capsys):
    assert cli.main([arg.format(tmp=tmp_path) for arg in argv]) == status
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert err.splitlines()[-1].startswith(f"carryover-hf {argv[0]}") and message in err.splitlines()[-1]


def test_usage_errors_become_one_line_and_bugs_keep_their_traceback(monkeypatch, capsys):
    def fake_main(error):
        def main(argv):
            raise error

        return types.SimpleNamespace(main=main)

    monkeypatch.setattr(cli.importlib, "import_module", lambda name: fake_main(InputNotFoundError("--x y is missing")))
    assert cli.main(["bench"]) == 2
    assert capsys.readouterr().err == "carryover-hf bench: error: --x y is missing\n"
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: fake_main(ValueError("not enough values")))
    with pytest.raises(ValueError, match="not enough values"):  # a plain ValueError is a bug, not bad input
        cli.main(["bench"])
    assert issubclass(UsageError, ValueError) and issubclass(InputNotFoundError, FileNotFoundError)
