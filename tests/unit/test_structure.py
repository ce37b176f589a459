"""Import structure of the kvbench package, read with `ast` (nothing is imported).

Every module under the folders setup.py maps (kvbench/, harness/, kernels/, dashboards/) is parsed; its
imports, top-level and inside functions, absolute and relative, are resolved to modules of the package.
A cycle makes import order matter and hides which layer owns what; the capacity model (kvbench's own
modules other than commands, CLI and orchestration) must stand without the measurement harness, so that
it can be used and tested without vLLM's client side; and harness/ holds the harness only, not the test
double or the model builders.
"""

from __future__ import annotations

import ast
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


def _type_checking_imports(tree: ast.Module) -> list[ast.AST]:
    """Imports under `if TYPE_CHECKING:`: annotations only, never executed, so they make no runtime cycle."""
    blocks = [n for n in ast.walk(tree) if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)]
    return [node for block in blocks for stmt in block.body for node in ast.walk(stmt)]


@cache
def imports() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its body (functions included)."""
    graph = {}
    for module, path in modules().items():
        deps = set()
        tree = ast.parse(path.read_text(), str(path))
        typing_only = {id(n) for n in _type_checking_imports(tree)}
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)) or id(node) in typing_only:
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
    assert {"kvbench.cli", "kvbench.harness.runner", "kvbench.kernels", "kvbench.dashboards"} <= set(modules())
    assert "kvbench.harness.server" in imports()["kvbench.harness.runner"]


def test_no_import_cycles():
    # a package's __init__ importing its own submodules is not a cycle of the submodule (Python runs the
    # __init__ first either way), so edges from a module to its enclosing packages are left out
    graph = {m: {d for d in deps if d not in _parents(m)} for m, deps in imports().items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


# The rule for kvbench/ (not harness/, kernels/, dashboards/): the capacity model and the code it shares with
# the harness (formats, units, stats, scrub, logparse, front, evaltasks, corpus, ...) import no kvbench.harness
# module, so that it runs and is tested without the harness and never changes because the harness did; what
# both need lives in kvbench/ and the harness imports it from there. The exceptions, each with why:
MAY_IMPORT_HARNESS = (
    "kvbench.commands",  # the CLI's subcommands: they drive the harness
    "kvbench.cli",  # the entry point that dispatches to them
    "kvbench.clisettings",  # builds the run command's flags from the harness's RunSettings
    "kvbench.nightly",  # orchestration of many harness runs
    "kvbench.suite",  # the run/eval suite the commands and the asv benchmarks execute
    "kvbench.asvrun",  # asv's runner: runs the suite and reads what it recorded
    "kvbench.progress",  # the live display of a run: implements the runner's Reporter
    "kvbench.tinymodel.train",  # a build tool: its report measures the trained model with the harness's tinyeval
)
# Modules that read run records and judge them: they may import the record format, which harness/records/
# defines (with the finding kinds, failure modes and repeat statistics that records carry), and nothing else
# of the harness. Moving the record format under kvbench/ would let this list go.
READS_RECORDS = ("kvbench.claims", "kvbench.compare", "kvbench.history", "kvbench.verdict")
RECORD_FORMAT = ("kvbench.harness.record", "kvbench.harness.findings", "kvbench.harness.failuremodes")
RECORD_FORMAT += ("kvbench.harness.repeats",)


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    """`module` is one of `prefixes` or inside one; a prefix ending in a partial name matches its variants
    (kvbench.verdict covers kvbench.verdict_speed, kvbench.harness.record covers records and any split of it)."""
    return any(module.startswith(p) for p in prefixes)


def _harness_imports_allowed(module: str, dep: str) -> bool:
    if any(module == a or module.startswith(a + ".") for a in MAY_IMPORT_HARNESS):
        return True
    return _under(module, READS_RECORDS) and _under(dep, RECORD_FORMAT)


def test_capacity_model_does_not_import_the_harness():
    harness_layers = ("kvbench.harness", "kvbench.kernels", "kvbench.dashboards")
    own = [m for m in imports() if m.startswith("kvbench.") and not m.startswith(harness_layers)]
    wrong = sorted(
        f"{m} imports {d}"
        for m in own
        for d in imports()[m]
        if (d == "kvbench.harness" or d.startswith("kvbench.harness.")) and not _harness_imports_allowed(m, d)
    )
    assert not wrong, "the capacity model imports the harness:\n" + "\n".join(wrong)


def test_the_exceptions_still_exist():
    # an allowance for a module that was renamed or removed would silently allow its successor nothing
    # (or, worse, a new module of the same name everything): each must name a module of the package
    for name in (*MAY_IMPORT_HARNESS, *READS_RECORDS):
        assert any(m == name or m.startswith(name) for m in modules()), f"{name} is not a kvbench module"


@pytest.mark.parametrize("name", ["fakeserver", "tinymodel", "tinytrain"])
def test_harness_holds_no_test_double_or_model_builder(name):
    folder = ROOT / _package_dirs()["kvbench.harness"]
    assert not list(folder.rglob(f"{name}.py")), f"harness/ has {name}.py: it belongs outside the harness"


# Sizes a reader can hold in mind: a module of harness/ or kvbench/ under 500 lines, a function under 80 lines
# and 12 parameters. A command generated from a typed settings model takes that one object, so its settings
# count once, in the model (kvbench/clisettings.py).
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_PARAMETERS = 500, 80, 12


def _in_sized_folders(path: Path) -> bool:
    return path.relative_to(ROOT).parts[0] in ("harness", "kvbench")


def test_no_module_over_500_lines():
    long = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for path in modules().values()
        if _in_sized_folders(path) and (n := path.read_text().count("\n")) > MAX_MODULE_LINES
    ]
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
