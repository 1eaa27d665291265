"""Which result file backs which figure: the index of ``benchmarks/results/`` and its checks.

``chorus bench index`` (or ``python -m chorus.bench.results_index``) rewrites
``benchmarks/results/INDEX.md``; ``--check`` changes nothing and prints one line per problem
(exit status 1 when there is one):

- a result file named in ``README.md`` or ``docs/*.md`` that does not exist;
- a file in ``benchmarks/results/`` that nothing there names;
- a figure in a figure table (below) that its result file does not hold, or a table of
  docs/benchmarks.md's "Current figures" or README.md's "Speed" that is not a figure table;
- an ``INDEX.md`` that regenerating would change.

A result file is named by its file name, in any path, where a card (``cpu``, ``h100``, ``h200``,
``h200x2``, ...) is one of its dash-separated words: ``benchmarks/results/t3-h200-2026-12-01-turbo.json``.
Braces expand as in a shell (``offline-h200-2026-12-01-{turbo,original}.json``) and ``*`` matches
like a file glob.

A figure table is a Markdown table of ``docs/benchmarks.md`` or ``README.md`` whose last header
cell is ``source``. Each row's source cell names one result file and one key path, both in
backticks: `` `stream-h100-2026-12-05-turbo.json` `stream[concurrency=64].ttfa_s.p99*1000` ``.
Every cell between the first and the last is a figure: its first number, rounded as printed
(commas aside), must equal the value at the key path times the optional ``*N`` factor. With more
than one figure cell, ``{}`` in the key path stands for the cell's column header. A cell of ``-``
or with no number holds no figure. Key paths: dict keys joined by dots, ``[3]`` a list index,
``[k=v]`` the list item whose ``k`` is ``v`` (``[k=v,j=w]``: both hold).
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

RESULTS_DIR = Path("benchmarks") / "results"
INDEX_NAME = "INDEX.md"
CARDS = ("cpu", "h100", "h200", "h200x2", "h100x2", "a100", "l40s")
FIGURE_DOCS = {"docs/benchmarks.md": "Current figures", "README.md": "Speed"}   # every table of that section
_CITATION = re.compile(r"[\w.{},*/-]+\.json")
_CARD_WORD = re.compile(rf"(?:^|-)(?:{'|'.join(CARDS)})(?:-|\.json$)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_KEY_PART = re.compile(r"\.?([\w-]+)|\[([^\]]+)\]")


@dataclass(frozen=True)
class Citation:
    name: str       # a file name, or a glob when it holds '*'
    doc: str        # the citing document, relative to the root
    line: int
    heading: str    # the nearest heading, or bold paragraph opening, above the citation


@dataclass(frozen=True)
class Figure:
    doc: str
    line: int
    label: str      # the row's first cell
    column: str     # the figure cell's column header
    printed: str    # the figure cell
    file: str
    key: str        # the key path, {} replaced, factor included


def expand(token: str) -> list[str]:
    """Shell-style brace expansion, innermost first: ``a-{b,c}.json`` -> ``a-b.json``, ``a-c.json``."""
    match = re.search(r"\{([^{}]*)\}", token)
    if not match:
        return [token]
    return [name for alternative in match.group(1).split(",")
            for name in expand(token[:match.start()] + alternative + token[match.end():])]


def _docs(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def citations(root: Path) -> list[Citation]:
    """Every result file named in README.md and docs/*.md, braces expanded, in document order."""
    found = []
    for path in _docs(root):
        heading = path.name
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            elif line.startswith("**") and "**" in line[2:]:
                heading = line[2:line.index("**", 2)].rstrip(".")   # a decision's entry, a bench's paragraph
            for token in _CITATION.findall(line):
                for name in expand(token):
                    name = name.rsplit("/", 1)[-1]
                    if _CARD_WORD.search(name):
                        found.append(Citation(name, path.relative_to(root).as_posix(), number, heading))
    return found


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _tables(root: Path):
    """(doc, line, section, header, rows) of every Markdown table of the figure documents; rows are
    (line, cells), the separator left out."""
    for doc in FIGURE_DOCS:
        section, table = "", None
        for number, line in enumerate([*(root / doc).read_text(encoding="utf-8").splitlines(), ""], 1):
            if line.startswith("## "):
                section = line[3:].strip()
            if line.startswith("|"):
                if table is None:
                    table = (doc, number, section, _cells(line), [])
                elif not set(line) <= set("|-: "):
                    table[4].append((number, _cells(line)))
            elif table is not None:
                yield table
                table = None


def unsourced_tables(root: Path) -> list[str]:
    """Tables of a figure section (docs/benchmarks.md's "Current figures", README.md's "Speed")
    without a ``source`` column: their figures could not be checked."""
    return [f"{doc}:{line}: a table of \"{section}\" without a source column"
            for doc, line, section, header, _ in _tables(root)
            if section == FIGURE_DOCS[doc] and header[-1].lower() != "source"]


def figures(root: Path) -> list[Figure]:
    """Every figure of the figure tables of docs/benchmarks.md and README.md."""
    found = []
    for doc, _, _, header, rows in _tables(root):
        if header[-1].lower() != "source":
            continue
        for number, cells in rows:
            names = re.findall(r"`([^`]+)`", cells[-1])
            file, key = names[:2] if len(names) >= 2 else ("", "")
            for column, cell in zip(header[1:-1], cells[1:-1]):
                if _NUMBER.search(cell):
                    found.append(Figure(doc, number, cells[0], column, cell, file, key.replace("{}", column)))
    return found


def resolve(report, key: str):
    """The value at ``key`` (``a.b[2].c[k=v]["d.e"]``: a list index, the one list item with those
    fields, a dict key holding dots) in a loaded report; KeyError naming the part missing."""
    path, _, factor = key.partition("*")
    value, position = report, 0
    for match in _KEY_PART.finditer(path):
        if match.start() != position:
            break
        position = match.end()
        name, selector = match.groups()
        if name is not None:
            if not isinstance(value, dict) or name not in value:
                raise KeyError(f"no key {name!r}")
            value = value[name]
        elif selector[:1] == selector[-1:] == '"' and len(selector) > 1:  # a dict key holding dots
            if not isinstance(value, dict) or selector[1:-1] not in value:
                raise KeyError(f"no key {selector}")
            value = value[selector[1:-1]]
        elif "=" in selector:
            wanted = dict(condition.partition("=")[::2] for condition in selector.split(","))
            items = [item for item in value if isinstance(item, dict)
                     and all(str(item.get(field)) == want for field, want in wanted.items())] \
                if isinstance(value, list) else []
            if len(items) != 1:
                raise KeyError(f"{len(items)} list items with [{selector}]")
            value = items[0]
        else:
            if not isinstance(value, list) or not -len(value) <= int(selector) < len(value):
                raise KeyError(f"no list index {selector}")
            value = value[int(selector)]
    if position != len(path):
        raise KeyError(f"cannot read the key path at {path[position:]!r}")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise KeyError(f"the value there is {value!r}, not a number")
    return value * float(factor) if factor else value


def figure_problem(figure: Figure, results: Path) -> str | None:
    """Why ``figure`` is not what its result file holds, or None when it is."""
    where = f"{figure.doc}:{figure.line} ({figure.label}, {figure.column})"
    if not figure.file or not figure.key:
        return f"{where}: the source cell names no `file` and `key path`"
    path = results / figure.file
    if not path.is_file():
        return f"{where}: {figure.file} does not exist in {RESULTS_DIR.as_posix()}/"
    try:
        value = resolve(json.loads(path.read_text(encoding="utf-8")), figure.key)
    except KeyError as exc:
        return f"{where}: {figure.file} `{figure.key}`: {exc.args[0]}"
    printed = _NUMBER.search(figure.printed).group().replace(",", "")
    decimals = len(printed.partition(".")[2])
    if abs(value - float(printed)) > 0.5 * 10 ** -decimals + 1e-9:
        return f"{where}: printed {printed}, but {figure.file} `{figure.key}` is {value:g}"
    return None


def render(root: Path) -> str:
    """INDEX.md: every result file and what cites it."""
    results = root / RESULTS_DIR
    cited: dict[str, list[str]] = {}
    for citation in citations(root):
        for name in _matches(citation.name, results):
            where = f"{citation.doc} ({citation.heading})"
            if where not in cited.setdefault(name, []):
                cited[name].append(where)
    counts: dict[str, int] = {}
    for figure in figures(root):
        counts[figure.file] = counts.get(figure.file, 0) + 1
    lines = [
        "# Result files",
        "",
        "Generated by `python -m chorus.bench.results_index` from the citations in README.md and docs/;",
        "`tests/bench/test_results_index.py` checks that it is current, that every file here is cited,",
        "and that every figure of a figure table is what its file holds (docs/benchmarks.md, \"Results",
        "and their index\"). Figures: the figure cells that name the file.",
        "",
        "| file | figures | cited by |",
        "|---|---|---|",
    ]
    for path in sorted(results.glob("*.json")):
        lines.append(f"| `{path.name}` | {counts.get(path.name, 0)} | {'; '.join(cited.get(path.name, [])) or '-'} |")
    return "\n".join(lines) + "\n"


def _matches(name: str, results: Path) -> list[str]:
    if "*" in name:
        return sorted(path.name for path in results.glob("*.json") if fnmatch.fnmatch(path.name, name))
    return [name] if (results / name).is_file() else []


def problems(root: Path) -> list[str]:
    """Every problem the index's checks find, one line each; empty when all hold."""
    results = root / RESULTS_DIR
    found = []
    cited = set()
    for citation in citations(root):
        names = _matches(citation.name, results)
        if not names:
            found.append(f"{citation.doc}:{citation.line}: cites {citation.name}, which is not in "
                         f"{RESULTS_DIR.as_posix()}/")
        cited.update(names)
    for path in sorted(results.glob("*.json")):
        if path.name not in cited:
            found.append(f"{RESULTS_DIR.as_posix()}/{path.name}: cited by no document (cite it or git rm it)")
    found += unsourced_tables(root)
    found += [problem for figure in figures(root) if (problem := figure_problem(figure, results))]
    index = results / INDEX_NAME
    if not index.is_file() or index.read_text(encoding="utf-8") != render(root):
        found.append(f"{RESULTS_DIR.as_posix()}/{INDEX_NAME} is out of date: run python -m chorus.bench.results_index")
    return found


DESCRIPTION = ("Rewrite benchmarks/results/INDEX.md, or check it and every figure against its result file "
               "(--check).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m chorus.bench.results_index`` and ``chorus bench index``."""
    parser.add_argument("--check", action="store_true", help="change nothing; print each problem, exit 1 if any")
    parser.add_argument("--root", type=Path, default=Path("."),
                        help="the repository root (default: the current directory)")


def run(args: argparse.Namespace) -> int:
    """Rewrite the index, or with ``args.check`` print each problem (exit status 1 when there is
    one); ``ValueError`` when ``args.root`` holds no results directory."""
    root = args.root.resolve()
    if not (root / RESULTS_DIR).is_dir():
        raise ValueError(f"{root} has no {RESULTS_DIR.as_posix()}/: run it from the repository root or pass --root")
    if args.check:
        found = problems(root)
        print("\n".join(found) if found else "benchmarks/results: index current, every file cited, every figure found")
        return 1 if found else 0
    index = root / RESULTS_DIR / INDEX_NAME
    partial = index.with_suffix(".md.partial")
    partial.write_text(render(root), encoding="utf-8")
    partial.replace(index)
    print(f"wrote {index}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chorus.bench.results_index", description=DESCRIPTION)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ValueError as exc:
        parser.error(str(exc))


if __name__ == "__main__":
    sys.exit(main())
