"""One cached venv per pinned engine release, so a buggy and a fixed version can be run side by side.

A venv lives at `.kvparity/venvs/<distribution>-<version>/` and is reused once it holds the marker
`.kvparity-museum-ready`, written only after every install step succeeded — a half-built venv is built
again, never run. The steps are argv lists (no shell), in an order that lets the engine's own pins win:
torch (the Makefile's `TORCH`, pinned, so these machines never pull a CUDA build), kvparity's other core
dependencies read from pyproject.toml, the engine release with its extra requirements, the packages it
must not have, and kvparity itself, editable and without dependencies. An sdist (`wheel_cache`) is built
once into `.wheels/` and installed from there: llama-cpp-python 0.2.x takes ~14 minutes to compile here.
Every step's output goes to the venv's `install.log`; a failing step is an honest "cannot install" row
with pip's last line, not an exception."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from attrs import frozen

from kvparity.commands.museum.exhibits import Package

REPO = Path(__file__).resolve().parents[3]
VENVS = Path(".kvparity") / "venvs"
WHEELS = REPO / ".wheels"
MARKER = ".kvparity-museum-ready"


@frozen
class Step:
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    skip_if: str = ""  # a glob under WHEELS: the step is skipped when it matches (a cached wheel)


@frozen
class Venv:
    path: Path
    ready: bool
    reason: str = ""  # why it is not ready: the failing step and pip's last line

    @property
    def kvparity(self) -> Path:
        return self.path / "bin" / "kvparity"


def venv_path(package: Package, version: str, root: Path = VENVS) -> Path:
    return Path(root) / f"{package.name}-{version}"


def core_requirements(pyproject: Path = REPO / "pyproject.toml") -> tuple[list[str], list[str]]:
    """(torch, the other core dependencies) of kvparity itself."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    torch = shlex.split(os.environ.get("TORCH", "torch==2.13.0"))
    return torch, [d for d in deps if not re.match(r"torch\b", d)]


def install_plan(package: Package, version: str, path: Path) -> list[Step]:
    pip = (str(path / "bin" / "python"), "-m", "pip", "install", "-q")
    torch, core = core_requirements()
    wanted = f"{package.name}=={version}"
    steps = [Step((sys.executable, "-m", "venv", "--clear", str(path))),
             Step((*pip, *torch)),
             Step((*pip, *core))]
    if package.wheel_cache:
        wheel_glob = f"{re.sub(r'[-.]', '_', package.name)}-{version}-*.whl"
        steps.append(Step((str(path / "bin" / "python"), "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(WHEELS),
                           wanted), tuple(sorted(package.build_env.items())), skip_if=wheel_glob))
        steps.append(Step((*pip, "--find-links", str(WHEELS), *package.requires, wanted)))
    else:
        steps.append(Step((*pip, *package.requires, wanted), tuple(sorted(package.build_env.items()))))
    if package.uninstall:
        steps.append(Step((str(path / "bin" / "python"), "-m", "pip", "uninstall", "-q", "-y", *package.uninstall)))
    steps.append(Step((*pip, "--no-deps", "-e", str(REPO))))
    return steps


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.lower().startswith("error")]
    return (errors or lines or ["(no output)"])[-1][:300]


def ensure(package: Package, version: str, root: Path = VENVS, *, rebuild: bool = False,
           log=print) -> Venv:
    """The venv for `package==version`, built if it is not ready (or `rebuild`)."""
    path = venv_path(package, version, root)
    if (path / MARKER).exists() and not rebuild:
        return Venv(path, True)
    log(f"museum: building {path} (pip output in {path / 'install.log'})")
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).unlink(missing_ok=True)
    WHEELS.mkdir(exist_ok=True)
    transcript = []
    for step in install_plan(package, version, path):
        if step.skip_if and any(WHEELS.glob(step.skip_if)):
            continue
        done = subprocess.run(step.argv, env={**os.environ, **dict(step.env)}, capture_output=True, text=True)
        transcript.append(f"$ {shlex.join(step.argv)}\n{done.stdout}{done.stderr}")
        (path / "install.log").write_text("\n".join(transcript))
        if done.returncode != 0:
            what = " ".join(step.argv[3:6]) if len(step.argv) > 5 else shlex.join(step.argv)
            return Venv(path, False, f"`{what} …` failed (exit {done.returncode}): {_last_line(done.stdout + done.stderr)}")
    (path / MARKER).write_text(f"{package.name}=={version}\n")
    return Venv(path, True)
