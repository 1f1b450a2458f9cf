"""What the README, the shipped drafters' cards and docs/generate.md tell a user to type works.

* Every ```python block of README.md, drafters/*/*/README.md, assets/training-state/*/README.md and docs/generate.md
  runs, in order and in one namespace per file, against tiny models (the loaders it calls hand back tiny stand-ins).
* Every `drafter.config.X` / `drafter.generation_config.X` those files and the rest of docs/ name (code or prose) is
  an attribute the library reads, and an assignment they show takes effect in the next `generate` call (a proposal
  option on `drafter.config` would change nothing: the config refuses it, and this check fails on such text).
* The shipped cards are what the card template renders today (`hub.card.refresh_model_card`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import transformers
from transformers import GenerationConfig, PreTrainedTokenizerFast

import carryover_hf
import carryover_hf.hub.loading
import carryover_hf.hub.local_cache
import carryover_hf.targets
from carryover_hf.configuration_carryover import PROPOSAL_DEFAULTS
from carryover_hf.errors import ProposalOptionError
from carryover_hf.generation import (
    CARRYOVER_GENERATION_OPTIONS,
    ProposalPolicy,
    RoundObserver,
    drafter_defaults,
    observing_rounds,
)
from carryover_hf.hub.card import render_model_card, refresh_model_card
from carryover_hf.tools.testing import tiny_drafter, tiny_target

ROOT = Path(__file__).parents[1]
CARDS = sorted([*ROOT.glob("drafters/*/*/README.md"), *ROOT.glob("assets/training-state/*/README.md")])
SNIPPET_FILES = [ROOT / "README.md", *CARDS, ROOT / "docs" / "generate.md"]
# Where attribute names are checked: the files above, the card template and every doc.
NAMED_FILES = sorted({*SNIPPET_FILES, ROOT / "src/carryover_hf/assets/model_cards/carryover_drafter.md",
                      *ROOT.glob("docs/*.md")})  # fmt: skip
VOCAB = 64
# `drafter.config.X` / `drafter.generation_config.X`, with the value when the text assigns one (up to a backtick,
# a line end or a `#` comment).
NAMED = re.compile(r"\bdrafter\.(config|generation_config)\.(\w+)(?:\s*=(?!=)\s*([^`\n#]+))?")
# Any config but a generation config naming a per-call option (`model.config.lookup_drafts`, ...).
OPTION_ON_A_CONFIG = re.compile(r"(?<!generation_)config\.(" + "|".join(CARRYOVER_GENERATION_OPTIONS) + r")\b")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    words = ["[UNK]"] + [f"w{i}" for i in range(1, VOCAB)]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]",
                                        model_input_names=["input_ids", "attention_mask"])  # fmt: skip
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return tokenizer


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4)


@pytest.fixture
def stand_ins(target, tmp_path, monkeypatch):
    """The loaders the snippets call hand back the tiny target, a tiny tokenizer and a tiny drafter saved in
    `tmp_path/drafter` (whose generation_config.json a card's test replaces with the card's own)."""
    drafter = tiny_drafter(target, num_hidden_layers=1, block_size=4, target_name_or_path="org/tiny-target")
    drafter.save_pretrained(tmp_path / "drafter")
    tokenizer = tiny_tokenizer()
    monkeypatch.setenv("CARRYOVER_HF_CACHE", str(tmp_path / "cache"))  # round_policy="cost" calibrates once here
    auto_model = transformers.AutoModel.from_pretrained.__func__
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(lambda cls, *a, **k: target))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", classmethod(lambda cls, *a, **k: tokenizer))
    monkeypatch.setattr(transformers.AutoModel, "from_pretrained",
                        classmethod(lambda cls, name, **k: auto_model(cls, tmp_path / "drafter", **k)))
    monkeypatch.setattr(carryover_hf.targets, "load_target", lambda *a, **k: (target, tokenizer))
    monkeypatch.setattr(carryover_hf.hub.local_cache, "add_to_hub_cache", lambda *a, **k: None)
    load_drafter = carryover_hf.hub.loading.load_drafter
    monkeypatch.setattr(carryover_hf.hub.loading, "load_drafter",
                        lambda name, target, **k: load_drafter(tmp_path / "drafter", target, **k))  # fmt: skip
    inputs = tokenizer("w1 w2 w3 w1 w2", return_tensors="pt")
    # What docs/generate.md's snippets take as given (a target, a drafter, inputs, token ids).
    return dict(target=target, drafter=drafter, tokenizer=tokenizer, inputs=inputs,
                prompt_ids=[1, 2, 3, 1, 2], accepted_ids=[3, 1])  # fmt: skip


def run_blocks(path: Path, namespace: dict) -> int:
    """Runs the file's python blocks in order in `namespace`; returns how many there were."""
    blocks = python_blocks(path.read_text(encoding="utf-8"))
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"{_rel(path)} python block {i + 1}", "exec"), namespace)
        except Exception as error:
            failure = f"{_rel(path)}: python block {i + 1} fails: {type(error).__name__}: {error}"
            raise AssertionError(failure) from error
    return len(blocks)


@pytest.mark.parametrize("path", SNIPPET_FILES, ids=_rel)
def test_python_blocks_run_against_tiny_models(path, stand_ins, tmp_path, capsys):
    saved = path.parent / "generation_config.json"
    if path in CARDS and saved.is_file():  # the card's snippet loads the drafter with the card's own defaults
        (tmp_path / "drafter" / "generation_config.json").write_text(saved.read_text())
    # README and cards load their models themselves; docs/generate.md's snippets take them as given.
    namespace = {"__name__": "__snippet__", **(stand_ins if path.parent.name == "docs" else {})}
    assert run_blocks(path, namespace) > 0, f"{_rel(path)} has no python block"
    if "drafter" in namespace and "output" in namespace:  # a generate call ran through the Carryover generator
        assert namespace["drafter"].last_generation_stats.num_rounds > 0


def settings(target, drafter) -> dict:
    """The proposal settings the candidate generator of a `generate` call with no options of its own runs with."""
    seen = {}

    class Capture(RoundObserver):
        def generation_started(self, generator):
            seen["generator"] = generator

    with observing_rounds(drafter, Capture()):
        target.generate(torch.tensor([[1, 2, 3, 1, 2, 3, 1]]), attention_mask=torch.ones(1, 7, dtype=torch.long),
                        assistant_model=drafter, generation_config=GenerationConfig(max_new_tokens=3, do_sample=False))
    generator = seen["generator"]
    policy = generator.policy
    values = {"use_carryover": generator.proposer.use_carryover,
              "round_policy": "rules" if isinstance(policy, ProposalPolicy) else "cost"}  # fmt: skip
    if isinstance(policy, ProposalPolicy):
        values.update(
            lookup_drafts=policy.lookup_drafts,
            proposal_backoff=policy.backoff and policy.backoff.limit,
            lookup_backoff=policy.lookup_backoff and policy.lookup_backoff.limit,
            draft_confidence_threshold=policy.confidence and policy.confidence.threshold,
        )
    return values


def as_run(name: str, value):
    """A proposal default as the generator runs with it (0 and None are off; None is the rules policy)."""
    if name == "use_carryover":
        return bool(value)
    if name == "round_policy":
        return value or "rules"
    return value or None


def named_attributes(text: str) -> list[tuple[str, str, str | None]]:
    return [(owner, name, value.strip() if value else None) for owner, name, value in NAMED.findall(text)]


def check_named_attributes(text: str, target, where: str = "text", scan_configs: bool = True) -> int:
    """Each `drafter.config.X` / `drafter.generation_config.X` in `text` is read by the library, and each assignment
    shown takes effect: executed on a tiny drafter, the next generate call runs with it. With `scan_configs`, no
    per-call option is named on any other config either. Returns how many attributes it checked."""
    misplaced = OPTION_ON_A_CONFIG.findall(text) if scan_configs else []
    assert not misplaced, f"{where} names per-call options on a config: {misplaced} (they live in generation_config)"
    checked = 0
    for owner, name, value in named_attributes(text):
        drafter = tiny_drafter(target, num_hidden_layers=1, block_size=4)
        statement = f"drafter.{owner}.{name}" + (f" = {value}" if value is not None else "")
        if owner == "config":
            assert hasattr(drafter.config, name), f"{where}: `{statement}`: the drafter config has no `{name}`"
            if value is not None:
                exec(statement, {"drafter": drafter})  # a config field: the config takes it
        else:
            assert name in PROPOSAL_DEFAULTS, (
                f"{where}: `{statement}`: generate reads only {sorted(PROPOSAL_DEFAULTS)} from "
                "drafter.generation_config"
            )
            if value is not None:
                before = settings(target, drafter)
                exec(statement, {"drafter": drafter})
                assigned = getattr(drafter.generation_config, name)
                assert drafter_defaults(drafter)[name] == assigned
                after = settings(target, drafter)
                assert after[name] == as_run(name, assigned) != before[name], (
                    f"{where}: `{statement}` does not change what generate runs ({before[name]!r} -> {after[name]!r})"
                )
        checked += 1
    return checked


@pytest.mark.parametrize("path", NAMED_FILES, ids=_rel)
def test_named_config_attributes_exist_and_assignments_take_effect(path, target):
    check_named_attributes(path.read_text(encoding="utf-8"), target, _rel(path))


def test_the_cards_and_docs_name_the_proposal_defaults_at_all():
    """The checks above have something to check: every card tells how to turn carryover off, docs/generate.md shows
    setting a default."""
    for card in CARDS:
        assert ("generation_config", "use_carryover", "False") in named_attributes(card.read_text()), _rel(card)
    assert ("generation_config", "lookup_drafts", "10") in named_attributes((ROOT / "docs/generate.md").read_text())


def test_the_checks_fail_on_the_old_card_text(target, stand_ins, tmp_path):
    """The sentence the cards carried before (a proposal option set on the config) fails each check."""
    old = "Set\n`drafter.config.use_carryover = False` to draft as plain DFlash with the same weights."
    with pytest.raises(AssertionError, match="per-call options on a config"):
        check_named_attributes(old, target)
    with pytest.raises(AssertionError, match="the drafter config has no `use_carryover`"):
        check_named_attributes(old, target, scan_configs=False)
    (tmp_path / "old.md").write_text("```python\ndrafter.config.use_carryover = False\n```\n")
    with pytest.raises(AssertionError, match=r"ProposalOptionError: .*`drafter\.generation_config\.use_carryover ="):
        run_blocks(tmp_path / "old.md", dict(stand_ins))


@pytest.mark.parametrize("card", CARDS, ids=_rel)
def test_shipped_cards_are_rendered_from_the_current_template(card):
    """Re-rendering a shipped card from the template changes nothing: edit the template, then refresh the cards
    (`refresh_model_card(folder).save(folder / "README.md")`); their tables and notes are kept."""
    refreshed = str(refresh_model_card(card.parent))
    assert refreshed == card.read_text(encoding="utf-8"), (
        f"{_rel(card)} differs from the template's rendering: refresh it with "
        f"carryover_hf.hub.card.refresh_model_card('{_rel(card.parent)}').save('{_rel(card)}')"
    )


@pytest.mark.parametrize("export_format", [None, "speculators"])
def test_refreshing_a_card_keeps_what_it_was_rendered_with(target, tmp_path, export_format):
    drafter = tiny_drafter(target, num_hidden_layers=1, block_size=4, drafter_type="markov")
    drafter.generation_config.lookup_drafts = 6
    drafter.save_pretrained(tmp_path)
    rows = [{"category": "code", "acceptance_length": 2.5, "acceptance_length_ci": [2.25, 2.75], "speedup": 1.5},
            {"category": "all", "speedup": 0.93, "speedup_ci": [0.9, 0.96]}]  # fmt: skip
    card = render_model_card(drafter.config, "org/tiny-markov", base_model="org/tiny-target", evaluation=rows,
                             evaluation_note="Two rows.", training_data="made up", objective="none", license="mit",
                             tags=["extra"], export_format=export_format, generation_config=drafter.generation_config)
    card.save(tmp_path / "README.md")
    assert str(refresh_model_card(tmp_path)) == (tmp_path / "README.md").read_text()
    bare = render_model_card(drafter.config, generation_config=drafter.generation_config)  # no repo id, table, texts
    bare.save(tmp_path / "README.md")
    assert str(refresh_model_card(tmp_path)) == (tmp_path / "README.md").read_text()
