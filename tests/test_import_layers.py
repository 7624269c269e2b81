"""Structure rules for zerolite/ and triton_kernels/: no import circle (imports inside
functions and TYPE_CHECKING blocks count); no module reaching into another file's private
members (a class lives in one file, however long); no class patched from another file."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("zerolite", "triton_kernels")


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


def _trees(root: pathlib.Path) -> dict[pathlib.Path, ast.AST]:
    return {f: ast.parse(f.read_text(), str(f)) for pkg in PACKAGES for f in (root / pkg).rglob("*.py")}


def _own_privates(tree: ast.AST) -> set[str]:
    """Private names a file defines as members: `self._x = ...` and methods `def _x` of its
    classes (dunders excluded)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.AnnAssign,
                                     ast.Assign)):
                    names = [item.name] if hasattr(item, "name") else [
                        t.id for t in (item.targets if isinstance(item, ast.Assign)
                                       else [item.target]) if isinstance(t, ast.Name)]
                    out.update(n for n in names if n.startswith("_") and not n.endswith("__"))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id == "self" \
                and node.attr.startswith("_") and not node.attr.endswith("__"):
            out.add(node.attr)
    return out


TORCH_PRIVATES = {"_buffers", "_parameters", "_modules", "_non_persistent_buffers_set"}
"""nn.Module's own private dicts, which module-walking code reads (torch's, not ours)."""


def private_reaches(root: pathlib.Path = ROOT) -> list[str]:
    """`obj._x` where `_x` is a private member of a class of ours defined only in another
    package (directory), and `from zerolite.pkg.m import _x` from another package. Within
    one package (e.g. checkpoint/ and its `_dist.py`) private names are shared on purpose."""
    trees = _trees(root)
    owners: dict[str, set[pathlib.Path]] = {}
    for f, tree in trees.items():
        for name in _own_privates(tree):
            owners.setdefault(name, set()).add(f.parent)
    found = []
    for f, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in owners \
                    and node.attr not in TORCH_PRIVATES and f.parent not in owners[node.attr] \
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{f.relative_to(root)}:{node.lineno}: .{node.attr}")
            elif isinstance(node, ast.ImportFrom) and node.module \
                    and node.module.split(".")[0] in PACKAGES:
                src = root.joinpath(*node.module.split("."))
                if src.parent == f.parent or src == f.parent:
                    continue
                for a in node.names:
                    if a.name.startswith("_") and not a.name.endswith("__"):
                        found.append(f"{f.relative_to(root)}:{node.lineno}: import {a.name}")
    return found


def class_patches(root: pathlib.Path = ROOT) -> list[str]:
    """`Cls.attr = ...` / `setattr(Cls, ...)` in a file where `Cls` is a class of ours
    imported from another file."""
    trees = _trees(root)
    classes = {f: {n.name for n in ast.walk(t) if isinstance(n, ast.ClassDef)}
               for f, t in trees.items()}

    def defines_class(module: str, name: str) -> bool:
        base = root.joinpath(*module.split("."))
        return any(name in classes.get(p, ()) for p in (base.with_suffix(".py"),
                                                         base / "__init__.py"))

    found = []
    for f, tree in trees.items():
        imported = {a.asname or a.name for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.module
                    and node.module.split(".")[0] in PACKAGES
                    for a in node.names if defines_class(node.module, a.name)}
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id == "setattr" and node.args:
                targets = [ast.Attribute(value=node.args[0], attr="?", lineno=node.lineno)]
            for t in targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                        and t.value.id in imported:
                    found.append(f"{f.relative_to(root)}:{node.lineno}: {t.value.id}.{t.attr}")
    return found


def test_no_reach_into_another_files_privates():
    """Cohesive classes may be long (FSDP2's _fsdp_param.py is ~1,000 lines); what is not
    allowed is splitting one across files that then use each other's private members."""
    found = private_reaches()
    assert not found, "private members used from another file:\n" + "\n".join(found)


def test_no_class_patched_from_another_file():
    found = class_patches()
    assert not found, "classes patched from another file:\n" + "\n".join(found)


def test_checkers_find_reaches_and_patches(tmp_path):
    pkg = tmp_path / "zerolite"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "sub").mkdir()
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("class A:\n    def __init__(self):\n        self._n = 1\n"
                              "    def _step(self):\n        return self._n\n"
                              "def _helper():\n    pass\n")
    (pkg / "b.py").write_text("from zerolite.sub.a import A, _helper\n"
                              "def f(a):\n    return a._n + a._step()\n"
                              "A.extra = 1\n")
    (tmp_path / "triton_kernels").mkdir()
    assert private_reaches(tmp_path) == ["zerolite/b.py:1: import _helper",
                                         "zerolite/b.py:3: ._n", "zerolite/b.py:3: ._step"] \
        or sorted(private_reaches(tmp_path)) == sorted(["zerolite/b.py:1: import _helper",
                                                        "zerolite/b.py:3: ._n",
                                                        "zerolite/b.py:3: ._step"])
    assert class_patches(tmp_path) == ["zerolite/b.py:4: A.extra"]
