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


def test_the_exclusive_modules_run_on_one_worker_first(tmp_path):
    """``make test``'s scheduler (conftest): the modules marked ``exclusive`` are one unit, given first to one
    worker, so no worker waits on the other's lock; the rest go a file at a time."""
    conftest = Path(__file__).resolve().parents[1] / "conftest.py"
    (tmp_path / "conftest.py").write_text(conftest.read_text())
    (tmp_path / "ran").mkdir()
    body = ("import os, time\n{mark}\ndef test_{name}():\n"
            "    open('ran/{name}', 'w').write(os.environ['PYTEST_XDIST_WORKER'] + ' ' + str(time.monotonic_ns()))\n")
    names = {"a": "pytestmark = pytest.mark.exclusive", "b": "pytestmark = [pytest.mark.exclusive]", "c": "", "d": "", "e": ""}
    for name, mark in names.items():
        (tmp_path / f"test_{name}.py").write_text("import pytest\n" + body.format(name=name, mark=mark))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    exclusive: test\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    ran = {f.name: f.read_text().split() for f in (tmp_path / "ran").iterdir()}
    assert sorted(ran) == sorted(names), ran
    worker = ran["a"][0]
    assert ran["b"][0] == worker, ran  # one worker ran both exclusive modules (file order alone gives one each) ...
    after = [int(t) for name, (w, t) in ran.items() if w == worker and name not in "ab"]
    assert all(t > max(int(ran["a"][1]), int(ran["b"][1])) for t in after), ran  # ... before anything else
    conf = __import__("conftest")
    marked = [p for p in conftest.parent.rglob("test_*.py") if "mark.exclusive" in p.read_text() and p.name != "test_hygiene.py"]
    assert len(marked) >= 10 and all(conf._is_exclusive_module(str(p)) for p in marked), "mark a module exclusive by its pytestmark line"
