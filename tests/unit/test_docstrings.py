"""Every public function of RewardModel, the client and the CLI modules says what it takes and returns."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "nvrm"
MODULES = ["scoring/reward_model.py", "client.py", *sorted(str(p.relative_to(SRC)) for p in (SRC / "cli").glob("*.py"))]


def undocumented(path: Path) -> list[str]:
    missing = []

    def visit(body, prefix=""):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                if ast.get_docstring(node) is None:
                    missing.append(f"{prefix}{node.name} (line {node.lineno})")
                if isinstance(node, ast.ClassDef):
                    visit(node.body, node.name + ".")

    visit(ast.parse(path.read_text()).body)
    return missing


@pytest.mark.parametrize("module", MODULES)
def test_public_functions_are_documented(module):
    assert undocumented(SRC / module) == []


def test_the_check_sees_a_missing_docstring(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('class A:\n    """doc"""\n    def go(self):\n        return 1\n\ndef _private():\n    pass\n')
    assert undocumented(f) == ["A.go (line 3)"]
