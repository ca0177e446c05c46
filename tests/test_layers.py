"""The layers stay one-way: a test over the project's import graph.

Every ``import`` and ``from ... import`` in the project's packages (imports
inside functions too; relative imports resolved) is an edge from the
importing module to the module it names. The rules, from DESIGN.md:

  - ``storage`` imports nothing of ours: it knows no network and no metadata;
  - ``protocol`` (what every part speaks: wire format, errors, partition
    names, the partitioner) imports nothing of ours but ``storage``;
  - ``kraft`` (the control plane) never imports ``api``, ``bench``,
    ``chaos`` or ``spark_source``;
  - the broker (``api.broker``, ``api.node``) never imports the client
    (``api.client``) or the CLI;
  - the client (``api.client``) imports nothing of ours but ``protocol`` and
    ``storage.batch`` (the shared batch format): nothing of ``kraft``,
    nothing of ``api.broker``;
  - ``spark_source`` and ``chaos`` use only the public client, the CLI,
    ``protocol`` and HTTP, never broker or controller internals;
  - ``bench`` (the benchmarks) may use anything: it measures every layer;
  - nothing imports a private name (``_x``) from outside the package that
    owns it (``api.client._transport`` is ``api.client``'s own);
  - no import cycle among modules.

There is no list of exceptions: an arrow the wrong way is fixed, not
allowed. The rules themselves are tested on planted edges, so a rule that
stopped matching would fail too.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("storage", "protocol", "kraft", "api", "spark_source", "chaos", "bench")


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def import_edges(path: pathlib.Path) -> list[tuple[str, str, int]]:
    """``(importer, imported, line)`` for every import of one of our
    packages in the file at ``path``; ``from m import n`` names ``m.n`` when
    ``n`` is a module, else ``m`` (and the private-name check sees ``n``)."""
    importer = module_name(path)
    package = importer if path.name == "__init__.py" else importer.rpartition(".")[0]
    edges = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                edges.append((importer, alias.name, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                target = candidate if _is_module(candidate) else base
                edges.append((importer, target, node.lineno))
                if alias.name.startswith("_") and not _is_module(candidate):
                    edges.append((importer, candidate, node.lineno))
    return [(a, b, line) for a, b, line in edges if b.split(".")[0] in PACKAGES]


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def all_edges() -> list[tuple[str, str, str]]:
    edges = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for importer, imported, line in import_edges(path):
                edges.append((importer, imported, f"{path.relative_to(ROOT)}:{line}"))
    return edges


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def violation(importer: str, imported: str) -> str | None:
    """The rule the edge breaks, or None."""
    top = imported.split(".")[0]
    if _within(importer, "storage") and top != "storage":
        return "storage imports nothing of ours"
    if _within(importer, "protocol") and top not in ("protocol", "storage"):
        return "protocol imports nothing of ours but storage"
    if _within(importer, "kraft") and top in ("api", "bench", "chaos", "spark_source"):
        return "kraft (control plane) never imports the data plane, bench, chaos or spark_source"
    if (_within(importer, "api.broker") or importer == "api.node") and (
            _within(imported, "api.client") or _within(imported, "api.cli")):
        return "the broker never imports the client or the CLI"
    if _within(importer, "api.client") and not (
            _within(imported, "api.client") or top == "protocol"
            or _within(imported, "storage.batch")):
        return "the client imports only itself, protocol and storage.batch"
    if (_within(importer, "spark_source") or _within(importer, "chaos")) and (
            _within(imported, "api.broker") or top in ("kraft", "storage")):
        return "spark_source and chaos use only the public client, CLI and HTTP"
    parts = imported.split(".")
    private = next((i for i, part in enumerate(parts) if part.startswith("_")), None)
    owner = ".".join(parts[:private]) if private is not None else ""
    if owner and not (ROOT.joinpath(*owner.split(".")) / "__init__.py").is_file():
        owner = owner.rpartition(".")[0]  # a module's private name: its package's own
    if private is not None and not _within(importer, owner):
        return "no private name is imported from outside the package that owns it"
    return None


def crossings() -> dict[tuple[str, str], str]:
    found = {}
    for importer, imported, where in all_edges():
        rule = violation(importer, imported)
        if rule is not None:
            found.setdefault((importer, imported), f"{where}: {rule}")
    return found


def test_no_import_crosses_the_layers():
    found = crossings()
    assert not found, "imports that break the layers (DESIGN.md, 'Dependency rules'):\n" + \
        "\n".join(f"  {a} -> {b}  ({why})" for (a, b), why in sorted(found.items()))


def import_cycles(edges) -> list[tuple[str, ...]]:
    """Every strongly connected set of two or more modules (Tarjan's
    algorithm, iterative), each sorted: the import cycles."""
    graph: dict[str, set[str]] = {}
    for importer, imported, *_ in edges:
        if importer != imported:
            graph.setdefault(importer, set()).add(imported)
            graph.setdefault(imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    cycles.append(tuple(sorted(members)))
    return sorted(cycles)


def test_no_import_cycle():
    cycles = import_cycles(all_edges())
    assert not cycles, "import cycles:\n" + "\n".join(f"  {' <-> '.join(c)}" for c in cycles)


def test_a_planted_cycle_is_found():
    edges = [("a.x", "a.y"), ("a.y", "a.z"), ("a.z", "a.x"), ("a.z", "a.w")]
    assert import_cycles(edges) == [("a.x", "a.y", "a.z")]


@pytest.mark.parametrize("importer, imported, rule", [
    ("storage.log", "kraft.records", "storage imports nothing"),
    ("protocol.wire", "kraft.records", "protocol imports nothing"),
    ("kraft.controller", "bench.data", "kraft (control plane)"),
    ("kraft.controller", "api.broker.partition", "kraft (control plane)"),
    ("api.broker.server", "api.client.producer", "the broker never imports"),
    ("api.client.consumer", "kraft.records", "the client imports only"),
    ("spark_source.reader", "api.broker.partition", "spark_source and chaos"),
    ("api.console", "kraft.config._parse_override", "no private name"),
    ("api.groups_cli", "api.client._transport", "no private name"),
])
def test_the_rules_catch_a_planted_crossing(importer, imported, rule):
    assert rule in (violation(importer, imported) or "")


@pytest.mark.parametrize("importer, imported", [
    ("api.broker.replication", "storage.log"),
    ("api.client.producer", "storage.batch"),
    ("api.client.producer", "protocol.partitioner"),
    ("protocol", "storage.names"),
    ("api.client.consumer", "api.client._transport"),
    ("kraft.controller", "storage.config"),
    ("chaos.checker", "api.client"),
])
def test_allowed_arrows_pass(importer, imported):
    assert violation(importer, imported) is None
