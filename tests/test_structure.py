"""The package's shape is checked, not hoped for (docs/architecture.md): its layers
import only downwards, no import cycles, the floors above the API reach the simulation
only through it, nothing below the API prints, no module above the hard limit on
length, type hints on every public function.

Read from the source with `ast` (nothing is imported): an import counts wherever it is
written, inside a function and under `if TYPE_CHECKING:` too (a type is a dependency
as much as a call)."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "pipesim"
MAX_LINES = 450  # the house style's hard limit (about 400 is the aim)
# Modules above the limit while their split is under way: each may not grow, and its
# entry goes when it is split.
SPLIT_PENDING: dict[str, int] = {}  # none now (the corpus report moved to calibrate/corpus_report.py)

# The layers, lowest first (docs/architecture.md): a module imports its own layer's
# modules and the layers below, never one above; explore and calibrate share a floor
# and neither imports the other.
LAYERS = (
    ("base",),
    ("inputs",),
    ("profiles",),
    ("costs",),
    ("engines",),
    ("scenario",),
    ("measure",),
    ("sim",),
    ("report",),
    ("api",),
    ("explore", "calibrate"),
    ("cli",),
)
FLOOR = {layer: i for i, names in enumerate(LAYERS) for layer in names}
# pipesim itself (its lazy exports), the data packages and the entry points sit outside the floors
OUTSIDE = {"pipesim", "pipesim.data"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module: at the top, inside functions, and under
    `if TYPE_CHECKING:`."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def layer_of(module: str) -> str | None:
    """The layer a module of the package sits on (None: outside the floors)."""
    if module in OUTSIDE or module.startswith("pipesim.data."):
        return None
    return module.split(".")[1]


def imported_modules(name: str, path: Path) -> set[str]:
    """The package's modules that module `name` imports. `from X import y` names the
    module X.y when that is a module, else X."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in MODULES else stem for a in node.names]
        out.update(t for t in targets if t in MODULES and t != name)
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (a list of modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imports_under_type_checking_and_in_functions_count():
    tree = ast.parse(
        "import a\nif TYPE_CHECKING:\n    import b\nelse:\n    import c\ndef f():\n    import d\n"
    )
    assert sorted(a.name for n in import_nodes(tree) for a in n.names) == ["a", "b", "c", "d"]


GRAPH = {name: imported_modules(name, path) for name, path in MODULES.items()}


def test_no_import_cycles():
    assert sum(len(v) for v in GRAPH.values()) > len(GRAPH)  # the walk sees the imports
    assert "pipesim.costs.stage" in GRAPH["pipesim.sim.simulation"]
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_every_module_sits_on_a_layer():
    floors = {layer_of(m) for m in MODULES} - {None}
    assert floors == set(FLOOR), f"without a floor: {floors - set(FLOOR)}; no code: {set(FLOOR) - floors}"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports that climb: to a higher floor, or across one (explore <-> calibrate)."""
    bad = []
    for name, deps in graph.items():
        a = layer_of(name)
        for dep in deps:
            b = layer_of(dep)
            if a is None or b is None or a == b:
                continue
            if FLOOR[b] >= FLOOR[a]:
                bad.append(f"{name} ({a}) imports {dep} ({b})")
    return sorted(bad)


def test_the_layer_check_sees_an_upward_import():
    graph = {
        "pipesim.costs.stage": {"pipesim.sim.pipeline", "pipesim.inputs.box"},
        "pipesim.explore.sweep": {"pipesim.calibrate.fit", "pipesim.api"},
    }
    assert upward_imports(graph) == [
        "pipesim.costs.stage (costs) imports pipesim.sim.pipeline (sim)",
        "pipesim.explore.sweep (explore) imports pipesim.calibrate.fit (calibrate)",
    ]


def test_layers_import_only_downwards():
    bad = upward_imports(GRAPH)
    assert not bad, f"{len(bad)} import(s) against the layer order:\n" + "\n".join(bad)


# The floors above the API reach the simulation only through api.py, so one prediction
# is put together in one place (build, run, intervals) whoever asks for it.
THROUGH_THE_API = ("explore", "calibrate", "cli")


def around_the_api(graph: dict[str, set[str]]) -> list[str]:
    """Imports of the simulation (pipesim.sim) from a floor that must go through api.py."""
    return sorted(
        f"{name} imports {dep}"
        for name, deps in graph.items()
        if layer_of(name) in THROUGH_THE_API
        for dep in deps
        if layer_of(dep) == "sim"
    )


def test_the_api_check_sees_a_way_around_it():
    graph = {
        "pipesim.explore.sweep": {"pipesim.sim.runner", "pipesim.api"},
        "pipesim.cli.single": {"pipesim.api"},
        "pipesim.report.trace": {"pipesim.sim.runner"},  # below the API: its own business
    }
    assert around_the_api(graph) == ["pipesim.explore.sweep imports pipesim.sim.runner"]


def test_explore_calibrate_and_the_cli_reach_the_simulation_through_the_api():
    assert "pipesim.api" in GRAPH["pipesim.cli.single"] and "pipesim.api" in GRAPH["pipesim.explore.sweep"]
    bad = around_the_api(GRAPH)
    assert not bad, "the simulation reached around api.py:\n" + "\n".join(bad)


def writes_output(tree: ast.AST) -> list[int]:
    """Lines that print: print(), sys.stdout / sys.stderr writes, click.echo / secho."""
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "print":
            lines.append(node.lineno)
        elif isinstance(f, ast.Attribute):
            owner = f.value
            if f.attr in ("echo", "secho") and isinstance(owner, ast.Name) and owner.id == "click":
                lines.append(node.lineno)
            elif (
                f.attr == "write"
                and isinstance(owner, ast.Attribute)
                and owner.attr in ("stdout", "stderr")
                and isinstance(owner.value, ast.Name)
                and owner.value.id == "sys"
            ):
                lines.append(node.lineno)
    return sorted(lines)


def test_the_print_check_sees_prints():
    tree = ast.parse("print(1)\nimport sys\nsys.stderr.write('x')\nclick.echo('y')\nlog.write('z')\n")
    assert writes_output(tree) == [1, 3, 4]


def test_nothing_below_the_api_prints():
    """Modules below api.py return values and raise errors or warnings: the command
    line (and the explore and calibrate commands it runs) decides what reaches a
    terminal."""
    bad = [
        f"{name}:{line}"
        for name, path in MODULES.items()
        if layer_of(name) is not None and FLOOR[layer_of(name)] < FLOOR["api"]
        for line in writes_output(ast.parse(path.read_text()))
    ]
    assert not bad, "output written below the API: " + ", ".join(bad)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_length(name):
    lines = len(MODULES[name].read_text().splitlines())
    limit = max(MAX_LINES, SPLIT_PENDING.get(name, 0))
    assert lines <= limit, f"{name}: {lines} lines, above the limit of {limit}; split it by concept"


def public_functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Module-level functions and the methods of public classes (nested ones too),
    whose names have no leading underscore."""
    out = []

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                out.append((prefix + node.name, node))
            elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.If) and not is_type_checking(node.test):
                walk(node.body + node.orelse, prefix)

    walk(tree.body, "")
    return out


def missing_hints(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> list[str]:
    a = fn.args
    params = a.posonlyargs + a.args
    if (
        method
        and params
        and not any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
    ):
        params = params[1:]  # self or cls
    params = params + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p is not None]
    out = [p.arg for p in params if p.annotation is None]
    if fn.returns is None:
        out.append("return")
    return out


def test_public_functions_have_type_hints():
    bad = []
    for name, path in MODULES.items():
        for qual, fn in public_functions(ast.parse(path.read_text(), str(path))):
            if missing := missing_hints(fn, "." in qual):
                bad.append(f"{name}.{qual}: {', '.join(missing)}")
    assert not bad, f"{len(bad)} public function(s) lack type hints:\n" + "\n".join(bad)


def test_the_hint_check_sees_missing_hints():
    tree = ast.parse(
        "def f(a, b: int, *c, d: int = 1, **e) -> None: ...\n"
        "def g(x: int): ...\n"
        "def _h(x): ...\n"
        "class K:\n    def m(self, y) -> int: ...\n    @staticmethod\n    def s(z) -> int: ...\n"
    )
    got = {q: missing_hints(fn, "." in q) for q, fn in public_functions(tree)}
    assert got == {"f": ["a", "c", "e"], "g": ["return"], "K.m": ["y"], "K.s": ["z"]}
