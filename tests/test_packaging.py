"""The wheel holds every module of the package and works installed, not only editable.

A wheel built from main once lacked ``secureffm/privacy/`` (pyproject listed packages by hand),
so ``pip install .`` could not import ``secureffm.methods.ffm``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_installs_every_module_and_runs(tmp_path):
    source = tmp_path / "source"  # a copy: building writes build/ beside the sources
    for name in ("secureffm", "protocols", "threat_models"):
        shutil.copytree(ROOT / name, source / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(tmp_path / "dist")], check=True)
    wheel = next((tmp_path / "dist").glob("secureffm-*.whl"))
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "secureffm").rglob("*.py")}
    packed = set(zipfile.ZipFile(wheel).namelist())
    assert modules <= packed, f"missing from the wheel: {sorted(modules - packed)}"
    assert any(name.startswith("secureffm/specs/protocols/") for name in packed)
    assert "secureffm/py.typed" in packed  # type checkers read the package's annotations
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(target), str(wheel)], check=True)
    names = sorted(m[:-3].replace("/", ".").removesuffix(".__init__") for m in modules
                   if not m.endswith("__main__.py"))
    # One interpreter imports every installed module, then runs `python -m secureffm run
    # --help` the way -m does (runpy, as __main__): a second interpreter cost 5 s of imports.
    check = (f"import importlib, runpy, sys, secureffm\n"
             f"assert secureffm.__file__.startswith({str(target)!r}), secureffm.__file__\n"
             f"[importlib.import_module(n) for n in {names!r}]\n"
             f"sys.argv = ['secureffm', 'run', '--help']\n"
             f"try:\n    runpy.run_module('secureffm', run_name='__main__', alter_sys=True)\n"
             f"except SystemExit as done:\n    assert done.code in (0, None), done.code\n")
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", check], check=True, cwd=tmp_path, env=env,
                         capture_output=True, text=True).stdout
    assert "--insecure-deterministic" in out
