"""The shape of the code base: import layering, no import cycles, file sizes, self-contained texts.

The import graph is built with ``ast`` from every ``.py`` file under ``sedd/`` and ``server/``.
Every import statement counts, including function-local, ``TYPE_CHECKING`` and relative ones.
``from a.b import c`` points at module ``a.b.c`` when that is a module, else at ``a.b``. An edge
from a module to one of its own ancestor packages (``sedd.engine.core`` -> ``sedd.engine``) is
ignored: Python has already started importing those before the module runs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sedd", "server")
MAX_LINES = 400
CLI_MODULES = ("sedd.cli", "sedd.commands")
OUTSIDE_POINTERS = ("../shared", "shared/PRECISION", "FIELD.md", "PRECISION.md")


@dataclass
class ImportGraph:
    """Modules (name -> file) and, per module, every module name its import statements reach."""

    files: dict[str, Path] = field(default_factory=dict)
    imports: dict[str, set[str]] = field(default_factory=dict)  # may name external modules

    def edges(self, module: str) -> set[str]:
        """The project modules ``module`` imports, without itself and its ancestor packages."""
        return {
            target
            for target in self.imports[module]
            if target in self.files and not _is_within(module, target)
        }


def _is_within(name: str, prefix: str) -> bool:
    """``name`` is ``prefix`` or one of its submodules (``a.b`` is within ``a``, ``ab`` is not)."""
    return name == prefix or name.startswith(prefix + ".")


def module_name(path: Path, root: Path) -> str:
    """``sedd/engine/core.py`` -> ``sedd.engine.core``; ``sedd/__init__.py`` -> ``sedd``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _python_files(root: Path, packages: Iterable[str]) -> Iterator[Path]:
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path


def _imported_names(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """Every module name the import statements in ``tree`` resolve to."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _from_base(node, module, is_package)
            for alias in node.names:
                candidate = f"{base}.{alias.name}" if base else alias.name
                names.add(candidate if alias.name != "*" and candidate in known else base)
    names.discard("")
    return names


def _from_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module a ``from ... import`` statement imports from."""
    if node.level == 0:
        return node.module or ""
    package = module.split(".") if is_package else module.split(".")[:-1]
    anchor = package[: len(package) - node.level + 1]
    return ".".join([*anchor, node.module] if node.module else anchor)


def build_import_graph(root: Path, packages: Iterable[str] = PACKAGES) -> ImportGraph:
    graph = ImportGraph()
    for path in _python_files(root, packages):
        graph.files[module_name(path, root)] = path
    known = set(graph.files)
    for module, path in graph.files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph.imports[module] = _imported_names(tree, module, path.name == "__init__.py", known)
    return graph


def strongly_connected_components(
    nodes: Iterable[str], edges: dict[str, set[str]]
) -> list[list[str]]:
    """Tarjan's algorithm, iterative (no recursion limit on long import chains)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(nodes):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = []
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        work.append((start, iter(sorted(edges.get(start, ())))))
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def import_cycles(graph: ImportGraph) -> list[list[str]]:
    """Groups of project modules that (directly or indirectly) import each other."""
    edges = {module: graph.edges(module) for module in graph.files}
    components = strongly_connected_components(graph.files, edges)
    return [component for component in components if len(component) > 1]


def _describe_cycles(graph: ImportGraph, cycles: list[list[str]]) -> str:
    lines = []
    for members in cycles:
        inside = set(members)
        arrows = ", ".join(
            f"{source} -> {target}"
            for source in members
            for target in sorted(graph.edges(source) & inside)
        )
        lines.append(f"  cycle {{{', '.join(members)}}}: {arrows}")
    return "\n".join(lines)


def _violations(graph: ImportGraph, sources: Iterable[str], forbidden: Iterable[str]) -> list[str]:
    banned = tuple(forbidden)
    return [
        f"{source} ({graph.files[source].relative_to(ROOT)}) imports {target}"
        for source in sorted(sources)
        for target in sorted(graph.imports[source])
        if any(_is_within(target, prefix) for prefix in banned)
    ]


def _product_graph() -> ImportGraph:
    graph = build_import_graph(ROOT)
    assert "sedd" in graph.files and "server" in graph.files, "the walker found no packages"
    return graph


def test_walker_reports_a_cycle_made_of_function_local_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f() -> None:\n    from pkg import b\n")
    (pkg / "b.py").write_text("def g() -> None:\n    from . import a\n")
    # Ancestor edges are ignored, so these two are not a cycle.
    (pkg / "sub" / "__init__.py").write_text("from .leaf import x\n")
    (pkg / "sub" / "leaf.py").write_text("import pkg.sub\nfrom .. import a\nx = 1\n")
    graph = build_import_graph(tmp_path, ["pkg"])
    assert set(graph.files) == {"pkg", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.leaf"}
    assert graph.edges("pkg.a") == {"pkg.b"}
    assert graph.edges("pkg.b") == {"pkg.a"}
    assert graph.edges("pkg.sub") == {"pkg.sub.leaf"}
    assert graph.edges("pkg.sub.leaf") == {"pkg.a"}
    assert import_cycles(graph) == [["pkg.a", "pkg.b"]]


def test_import_graph_has_no_cycles() -> None:
    graph = _product_graph()
    assert sum(len(graph.edges(m)) for m in graph.files) > len(graph.files), "too few edges found"
    cycles = import_cycles(graph)
    assert not cycles, f"{len(cycles)} import cycle(s):\n{_describe_cycles(graph, cycles)}"


def test_server_never_imports_the_cli() -> None:
    graph = _product_graph()
    server = [m for m in graph.files if _is_within(m, "server")]
    bad = _violations(graph, server, CLI_MODULES)
    assert not bad, "the server imports the CLI:\n" + "\n".join(bad)


def test_library_never_imports_the_cli_or_server() -> None:
    graph = _product_graph()
    library = [
        m
        for m in graph.files
        if _is_within(m, "sedd") and not any(_is_within(m, cli) for cli in CLI_MODULES)
    ]
    bad = _violations(graph, library, (*CLI_MODULES, "server"))
    assert not bad, "the library imports the CLI or the server:\n" + "\n".join(bad)


def test_no_product_module_is_over_400_lines() -> None:
    counts = {
        path.relative_to(ROOT): len(path.read_text(encoding="utf-8").splitlines())
        for path in _python_files(ROOT, PACKAGES)
    }
    assert counts, "no product modules found"
    over = sorted((n, str(path)) for path, n in counts.items() if n > MAX_LINES)
    listing = "\n".join(f"  {path}: {n} lines" for n, path in reversed(over))
    assert not over, f"{len(over)} module(s) over {MAX_LINES} lines:\n{listing}"


def _product_texts() -> Iterator[Path]:
    for folder in ("sedd", "server", "scripts", "slurm", "docs"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                yield path
    yield ROOT / "README.md"
    yield from sorted((ROOT / "models").rglob("README.md"))


def test_product_texts_do_not_point_outside_the_repository() -> None:
    found = []
    scanned = 0
    for path in _product_texts():
        scanned += 1
        lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
        for number, line in enumerate(lines, start=1):
            hits = [p for p in OUTSIDE_POINTERS if p in line]
            if hits:
                found.append(f"  {path.relative_to(ROOT)}:{number}: {', '.join(hits)}")
    assert scanned > 10, "too few product files scanned"
    assert not found, "texts that point outside the repository:\n" + "\n".join(found)


def test_every_name_scripts_and_tests_import_from_the_library_exists() -> None:
    """``scripts/`` run outside pytest (SLURM jobs, benchmarks): a moved name must fail here."""
    import importlib

    missing = []
    for path in sorted([*(ROOT / "scripts").glob("*.py"), *(ROOT / "tests").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or node.level or not node.module:
                continue
            if node.module.split(".")[0] not in PACKAGES:
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name) and not _is_submodule(node.module, alias.name):
                    missing.append(f"{path.relative_to(ROOT)}: {node.module}.{alias.name}")
    assert not missing, "imports of names that do not exist:\n" + "\n".join(missing)


def _is_submodule(package: str, name: str) -> bool:
    return (ROOT / package.replace(".", "/") / f"{name}.py").is_file()


def test_sedd_holds_role_packages_and_six_modules() -> None:
    """The top floor: the front doors, the offline driver every API and CLI call runs on
    (``run``), the vocabulary and the precision policy; everything else lives in a package named
    for its role (models/, diffusion/, io/, engine/, shards/, ...)."""
    top = sorted(p.name for p in (ROOT / "sedd").glob("*.py"))
    assert top == ["__init__.py", "api.py", "cli.py", "defaults.py", "precision.py", "run.py"]
    packages = {p.name for p in (ROOT / "sedd").iterdir() if (p / "__init__.py").exists()}
    assert {"models", "diffusion", "io", "engine", "checkpoints", "shards"} <= packages


def test_server_builds_requests_from_sedd_request_never_the_offline_driver() -> None:
    """The server runs its own engine thread: it never reaches the offline driver or shards."""
    graph = _product_graph()
    reached = {
        (module, target)
        for module in graph.files
        if _is_within(module, "server")
        for target in graph.edges(module)
        if _is_within(target, "sedd.shards") or _is_within(target, "sedd.run")
    }
    assert reached == set(), reached
    requests = {t for m in graph.files if _is_within(m, "server") for t in graph.edges(m)}
    assert "sedd.request.plan" in requests


def test_tests_mirror_the_packages() -> None:
    """Each test folder is named for a package of sedd/ (or server/); helpers sit apart."""
    packages = {p.name for p in (ROOT / "sedd").iterdir() if (p / "__init__.py").exists()}
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders - {"data", "helpers"} <= packages | {"server"}
    assert not [p for p in (ROOT / "tests" / "helpers").glob("test_*.py")]
