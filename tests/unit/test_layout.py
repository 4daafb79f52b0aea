"""The package's layout: no import circles, no two modules with one name, a public API that agrees with itself."""

from __future__ import annotations

import ast
import functools
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
                subs = {a.name for a in node.names if _is_module(f"{target}.{a.name}")}
                if len(subs) < len(node.names):  # a name defined in the module (or package __init__) itself
                    out.add(target)
                out |= {f"{target}.{a}" for a in subs}
    return out


def _is_module(name: str) -> bool:
    rel = SRC.parent.joinpath(*name.split("."))
    return rel.with_suffix(".py").is_file() or (rel / "__init__.py").is_file()


def graph() -> dict[str, set[str]]:
    """Module -> the nvrm modules it imports (a fresh copy: the tree is parsed once a run, not once a test)."""
    return {name: set(targets) for name, targets in _graph().items()}


@functools.lru_cache(maxsize=1)
def _graph() -> dict[str, frozenset[str]]:
    modules = {module_name(p): p for p in SRC.rglob("*.py")}
    return {name: frozenset(t for t in imports(path) if t in modules and t != name) for name, path in modules.items()}


def test_no_import_circles():
    """No exemptions: a package's ``__init__`` importing its submodules is an edge like any other (so
    ``cli.main -> cli.bench -> bench/__init__ -> bench.training -> cli.main`` is a circle). ``from pkg import sub``
    is an edge to ``pkg.sub`` only, not to ``pkg``'s ``__init__`` (which Python has already started by then)."""
    edges = graph()
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


def test_nothing_below_the_cli_imports_it():
    """``nvrm.cli`` is a shell over the library: only ``nvrm.__main__`` (the ``python -m nvrm`` entry) may import it."""
    g = graph()
    bad = sorted(f"{m} -> {t}" for m, ts in g.items() if not m.startswith("nvrm.cli") and m != "nvrm.__main__"
                 for t in ts if t == "nvrm.cli" or t.startswith("nvrm.cli."))
    assert not bad, bad


def test_no_two_modules_share_a_file_name():
    names = Counter(p.name for p in SRC.rglob("*.py") if p.name not in ("__init__.py", "config.py"))
    assert not [n for n, k in names.items() if k > 1], [n for n, k in names.items() if k > 1]


def test_the_forward_imports_nothing_of_preprocessing():
    g = graph()
    forward = [m for m in g if m.startswith("nvrm.forward")]
    assert forward
    for m in forward:
        bad = sorted(t for t in g[m] if t.startswith(("nvrm.engine", "nvrm.video", "nvrm.video.inputs", "nvrm.engine.chat")))
        assert not bad, f"{m} imports {bad}"


def test_the_scoring_library_never_imports_the_server_trainer_or_ray():
    g = graph()
    library = [m for m in g if m.startswith(("nvrm.scoring.reward_model", "nvrm.forward", "nvrm.engine", "nvrm.video.inputs", "nvrm.video", "nvrm.bundle"))]
    for m in library:
        bad = sorted(t for t in g[m] if t.startswith(("nvrm.serve", "nvrm.train", "nvrm.batch.ray_runner", "nvrm.cluster")))
        assert not bad, f"{m} imports {bad}"


def folder(module: str) -> str:
    """The top-level folder a module lives in (``nvrm.train.fit`` -> ``train``), or the root module itself (``results``)."""
    return module.split(".")[1] if "." in module else module


TOLERATED_FOLDER_EDGES = {
}
"""Module edges left out of the folder graph, each with its reason (temporary: the rule holds for everything else;
an entry goes once its import does)."""


def folder_graph() -> dict[str, dict[str, list[str]]]:
    """Folder -> the folders it imports -> the module edges that make it so (the package ``__init__`` and
    ``__main__``, the public face and the entry, stand above every folder and are left out)."""
    out: dict[str, dict[str, list[str]]] = {}
    for m, ts in graph().items():
        if m in ("nvrm", "nvrm.__main__"):
            continue
        for t in ts:
            if folder(m) != folder(t) and (m, t) not in TOLERATED_FOLDER_EDGES:
                out.setdefault(folder(m), {}).setdefault(folder(t), []).append(f"{m} -> {t}")
    return out


def test_no_circle_between_folders():
    """The rule behind "no import runs back up": folders import each other in one direction only, as modules do. A
    file in the wrong folder shows as a circle (``prefs`` -> ``rl`` -> ``record`` -> ``prefs`` when nvrm's own judge
    borrowed the RL adapters' scorer; ``train`` <-> ``jobs`` when a training store sat in the batch folder)."""
    edges = folder_graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(f, stack):
        state[f] = 1
        for t in sorted(edges.get(f, {})):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack + [t])
        state[f] = 2

    for f in sorted(edges):
        if f not in state:
            visit(f, [f])
    shown = [" -> ".join(c) + " (" + "; ".join(edges[a][b][0] for a, b in zip(c, c[1:])) + ")" for c in cycles[:5]]
    assert not cycles, "folders importing each other in a circle: " + " | ".join(shown)


APART = {
    ("prefs", "rl"): "the judges and the RL adapters share their scorer through nvrm.source, below both",
    ("train", "batch"): "training and batch scoring run on Ray through nvrm.cluster, below both",
    ("batch", "train"): "the prepared-input store is training's (nvrm.train.store, train/ray_store.py)",
}
"""Folders that never import one another, and what they share instead (issue 55)."""


def test_folders_kept_apart_import_nothing_of_each_other():
    edges = folder_graph()
    bad = [f"{a} imports {b} ({edges[a][b][0]}): {why}" for (a, b), why in APART.items() if b in edges.get(a, {})]
    assert not bad, bad


def private_imports(path: Path) -> list[tuple[str, str, str]]:
    """(importer, imported module, private name) for every ``_name`` ``path`` takes from another nvrm module: a name
    (``from m import _x``) or a private module (``import nvrm.a._m``, ``from nvrm.a import _m``). Dunders are not
    private; the private leaves ``nvrm._fields`` and ``nvrm._version`` are meant to be imported."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = []

    def private_module(name: str) -> str | None:
        parts = name.split(".")
        hidden = [p for p in parts if p.startswith("_") and not p.startswith("__")]
        return name if hidden and name not in ("nvrm._fields", "nvrm._version") else None

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(me, n, "") for a in node.names if a.name.startswith("nvrm.") and (n := private_module(a.name))]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("nvrm") or target == me:
                continue
            if private_module(target):
                out.append((me, target, ""))
            for a in node.names:
                full = f"{target}.{a.name}"
                if a.name.startswith("_") and not a.name.startswith("__") and full not in ("nvrm._fields", "nvrm._version"):
                    out.append((me, target, a.name))
    return out


TOLERATED_PRIVATE_IMPORTS: set[tuple[str, str, str]] = set()
"""(importer, module, name) private imports tolerated for now, each with its reason; an entry goes once its import does."""


def test_no_module_imports_a_private_name_of_another():
    """A name starting with ``_`` is its module's own: one shared is made public (or moved where it belongs)."""
    found = {hit for p in SRC.rglob("*.py") for hit in private_imports(p)}
    bad = sorted(found - TOLERATED_PRIVATE_IMPORTS)
    assert not bad, [f"{m} imports {t}{'.' + n if n else ''}" for m, t, n in bad]


def test_the_private_import_check_sees_each_form(tmp_path, monkeypatch):
    pkg = tmp_path / "nvrm" / "a"
    pkg.mkdir(parents=True)
    f = pkg / "m.py"
    f.write_text("from .other import _x, y, __all__\nfrom .. import _fields\nimport nvrm.b._hidden\nfrom nvrm.c import _m\n")
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path / "nvrm")
    assert sorted(private_imports(f)) == [("nvrm.a.m", "nvrm.a.other", "_x"), ("nvrm.a.m", "nvrm.b._hidden", ""), ("nvrm.a.m", "nvrm.c", "_m")]


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


ROOT_MODULES = {"__init__", "__main__", "_version", "contract", "limits", "settings", "results", "clip", "errors", "protocol", "client",
                "_fields"}  # _fields: the private leaf (imports nothing of nvrm) behind every settings dataclass's field help, used
                            # by root modules (settings, limits) and folders alike, so it sits with them rather than in a stage
"""The public ideas a user meets (plus private leaves that import nothing of nvrm); everything else lives in a folder named for its stage."""


def test_the_root_holds_only_the_public_modules():
    loose = sorted(p.stem for p in SRC.glob("*.py") if p.stem not in ROOT_MODULES)
    assert not loose, f"modules at the root of nvrm that belong in a folder: {loose}"


MAX_CLASS_LINES, MAX_FUNCTION_LINES = 250, 80
SIZE_EXCEPTIONS: dict[str, str] = {}
"""name -> why it may be larger (none today)."""


def test_no_class_or_function_is_too_long():
    """Classes of at most 250 lines and functions of at most 80 keep every module readable."""
    too_long = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            limit = (MAX_CLASS_LINES if isinstance(node, ast.ClassDef)
                     else MAX_FUNCTION_LINES if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
            if limit is None or node.name in SIZE_EXCEPTIONS:
                continue
            size = node.end_lineno - node.lineno + 1
            if size > limit:
                too_long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({size} lines > {limit})")
    assert not too_long, too_long


def test_streaming_has_typed_collaborators():
    """Streaming takes a typed Pipeline (engine, runtime, results); no model typed as Any, no private calls back."""
    text = (SRC / "scoring" / "streaming.py").read_text()
    tree = ast.parse(text)
    aliases = [t.id for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id == "Any"
               for t in node.targets if isinstance(t, ast.Name)]
    assert not aliases, aliases
    assert "._result(" not in text and "RewardModel" not in [n.id for n in ast.walk(tree) if isinstance(n, ast.Name)]


def test_no_two_test_files_share_a_name():
    """pytest imports test files by their base name (tests/ has no packages): two of one name break collection."""
    tests = Path(__file__).resolve().parents[1]
    names = Counter(p.name for p in tests.rglob("*.py") if p.name not in ("__init__.py", "conftest.py"))
    assert not [n for n, k in names.items() if k > 1], [n for n, k in names.items() if k > 1]


SERVE_FACE = {"__init__", "config", "metrics", "serving", "app", "launcher"}
"""The only modules at the root of ``serve/``: the settings, the metrics, the logic object, the app and the process."""
SERVE_LAYERS = (("config", "metrics"), ("http",), ("admission",), ("batching",), ("models",), ("serving",), ("jobs",), ("protocols",),
                ("app",), ("ray", "launcher"), ("__init__",))
"""``serve/``'s rooms and face modules, lowest first: each imports only from its own layer and those below it."""


def test_serve_shows_its_rooms():
    """``serve/`` is the face (``SERVE_FACE``) over sub-folders, one room each; no other module sits flat in it."""
    serve = SRC / "serve"
    flat = sorted(p.stem for p in serve.glob("*.py") if p.stem not in SERVE_FACE)
    assert not flat, f"modules flat in serve/ that belong in a room: {flat}"
    rooms = {p.name for p in serve.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    layered = {name for layer in SERVE_LAYERS for name in layer}
    assert rooms and rooms <= layered, f"rooms of serve/ missing from SERVE_LAYERS: {sorted(rooms - layered)}"
    assert SERVE_FACE <= layered and layered == rooms | SERVE_FACE, sorted(layered ^ (rooms | SERVE_FACE))


def test_no_import_in_serve_runs_back_up():
    """Inside ``serve/``, a module imports only from its own room (or face module) and the layers below it."""
    rank = {name: i for i, layer in enumerate(SERVE_LAYERS) for name in layer}

    def layer(module: str) -> int:
        parts = module.split(".")
        return rank[parts[2] if len(parts) > 2 else "__init__"]

    g = graph()
    bad = sorted(f"{m} -> {t}" for m, ts in g.items() if m.startswith("nvrm.serve") for t in ts
                 if t.startswith("nvrm.serve") and layer(t) > layer(m))
    assert not bad, f"imports running back up serve/'s layers: {bad}"


def test_the_sequence_limit_is_applied_once_where_the_count_is_born():
    """#55 item 7: only the engine's jobs apply ``check_sequence_tokens`` (an item when it is encoded, a group's rows
    when they are); nothing downstream checks again."""
    callers = sorted(
        str(p.relative_to(SRC))
        for p in SRC.rglob("*.py")
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.Attribute) and node.attr == "check_sequence_tokens" and isinstance(node.ctx, ast.Load)
    )
    assert callers == ["engine/tasks.py", "engine/tasks.py"], callers
