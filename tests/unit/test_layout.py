"""The package's layout: no import circles, no two modules with one name, a public API that agrees with itself."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "nvrm"


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """Every nvrm module ``path`` imports, at module level or inside functions (deferred imports count)."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("nvrm")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("nvrm"):
                out.add(target)
                out |= {f"{target}.{a.name}" for a in node.names}
    return out


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    g = {}
    for name, path in modules.items():
        g[name] = {t for t in imports(path) if t in modules and t != name}
    return g


def test_no_import_circles():
    g = graph()
    # a package's __init__ importing its own submodules is how packages work; everything else must be acyclic
    edges = {m: {t for t in ts if not (m == t.rsplit(".", 1)[0] and (SRC / m.replace(".", "/").removeprefix("nvrm/") / "__init__.py").exists())} for m, ts in g.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(m, stack):
        state[m] = 1
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack + [t])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles[:5])


def test_no_two_modules_share_a_file_name():
    names = Counter(p.name for p in SRC.rglob("*.py") if p.name not in ("__init__.py", "config.py"))
    assert not [n for n, k in names.items() if k > 1], [n for n, k in names.items() if k > 1]


def test_the_forward_imports_nothing_of_preprocessing():
    g = graph()
    forward = [m for m in g if m.startswith("nvrm.forward")]
    assert forward
    for m in forward:
        bad = sorted(t for t in g[m] if t.startswith(("nvrm.engine", "nvrm.video", "nvrm.inputs", "nvrm.prompt")))
        assert not bad, f"{m} imports {bad}"


def test_the_scoring_library_never_imports_the_server_trainer_or_ray():
    g = graph()
    library = [m for m in g if m.startswith(("nvrm.scoring", "nvrm.forward", "nvrm.engine", "nvrm.inputs", "nvrm.video", "nvrm.bundle"))]
    for m in library:
        bad = sorted(t for t in g[m] if t.startswith(("nvrm.serve", "nvrm.train", "nvrm.jobs.ray_runner")))
        assert not bad, f"{m} imports {bad}"


def test_the_public_api_agrees_with_itself():
    import nvrm

    tree = ast.parse((SRC / "__init__.py").read_text())
    typed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                typed |= {a.asname or a.name for a in imp.names}
    eager = {n for n in nvrm.__all__ if n not in nvrm._LAZY}
    assert set(nvrm._LAZY) <= set(nvrm.__all__)
    assert typed == set(nvrm._LAZY), typed ^ set(nvrm._LAZY)
    for name in nvrm.__all__:
        assert getattr(nvrm, name) is not None, name  # every lazy name resolves to its module's object
    for name in eager:
        assert name in vars(nvrm), name


def test_the_central_classes_stay_small():
    """RewardModel and the service's Scheduler hold one concern each (loading, streaming, the forward and
    the execution of work live elsewhere); under 250 lines keeps them readable."""
    sizes = {}
    for rel in ("scoring.py", "serve/scheduler.py", "serve/execution.py", "forward/runtime.py"):
        for node in ast.parse((SRC / rel).read_text()).body:
            if isinstance(node, ast.ClassDef):
                sizes[node.name] = node.end_lineno - node.lineno + 1
    assert sizes["RewardModel"] < 250 and sizes["Scheduler"] < 250, sizes
