"""Every repository path the docs (docs/**/*.md, README.md) and the data files (kvbench/data/*.toml) name exists.

What counts as a repository path, in prose, backticks and code blocks alike (URLs removed first):
- a word of path characters holding a '/' whose first part is a top-level entry git tracks (kvbench/, harness/,
  kernels/, results/, ...; an output folder git ignores, such as site/, is not one), or, in a data file, an
  entry of kvbench/data/ (models/NAME.json in models.toml means kvbench/data/models/NAME.json);
- it must be a tracked file, or a folder holding one.
Not paths: words with a placeholder (`<machine>`, `*`, `{x}`, `$VAR`, `~`, `NAME`, `...`), paths of other
projects (vllm/config/cache.py: its first part is no entry here), and the output lines of a shell session shown
in a fenced block ($ command, then its output: only the command lines count). An install name (kvbench/kernels/
is kernels/ once installed) is no repository path: where the docs mean the folder, they say kernels/; INSTALL_NAMES
lists where they may name the installed package instead, with why.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = "kvbench/data/"

URL = re.compile(r"[a-z][\w+.-]*://\S+")
WORD = re.compile(r"[\w.~$<>*{}\-]*/[\w.~$<>*{}\-/]*")
PLACEHOLDER = re.compile(r"[<>*{}$~]|NAME|\.\.\.")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)

# install names a page may use for the installed package, not the checkout (none today): {word: why}
INSTALL_NAMES: dict[str, str] = {}


@cache
def tracked() -> tuple[frozenset[str], frozenset[str]]:
    """(files, folders) git tracks; outside a checkout (an sdist), what is on disk."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    names = [n for n in out.stdout.decode().split("\0") if n] if out.returncode == 0 else []
    if not names:
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts]
    folders = {"/".join(n.split("/")[:i]) for n in names for i in range(1, n.count("/") + 1)}
    return frozenset(names), frozenset(folders)


def _sources() -> list[Path]:
    return [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", *sorted((ROOT / DATA).glob("*.toml"))]


def _text(path: Path) -> str:
    """The file's text without URLs and without the output lines of shell sessions in fenced blocks."""

    def commands_only(block: re.Match) -> str:
        lines = block.group(0).splitlines()
        if not any(line.startswith("$ ") for line in lines):
            return block.group(0)
        return "\n".join(line for line in lines if line.startswith("$ "))

    text = path.read_text()
    if path.suffix == ".md":
        text = FENCE.sub(commands_only, text)
    return URL.sub(" ", text)


def repo_paths(path: Path) -> list[str]:
    """The repository paths `path` names, each relative to the repository root."""
    files, folders = tracked()
    top = {n.split("/")[0] for n in files}
    data_top = {n[len(DATA) :].split("/")[0] for n in files if n.startswith(DATA) and n.count("/") > 2}
    found = []
    for word in WORD.findall(_text(path)):
        word = word.rstrip(".")
        if PLACEHOLDER.search(word) or word in INSTALL_NAMES:
            continue
        first = word.split("/")[0]
        if first in top:
            found.append(word)
        elif path.suffix == ".toml" and first in data_top:
            found.append(DATA + word)
    return found


def _exists(word: str) -> bool:
    files, folders = tracked()
    name = word.rstrip("/")
    return name in folders if word.endswith("/") else name in files or name in folders


@pytest.mark.parametrize("source", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_named_exists(source):
    missing = sorted({w for w in repo_paths(source) if not _exists(w)})
    assert not missing, f"{source.relative_to(ROOT)} names paths that are not in the repository: {missing}"


def test_the_rule_finds_paths_and_passes_over_what_is_not_one(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "See `kernels/bench.py` and harness/ (or kvbench/kernels/bench.py, kernels/bnech.py).\n"
        "Not paths: https://github.com/vllm-project/vllm/blob/main/vllm/config.py, vllm/config/cache.py,\n"
        "results/<machine>/runs/, kvbench/data/claims/*.toml, dashboards/page_NAME.py, site/index.html.\n"
        "```\n$ kvbench run --results results/\nwrote results/h100-sxm-80gb/runs/x.json\n```\n"
    )
    assert repo_paths(page) == [
        "kernels/bench.py",
        "harness/",
        "kvbench/kernels/bench.py",
        "kernels/bnech.py",
        "results/",
    ]
    assert [w for w in repo_paths(page) if not _exists(w)] == ["kvbench/kernels/bench.py", "kernels/bnech.py"]
    data = tmp_path / "models.toml"
    data.write_text('config = "models/llama-3.1-8b.json"  # and models/no-such.json\n')
    assert repo_paths(data) == [DATA + "models/llama-3.1-8b.json", DATA + "models/no-such.json"]
    assert [_exists(w) for w in repo_paths(data)] == [True, False]


def test_every_source_names_some_path():
    # guards against a rule that silently finds nothing, which would pass the test above
    assert sum(len(repo_paths(s)) for s in _sources()) > 200
