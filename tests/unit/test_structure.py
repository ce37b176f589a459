"""Import structure of the kvbench package, read with `ast` (nothing is imported).

Every module under the folders setup.py maps (kvbench/, harness/, kernels/, dashboards/) is parsed; its
imports, top-level and inside functions, absolute and relative, are resolved to modules of the package.
A cycle makes import order matter and hides which layer owns what, and each layer stands on the ones below it
only (LAYERS): the capacity model and the record format are used and tested without vLLM's client side, and a
change in the harness never changes what the verdict or a page says. Imports under `if TYPE_CHECKING:` count:
an annotation that names a higher layer is the same dependency, only later.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _package_dirs() -> dict[str, str]:
    """setup.py's PACKAGE_DIRS, read from its source so the test follows the wheel's layout."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "PACKAGE_DIRS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no PACKAGE_DIRS")


@cache
def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package."""
    found = {}
    for name, folder in _package_dirs().items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([name, *parts])] = path
    return found


def _is_package(module: str) -> bool:
    return modules()[module].name == "__init__.py"


def _resolve(module: str, name: str) -> str | None:
    """The package module `name` refers to (the longest known prefix), or None if it is outside kvbench."""
    known = modules()
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """Candidate dotted names one import statement of `module` names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        # relative: level 1 is the module's own package (a package's __init__ is its own package)
        package = module if _is_package(module) else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    # `from pkg import sub` imports the submodule pkg.sub when there is one
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


@cache
def imports() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its body (functions and TYPE_CHECKING blocks
    included)."""
    graph = {}
    for module, path in modules().items():
        deps = set()
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = _targets(module, node)
            if isinstance(node, ast.ImportFrom):
                # the submodules named, or else the module the names come from
                subs = {_resolve(module, n) for n in names[:-1]} - {None, _resolve(module, names[-1])}
                resolved = subs or {_resolve(module, names[-1])}
            else:
                resolved = {_resolve(module, n) for n in names}
            deps |= resolved - {None, module}
        graph[module] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """One cycle per strongly connected component with more than one module (Tarjan's algorithm), as text:
    the shortest cycle through its first module, then every module of the knot when there are more."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(set(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    found = []
    for component in components:
        cycle = " -> ".join(_one_cycle(graph, component))
        more = len(component) > cycle.count(" -> ")
        found.append(cycle + (f"  (in a knot of {', '.join(sorted(component))})" if more else ""))
    return found


def _one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(component)
    paths, seen = [[start]], {start}
    while paths:
        path = paths.pop(0)
        for dep in sorted(graph[path[-1]] & component):
            if dep == start:
                return [*path, start]
            if dep not in seen:
                seen.add(dep)
                paths.append([*path, dep])
    raise AssertionError(f"no cycle in {component}")


def _parents(module: str) -> set[str]:
    """A module's enclosing packages: importing a.b.c runs a/__init__ and a/b/__init__ first."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_the_graph_sees_the_package():
    # guards against a resolver that silently finds nothing, which would pass every test below
    assert {"kvbench.cli.app", "kvbench.harness.run.runner", "kvbench.kernels", "kvbench.dashboards"} <= set(modules())
    assert "kvbench.harness.server.lifecycle" in imports()["kvbench.harness.run.runner"]


def test_no_import_cycles():
    # a package's __init__ importing its own submodules is not a cycle of the submodule (Python runs the
    # __init__ first either way), so edges from a module to its enclosing packages are left out
    graph = {m: {d for d in deps if d not in _parents(m)} for m, deps in imports().items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


# The layers, lowest first, each a folder (or a few): a module belongs to the group whose folder holds it (the
# longest prefix), and may import its own group and any group of a lower rank, nothing else; peers of one rank
# (harness and analysis) never import each other. No module lists: a new module is placed by the folder it is
# put in, and nothing but ROOT_MODULES sits directly in kvbench/.
#   core < specs < records < kernels < models < [harness | analysis] < dashboards < orchestration < cli
# specs sits above core because the specs read the data files and raise core's errors, and machine, tracked and
# options read the specs; realmodels is with the specs because the eval tasks (specs/evaltasks.py) read its
# texts. kernels sits below the models (the tiny model's scorer quantizes K/V with the reference numerics) and
# the harness (which asks the vLLM plugin whether it will load); orchestration (measure: the one entrypoint that
# runs a plan and hands the harness the verdict; the asv suite; the nightly) starts runs, the CLI drives it.
# docs/architecture/index.md shows this table (test_the_docs_show_the_layers).
LAYERS = (
    ("core", 0, ("kvbench.core",), "what every layer shares: errors, data files, units, output, statistics"),
    ("specs", 1, ("kvbench.specs", "kvbench.realmodels"), "the specs and the capacity model; real models' files"),
    ("records", 2, ("kvbench.records",), "the run record, its storage, upgrades, queries and results/ layout"),
    ("kernels", 3, ("kvbench.kernels",), "reference numerics, Triton kernels, the vLLM plugin"),
    ("models", 4, ("kvbench.tinymodel",), "the CPU default's tiny model: build, train, score"),
    ("harness", 5, ("kvbench.harness", "kvbench.testing"), "measuring a vLLM server; the fake server"),
    ("analysis", 5, ("kvbench.analysis",), "reading records and judging them: verdict, compare, claims, history"),
    ("dashboards", 6, ("kvbench.dashboards",), "the pages over records and the analysis"),
    ("orchestration", 7, ("kvbench.orchestration",), "what starts runs: measure, the asv suite, the nightly"),
    ("cli", 8, ("kvbench.cli",), "the kvbench command: the app, its settings, one module per command"),
)
# The modules Python needs at the package's root, and their groups: the package itself, `python -m kvbench`.
ROOT_MODULES = {"kvbench": "core", "kvbench.__main__": "cli"}


def _names(module: str, prefix: str) -> bool:
    """`prefix` names `module`: the package itself or a module inside it."""
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str, layers=LAYERS) -> tuple[str, int]:
    if module in ROOT_MODULES:
        name = ROOT_MODULES[module]
        return name, next(rank for group, rank, *_ in layers if group == name)
    best = max(((len(p), name, rank) for name, rank, ps, *_ in layers for p in ps if _names(module, p)), default=None)
    assert best, f"{module} is in no layer"
    return best[1], best[2]


def back_arrows(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """Every import that breaks the layer rule, as text."""
    wrong = []
    for module, deps in sorted(graph.items()):
        group, rank = layer_of(module, layers)
        for dep in sorted(deps - _parents(module)):
            dep_group, dep_rank = layer_of(dep, layers)
            if dep_group != group and dep_rank >= rank:
                wrong.append(f"{module} ({group}) imports {dep} ({dep_group})")
    return wrong


def test_every_import_follows_the_layers():
    wrong = back_arrows(imports())
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_every_layer_names_modules():
    # a prefix left behind by a rename would name nothing while its successor sits in no layer
    for name, _, prefixes, _ in LAYERS:
        for prefix in prefixes:
            assert any(_names(m, prefix) for m in modules()), f"layer {name}: {prefix} names no module"


def test_every_layer_is_a_folder():
    # folder prefixes only: a group names packages (an __init__.py), never single modules or patterns
    for name, _, prefixes, _ in LAYERS:
        for prefix in prefixes:
            assert prefix in modules() and _is_package(prefix), f"layer {name}: {prefix} is no package"


def test_no_flat_module_in_kvbench():
    # kvbench/ holds folders, one per layer (or part of one); a module put directly in it has no layer
    flat = [m for m in modules() if m.count(".") == 1 and not _is_package(m) and m.startswith("kvbench.")]
    flat = [m for m in flat if m not in ROOT_MODULES and m.split(".")[1] not in ("harness", "kernels", "dashboards")]
    assert not flat, f"modules directly in kvbench/ (put each in its layer's folder): {flat}"


def test_every_module_is_in_a_layer():
    # the root modules aside, every module's name starts with a layer's folder
    homeless = [
        m for m in modules() if m not in ROOT_MODULES and not any(_names(m, p) for _, _, ps, _ in LAYERS for p in ps)
    ]
    assert not homeless, homeless


def _folder(prefix: str) -> str:
    """The folder a package prefix is in the checkout (kvbench.harness.run -> harness/run/)."""
    dirs = _package_dirs()
    name = max((n for n in dirs if prefix == n or prefix.startswith(n + ".")), key=len)
    return "/".join([dirs[name], *prefix[len(name) :].split(".")[1:]]) + "/"


def layers_markdown() -> str:
    """LAYERS as the table docs/architecture/index.md and extending.md show."""
    rows = ["| Rank | Layer | Folders | What it holds |", "| ---: | --- | --- | --- |"]
    for name, rank, prefixes, what in LAYERS:
        rows.append(f"| {rank} | {name} | {', '.join(f'`{_folder(p)}`' for p in prefixes)} | {what} |")
    return "\n".join(rows)


NUMBERS = "zero one two three four five six seven eight nine ten eleven twelve".split()


@pytest.mark.parametrize("page", ["index.md", "extending.md"])
def test_the_docs_show_the_layers(page):
    # the architecture pages say what the test enforces: the table generated from LAYERS, between the markers
    text = (ROOT / "docs" / "architecture" / page).read_text()
    block = re.search(r"<!-- layers: [^\n]*-->\n(.*?)\n<!-- /layers -->", text, re.S)
    assert block, f"docs/architecture/{page} has no <!-- layers --> block"
    assert block.group(1) == layers_markdown(), f"docs/architecture/{page}: the layers table is, from LAYERS:\n" + (
        layers_markdown()
    )
    # and any count of layers in its prose is LAYERS' own
    for word in re.findall(r"\b(\w+) layers\b", text):
        if word.lower() in NUMBERS:
            assert NUMBERS.index(word.lower()) == len(LAYERS), f"docs/architecture/{page} says {word} layers"


@pytest.mark.parametrize(
    ("module", "dep"),
    [
        ("kvbench.records.schema", "kvbench.harness.run.runner"),  # the record format reaching up to the harness
        (
            "kvbench.harness.run.runner",
            "kvbench.analysis.verdict",
        ),  # a peer: the harness takes the verdict as an argument
        ("kvbench.kernels.records", "kvbench.harness.run.settings"),
        ("kvbench.specs.capacity", "kvbench.dashboards.site"),
        ("kvbench.orchestration.nightly.orchestrate", "kvbench.cli.commands.run"),
        ("kvbench.harness.run.runner", "kvbench.orchestration.measure"),
    ],
)
def test_a_planted_back_arrow_is_found(module, dep):
    graph = {m: set(d) for m, d in imports().items()}
    graph[module].add(dep)
    assert any(line.startswith(f"{module} (") and f"imports {dep} (" in line for line in back_arrows(graph))


def test_a_planted_type_only_import_counts(tmp_path, monkeypatch):
    # an import under TYPE_CHECKING is an edge like any other
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvbench.dashboards import site\n"
    path = tmp_path / "planted.py"
    path.write_text(source)
    monkeypatch.setitem(modules(), "kvbench.core.planted", path)
    imports.cache_clear()
    try:
        assert "kvbench.dashboards.site" in imports()["kvbench.core.planted"]
        assert any(line.startswith("kvbench.core.planted (core)") for line in back_arrows(imports()))
    finally:
        imports.cache_clear()


@pytest.mark.parametrize("name", ["fakeserver", "tinymodel", "tinytrain"])
def test_harness_holds_no_test_double_or_model_builder(name):
    folder = ROOT / _package_dirs()["kvbench.harness"]
    assert not list(folder.rglob(f"{name}.py")), f"harness/ has {name}.py: it belongs outside the harness"


# Sizes a reader can hold in mind: a module under 500 lines in every folder of code (the package's, scripts/ and
# asv's benchmarks/), a command module under 250 (it parses, calls the library and prints: the logic lives below
# it), a function of harness/ or kvbench/ under 80 lines and 12 parameters. A command generated from a typed
# settings model takes that one object, so its settings count once, in the model (kvbench/cli/clisettings.py).
MAX_MODULE_LINES, MAX_COMMAND_LINES, MAX_FUNCTION_LINES, MAX_PARAMETERS = 500, 250, 80, 12
CODE_FOLDERS = ("kvbench", "harness", "kernels", "dashboards", "scripts", "benchmarks")
COMMANDS = ROOT / "kvbench" / "cli" / "commands"


def _in_sized_folders(path: Path) -> bool:
    return path.relative_to(ROOT).parts[0] in ("harness", "kvbench")


def _code_files() -> list[Path]:
    """Every .py file of the code folders (the package's modules, the scripts, asv's benchmarks)."""
    found = [p for folder in CODE_FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]
    return [p for p in found if "__pycache__" not in p.parts]


def _lines(path: Path) -> int:
    return path.read_text().count("\n")


def test_the_sized_folders_are_there():
    # a folder renamed away would silently size nothing
    files = {p.relative_to(ROOT).parts[0] for p in _code_files()}
    assert files == set(CODE_FOLDERS), set(CODE_FOLDERS) - files
    assert len(list(COMMANDS.glob("*.py"))) > 10


def test_no_module_over_500_lines():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in _code_files() if (n := _lines(p)) > MAX_MODULE_LINES]
    assert not long, long


def test_no_command_module_over_250_lines():
    # kvbench/cli/commands/ is the CLI layer: what grows there is logic that belongs to the library
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in COMMANDS.rglob("*.py") if (n := _lines(p)) > MAX_COMMAND_LINES]
    assert not long, long


def test_no_function_over_80_lines_or_12_parameters():
    big = []
    for path in modules().values():
        if not _in_sized_folders(path):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
            n = len([p for p in params if p.arg not in ("self", "cls")])
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES or n > MAX_PARAMETERS:
                big.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines, {n} parameters")
    assert not big, big


def test_no_layer_imports_another_layers_private_names():
    # a layer's _names are its internals: another layer that needs one needs a public function instead
    wrong = []
    for module, path in modules().items():
        group = layer_of(module)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _resolve(module, _targets(module, node)[-1])
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if source and private and layer_of(source)[0] != group:
                wrong.append(f"{module} imports {', '.join(private)} from {source}")
    assert not wrong, "\n".join(wrong)
