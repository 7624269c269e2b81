"""Structure rules for zerolite/ and triton_kernels/: no import circle (imports inside
functions and TYPE_CHECKING blocks count) and no source file over 400 lines."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("zerolite", "triton_kernels")
MAX_LINES = 400


def _modules(root: pathlib.Path) -> dict[str, pathlib.Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in (root / pkg).rglob("*.py"):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = f
    return mods


def import_graph(root: pathlib.Path = ROOT) -> dict[str, set[str]]:
    """module -> modules of ours it imports anywhere in its source (every `import` node).

    `from a.b import c` points at module `a.b.c` when that is a module, else at `a.b`;
    importing a submodule is not counted as importing its package's __init__ (Python runs
    it, but an edge to every parent would make everything circular through the root).
    """
    mods = _modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for mod, path in mods.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges.update(resolve(a.name) for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
                    pkg = pkg[:len(pkg) - node.level + 1]
                    base = ".".join(pkg + ([base] if base else []))
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    edges.add(sub if sub in mods else resolve(base))
        edges.discard(None)
        edges.discard(mod)
        graph[mod] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
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
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def test_no_import_circle():
    found = circles(import_graph())
    assert not found, "import circles (restructure, do not hide them):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_checker_finds_a_circle(tmp_path):
    """The checker itself: a lazy import and a TYPE_CHECKING import close a circle."""
    pkg = tmp_path / "zerolite"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("def f():\n    from zerolite.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n")
    (pkg / "sub" / "c.py").write_text("import zerolite.sub.a\n")
    (pkg / "sub" / "d.py").write_text("from zerolite.sub.a import f\n")  # not in the circle
    (tmp_path / "triton_kernels").mkdir()
    assert circles(import_graph(tmp_path)) == [["zerolite.sub.a", "zerolite.sub.b",
                                                "zerolite.sub.c"]]


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_file_over_limit(pkg):
    too_long = {}
    for f in sorted((ROOT / pkg).rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        lines = len(f.read_text().splitlines())
        if lines > MAX_LINES:
            too_long[rel] = lines
    assert not too_long, f"files over {MAX_LINES} lines: {too_long}"
