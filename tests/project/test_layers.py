"""The house rules of the package layout, read from the source (every import, also those inside
functions):

* the core (``jaxgossip`` outside ``run`` and ``cli``) imports nothing from ``jaxgossip.run`` or
  ``jaxgossip.cli``, and ``jaxgossip.run`` nothing from ``jaxgossip.cli``;
* the rooms stand on floors (:data:`FLOORS`): a room imports only rooms of lower floors (the kernels
  in ``ops`` never import an algorithm, the engine never a configuration, ...);
* no import cycles between modules (a package's ``__init__`` counts as a module: importing a name
  re-exported there imports the ``__init__``);
* no module imports another module's ``_private`` names.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "jaxgossip"


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not is_package(importer):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (annotations only)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            yield from (n for child in node.orelse for n in [child, *runtime_nodes(child)])
            continue
        yield node
        yield from runtime_nodes(node)


def imports(name: str):
    """(imported module, names taken from it) for every jaxgossip import of module ``name`` that
    runs (imports under ``if TYPE_CHECKING:`` serve annotations only and are left out)."""
    tree = ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))
    for node in runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "jaxgossip":
                    yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            target = resolve(name, node)
            if target.split(".")[0] != "jaxgossip":
                continue
            plain = []
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in MODULES:  # `from package import module`
                    yield sub, ()
                else:
                    plain.append(alias.name)
            if plain or not node.names:
                yield target, tuple(plain)


def graph() -> dict[str, set[str]]:
    edges = {}
    for name in MODULES:
        edges[name] = {target for target, _ in imports(name) if target in MODULES and target != name}
    return edges


def layer(name: str) -> str:
    for edge in ("jaxgossip.cli", "jaxgossip.run"):
        if name == edge or name.startswith(edge + "."):
            return edge
    return "core"


# The rooms of the package, lowest floor first; a room may import its own modules and rooms of lower
# floors only. "jaxgossip" is the package's public surface (its __init__), which gathers the rooms.
FLOORS = (
    ("types", "checks", "configs"),
    ("compress", "topology", "models"),
    ("ops",),
    ("algorithms", "data"),
    ("sim",),
    ("engine",),
    ("design",),
    ("jaxgossip",),
    ("run",),
    ("cli",),
)
FLOOR_OF = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


def room(name: str) -> str:
    """The room of module ``name``: its first package under jaxgossip, a root module's own name, or
    "jaxgossip" for the package's __init__."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "jaxgossip"


def test_every_room_has_a_floor_and_the_root_holds_at_most_five_modules():
    rooms = {room(name) for name in MODULES}
    assert rooms <= set(FLOOR_OF), f"rooms without a floor in FLOORS: {sorted(rooms - set(FLOOR_OF))}"
    root = sorted(name for name in MODULES if name.count(".") == 1 and not is_package(name))
    assert len(root) <= 5, f"modules at the package root: {root}"


def test_rooms_import_only_lower_floors():
    bad = sorted(
        f"{name} -> {target}"
        for name, targets in graph().items()
        for target in targets
        if room(target) != room(name) and FLOOR_OF[room(target)] >= FLOOR_OF[room(name)]
    )
    assert not bad, f"imports of a room on the same or a higher floor: {bad}"


def test_every_import_names_an_existing_module():
    missing = sorted(
        f"{name} imports {target}"
        for name in MODULES
        for target, _ in imports(name)
        if target not in MODULES
    )
    assert not missing, missing


@pytest.mark.parametrize(
    "lower, forbidden",
    [("core", ("jaxgossip.run", "jaxgossip.cli")), ("jaxgossip.run", ("jaxgossip.cli",))],
)
def test_lower_layers_do_not_import_higher_ones(lower, forbidden):
    bad = sorted(
        f"{name} -> {target}"
        for name, targets in graph().items()
        if layer(name) == lower
        for target in targets
        if layer(target) in forbidden
    )
    assert not bad, f"{lower} must not import {forbidden}: {bad}"


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    cycles = find_cycles(graph())
    assert not cycles, f"import cycles: {cycles}"


def test_cycle_finder_sees_a_cycle_through_a_package_init():
    edges = {"p": {"p.a"}, "p.a": {"p.b"}, "p.b": {"p"}, "q": set()}
    assert find_cycles(edges) == [["p", "p.a", "p.b"]]


def test_no_private_names_imported_across_modules():
    bad = sorted(
        f"{name} takes {names} from {target}"
        for name in MODULES
        for target, names in imports(name)
        if any(n.startswith("_") and not n.startswith("__") for n in names)
    )
    assert not bad, bad
