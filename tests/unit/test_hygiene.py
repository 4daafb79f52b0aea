"""Tests write their temp files into the run's own folder, which is removed at the end (conftest)."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path


def test_temp_files_go_to_the_runs_own_folder(tmp_path):
    root = Path(os.environ["NVRM_TEST_ROOT"])
    assert root.name.startswith("nvrm-tests-") and root.is_dir()
    assert Path(tempfile.gettempdir()).is_relative_to(root) and tmp_path.is_relative_to(root)
    assert Path(os.environ["RAY_TMPDIR"]).is_relative_to(root)
    child = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"], capture_output=True, text=True, check=True)
    assert Path(child.stdout.strip()).is_relative_to(root)  # subprocesses (servers, trainers) inherit it


def test_a_nested_run_nests_and_removes_its_folder(tmp_path):
    test = tmp_path / "test_inner.py"
    test.write_text("import os\ndef test_inner():\n    print('ROOT=' + os.environ['NVRM_TEST_ROOT'])\n")
    conftest = Path(__file__).resolve().parents[1] / "conftest.py"
    (tmp_path / "conftest.py").write_text(conftest.read_text())
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(test)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    inner = Path(next(line for line in out.stdout.splitlines() if line.startswith("ROOT="))[5:])
    assert inner.parent == Path(os.environ["NVRM_TEST_ROOT"]) and not inner.exists()
