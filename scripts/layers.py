"""The layer rule of docs/architecture.md, checked on a package's import graph.

Four findings, each counted on the first line printed; the script exits 1 when any count is not 0:

- upward imports: a package importing one that the declared order puts above it (or beside it, on another
  branch). The order is read from the architecture document's `a <- b <- c` lines (`c` may use `b` and `a`);
  a name with a slash (`capacity/memory`) orders the subpackages of that package the same way.
- file circles: modules that import each other, directly or through others.
- package cycles: the direct parts of one package (its subpackages and its own modules, `__init__` aside)
  whose imports, gathered part to part, form a cycle, e.g. runtime.engine <-> runtime.scheduling. A file-level
  check misses these: engine/a.py -> scheduling/b.py -> engine/c.py is no circle between files. (A cycle of
  modules alone is a file circle, and counted as one.)
- long modules: over --max-lines lines.

Every `import` counts, in a function or under TYPE_CHECKING as much as at the top: each is a dependency
a reader follows. An import names the module it loads; the parent packages' `__init__` it runs is not counted.

    python3 scripts/layers.py servegate                 # the order from docs/architecture.md
    python3 scripts/layers.py pkg --order "low <- mid <- high"
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections import defaultdict
from collections.abc import Iterable
from itertools import pairwise
from pathlib import Path

Graph = dict[str, set[str]]

_CHAIN = re.compile(r"\s*[\w/]+(\s*<-\s*[\w/]+)+\s*")
"""A line of the declared order: `contracts <- zoo <- runtime`, or `capacity/memory <- capacity/bench`."""


def find_modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the package directory root."""
    modules: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported_names(module: str, path: Path, tree: ast.Module) -> Iterable[str]:
    """Every dotted name an import statement of the module names, relative imports resolved."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                # `from . import x` in a/b.py is relative to package a; in a/__init__.py to a itself.
                drop = node.level - 1 if is_package else node.level
                anchor = anchor[: len(anchor) - drop]
                base = ".".join(anchor + ([base] if base else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(modules: dict[str, Path]) -> Graph:
    """Module -> the package's modules it imports."""
    graph: Graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        graph[module] = {name for name in imported_names(module, path, tree) if name in modules and name != module}
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def part_of(module: str, package: str) -> str | None:
    """The direct part of package (subpackage or module) that holds module; None for the package's own
    `__init__` and for modules outside it."""
    if not module.startswith(package + "."):
        return None
    return package + "." + module[len(package) + 1 :].split(".")[0]


def package_cycles(modules: dict[str, Path], graph: Graph) -> list[str]:
    """Cycles among the direct parts of each package, from the imports between their modules; each with the
    part-to-part imports that close it and one module import behind each."""
    packages = {m for m, p in modules.items() if p.name == "__init__.py"}
    found: list[str] = []
    for package in sorted(packages):
        parts: Graph = defaultdict(set)
        example: dict[tuple[str, str], str] = {}
        for source in sorted(graph):
            here = part_of(source, package)
            if here is None:
                continue
            parts.setdefault(here, set())
            for target in sorted(graph[source]):
                there = part_of(target, package)
                if there is not None and there != here:
                    parts[here].add(there)
                    example.setdefault((here, there), f"{source} -> {target}")
        for members in cycles(dict(parts)):
            if not packages.intersection(members):
                continue  # modules alone: the same cycle is a file circle, counted there
            inside = [
                f"{a.rsplit('.', 1)[1]} -> {b.rsplit('.', 1)[1]} ({example[a, b]})"
                for a in members
                for b in sorted(parts[a])
                if b in members
            ]
            found.append(" <-> ".join(members) + "".join(f"\n      {line}" for line in inside))
    return found


def parse_order(text: str, root: str) -> Graph:
    """Name -> the names it may use, from the `a <- b <- c` lines of text (closed transitively)."""
    uses: Graph = defaultdict(set)
    for line in text.splitlines():
        if not _CHAIN.fullmatch(line):
            continue
        names = [f"{root}." + word.strip().replace("/", ".") for word in line.split("<-")]
        for lower, upper in pairwise(names):
            uses[upper].add(lower)
            uses.setdefault(lower, set())
    closed: Graph = {}
    for name in uses:
        seen: set[str] = set()
        todo = list(uses[name])
        while todo:
            below = todo.pop()
            if below not in seen:
                seen.add(below)
                todo.extend(uses.get(below, ()))
        closed[name] = seen
    return closed


def upward_imports(graph: Graph, order: Graph) -> list[str]:
    """Imports from an ordered part of a package to a sibling part the order does not put below it (a sibling
    left out of the order included, so a new package must be placed before others may use it)."""
    found = []
    for source, targets in graph.items():
        for target in targets:
            for unit in order:
                package = unit.rsplit(".", 1)[0]
                here, there = part_of(source, package), part_of(target, package)
                if here == unit and there is not None and there != here and there not in order[unit]:
                    found.append(f"{source} -> {target}")
    return sorted(set(found))


def long_modules(modules: dict[str, Path], max_lines: int) -> list[str]:
    """Modules over max_lines lines, longest first."""
    sizes = sorted(((len(p.read_text(encoding="utf-8").splitlines()), m) for m, p in modules.items()), reverse=True)
    return [f"{module} ({lines} lines)" for lines, module in sizes if lines > max_lines]


def main(argv: list[str] | None = None) -> int:
    """Print the findings on the package named; 1 when there are any."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", nargs="?", default="servegate", help="the package directory")
    parser.add_argument("--order", help="`a <- b` chains, or a file holding them (default: docs/architecture.md)")
    parser.add_argument("--max-lines", type=int, default=450)
    parser.add_argument("--show", type=int, default=20, help="examples printed per finding")
    args = parser.parse_args(argv)
    root = Path(args.package).resolve()
    if not (root / "__init__.py").is_file():
        parser.error(f"{args.package} is not a package directory (no __init__.py)")
    order_text = args.order
    if order_text is None or Path(order_text).is_file():
        doc = Path(order_text) if order_text else root.parent / "docs" / "architecture.md"
        if not doc.is_file():
            parser.error(f"no order: {doc} not found; pass --order 'low <- high'")
        order_text = doc.read_text(encoding="utf-8")
    modules = find_modules(root)
    graph = import_graph(modules)
    order = parse_order(order_text, root.name)
    findings = {
        "upward imports": upward_imports(graph, order),
        "file circles": [" <-> ".join(c) for c in cycles(graph)],
        "package cycles": package_cycles(modules, graph),
        "long modules": long_modules(modules, args.max_lines),
    }
    print("; ".join(f"{name}: {len(items)}" for name, items in findings.items()))
    for name, items in findings.items():
        for item in items[: args.show]:
            print(f"  {name}: {item}")
        if len(items) > args.show:
            print(f"  {name}: ... {len(items) - args.show} more")
    return 1 if any(findings.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
