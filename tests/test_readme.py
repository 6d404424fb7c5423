"""README.md's commands, as a user types them.

Every ``autotune`` line in a ``bash`` block of README.md must parse with the real argument parser
(fast, in the suite), and every one runs as written, in order, in a fresh copy of the repository
(``pytest -m readme``, what ``make readme`` and CI run after the suite: it takes minutes). The
``make`` lines are the two entry points CI itself runs; Python blocks run too, except a block
with ``...`` placeholders. A Python block whose first line is a file name comment (``# my_model.py``)
is saved as that file first, as the reader is told to, so the commands after it can name it.
The docs pages' ``autotune`` commands (docs/*.md) must parse too: they are not run (minutes each).
A README block marked ``sh`` instead of ``bash`` is shown and parsed, never run: it needs what CI
has not (a GPU, a package index).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import NamedTuple

import pytest

from autotune.cli.main import _parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
SAVED_AS = re.compile(r"# ([\w./-]+\.py)\n")
# A template's ``...`` placeholder; ``x[..., :4]`` (Ellipsis indexing) is code, and its block runs.
PLACEHOLDER = re.compile(r"\.\.\.(?!,)")
SHELL = ("bash", "sh")  # the blocks whose commands are parsed; only ``bash`` ones run


class Block(NamedTuple):
    line: int  # 1-based line of the first line of the block's body
    lang: str
    body: str


def readme_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        blocks.append(Block(text.count("\n", 0, m.start()) + 2, m.group(1), m.group(2)))
    return blocks


def readme_commands(path: Path = README) -> list[tuple[int, str]]:
    """(line, command) of each autotune command in the shell blocks of ``path``, comments stripped."""
    commands: list[tuple[int, str]] = []
    for block in readme_blocks(path.read_text()):
        if block.lang not in SHELL:
            continue
        for i, line in enumerate(block.body.splitlines()):
            command = line.split("#", 1)[0].strip()
            if command.startswith("autotune"):
                commands.append((block.line + i, command))
    return commands


COMMANDS = readme_commands()
DOC_COMMANDS = [(f"{path.name}:{line}", command) for path in DOCS for line, command in readme_commands(path)]


def test_readme_shows_commands() -> None:
    # A front page: the quick starts' commands, tune, the dashboard and the three to look first
    # (the rest of the manual is in docs/, whose commands test_docs_command_parses checks).
    assert len(COMMANDS) >= 8
    assert len(DOC_COMMANDS) >= 20


def test_the_gpu_quick_start_is_parsed_and_not_run() -> None:
    # Run on CI's CPU, `--device cuda` would stop at once: its block is ``sh``, whose commands parse here.
    gpu = [b for b in readme_blocks(README.read_text()) if "--device cuda" in b.body]
    assert [b.lang for b in gpu] == ["sh"]
    assert [c for _, c in COMMANDS if "--device cuda" in c] == [
        "autotune study my_model.py:build --memory-budget 20GiB --device cuda"
    ]


@pytest.mark.parametrize(("line", "command"), COMMANDS, ids=[f"L{n}" for n, _ in COMMANDS])
def test_readme_command_parses(line: int, command: str) -> None:
    words = shlex.split(command)
    assert ">" not in words or words.index(">") == len(words) - 2, f"README.md:{line}: one redirect, at the end"
    args = words[1 : words.index(">")] if ">" in words else words[1:]
    try:
        _parser().parse_args(args)
    except SystemExit as e:  # argparse exits 2 on a bad argument, 0 on --help/--version
        assert e.code == 0, f"README.md:{line}: {command!r} does not parse"


@pytest.mark.parametrize(("where", "command"), DOC_COMMANDS, ids=[w for w, _ in DOC_COMMANDS])
def test_docs_command_parses(where: str, command: str) -> None:
    words = shlex.split(command)
    args = words[1 : words.index(">")] if ">" in words else words[1:]
    try:
        _parser().parse_args(args)
    except SystemExit as e:
        assert e.code == 0, f"docs/{where}: {command!r} does not parse"


def inline_commands() -> list[str]:
    """Commands quoted in README's prose (inline code, outside the code blocks), one space each."""
    prose = re.sub(r"^```.*?^```", "", README.read_text(), flags=re.S | re.M)
    spans = (" ".join(m.group(1).split()) for m in re.finditer(r"`([^`]+)`", prose))
    # ``OMP_NUM_THREADS=1 python benchmarks/...``: the environment assignments go, the command is checked
    commands = (re.sub(r"^(?:[A-Z_]+=\S+ )+", "", t) for t in spans)
    return [t for t in commands if t.startswith(("autotune ", "python benchmarks/"))]


# A syntax line (`autotune worker NAME --storage ...`) names its placeholders in capitals; a bare
# `autotune study` names a command in a sentence. Everything else is a command to type.
INLINE = [c for c in inline_commands() if len(c.split()) >= 3 and not re.search(r"\b[A-Z]{2,}\b|\.\.\.", c)]


@pytest.mark.parametrize("command", INLINE)
def test_readme_prose_command_is_real(command: str) -> None:
    """Quoted commands parse (autotune) or name an existing benchmark and flags it defines."""
    words = shlex.split(command)
    if words[0] == "autotune":
        try:
            _parser().parse_args(words[1:])
        except SystemExit as e:
            assert e.code == 0, f"README.md: {command!r} does not parse"
        return
    script = ROOT / words[1]
    assert script.is_file(), f"README.md: {command!r}: no {words[1]}"
    source = script.read_text()
    for flag in (w for w in words[2:] if w.startswith("--")):
        assert f'"{flag}"' in source, f"README.md: {command!r}: {words[1]} has no {flag} option"


def _run_dashboard(words: list[str], cwd: Path, env: dict[str, str]) -> None:
    """The dashboard serves until stopped: start it, wait for its page, then stop it. SIGTERM, not
    SIGINT: a shell that starts this run in the background ignores SIGINT for all its children."""
    port = words[words.index("--port") + 1] if "--port" in words else "8080"
    log = cwd / "dashboard.log"
    with log.open("w") as err:
        proc = subprocess.Popen(words, cwd=cwd, env=env, start_new_session=True, stdout=err, stderr=err)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"dashboard exited: {log.read_text()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
                    assert page.status == 200
                time.sleep(1)
                assert proc.poll() is None, "the page answered, but not from this dashboard (port taken?)"
                break
            except OSError:
                assert time.monotonic() < deadline, "the dashboard did not answer within 60 s"
                time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.readme
def test_readme_runs_as_written(tmp_path: Path) -> None:
    """Each command and Python block, in README order, in a copy of the repository."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    repo = tmp_path / "repo"
    for name in files:
        if (ROOT / name).is_file():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, repo / name)
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "160"}
    for block in readme_blocks(README.read_text()):
        if block.lang == "python" and not PLACEHOLDER.search(block.body):
            saved_as = SAVED_AS.match(block.body)
            if saved_as:  # the reader saves it under the name it gives, then the commands below use it
                (repo / saved_as.group(1)).write_text(block.body)
            start = time.monotonic()
            proc = subprocess.run([sys.executable, "-c", block.body], cwd=repo, env=env, capture_output=True, text=True)
            assert proc.returncode == 0, f"README.md:{block.line}: python block failed:\n{proc.stderr[-3000:]}"
            print(f"README.md:{block.line} python block: {time.monotonic() - start:.0f} s", file=sys.stderr)
        if block.lang != "bash":
            continue
        for i, line in enumerate(block.body.splitlines()):
            command = line.split("#", 1)[0].strip()
            if not command.startswith("autotune"):
                continue
            start = time.monotonic()
            words = shlex.split(command)
            if words[1] == "dashboard":
                _run_dashboard(words, repo, env)
            else:
                proc = subprocess.run(["bash", "-c", command], cwd=repo, env=env, capture_output=True, text=True)
                assert proc.returncode == 0, (
                    f"README.md:{block.line + i}: {command!r} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
                )
            print(f"README.md:{block.line + i} {command}: {time.monotonic() - start:.0f} s", file=sys.stderr)
