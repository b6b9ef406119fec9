"""docs/tutorial.md runs as written: its files are saved, its commands run in real processes in
a fresh folder (``tmp_path``), and what they print is compared with the output the page shows.

How the page is read:

* A fenced block opened with ``python title="NAME"`` is a file, saved as ``tmp_path/NAME``.
* A ``console`` block is a shell session. A line ``$ COMMAND`` is a command; the lines after
  it, up to the next ``$ ``, are its output as a terminal shows it (stdout and stderr
  together). Each command runs in ``bash -c`` in ``tmp_path`` with the venv's ``bin`` first on
  ``PATH`` (what ``source .venv/bin/activate`` does), and must exit with status 0.
* ``COMMAND &`` runs in the background, as a shell job: the test reads its output until the
  lines shown have appeared and leaves it running. ``kill %N`` sends SIGTERM to the Nth job,
  waits for it to exit (status 0) and compares the rest of its output. A job still running
  when the test ends is stopped by its pid.
* Output is compared line by line after both sides are normalised: runs of blanks become one
  blank, and what differs from run to run becomes a placeholder (``VOLATILE``: times, dates,
  ns stamps, ports, the pid after an endpoint, durations, rates, the recorder's row counts,
  sequence numbers and queue depth, the directory file's path). A line ``...`` in the page
  stands for any number of lines; ``...`` inside a line for any text.
* Any other fenced block fails the test: nothing on the page escapes it.

Sections 1-7 need the running server and run in order in one test; section 8 (the
``rda.testing`` tests) needs only the files. The directory file is the per-test one from
conftest (``RDA_DIRECTORY_FILE``, inherited by every process started here).
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "tutorial.md"
OFFLINE_SECTION = "8. Test it without a network"
LINE_TIMEOUT = 30.0  # seconds to wait for one line of a background job

VOLATILE: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^directory file: .*"), "directory file: <path>"),
    (re.compile(r"\d{4}-\d\d-\d\d"), "<date>"),
    (re.compile(r"\d\d:\d\d:\d\d(?:\.\d+)?"), "<time>"),
    (re.compile(r"\b\d{19}\b"), "<ns>"),
    (re.compile(r"(tcp://[^\s:/]+):\d+"), r"\1:<port>"),
    (re.compile(r"(:<port>) \d+\b"), r"\1 <pid>"),  # rda directory list: PID after ENDPOINT
    (re.compile(r"\(\d+(?:\.\d+)?/s\)"), "(<rate>)"),
    (re.compile(r"\b\d+(?:\.\d+)? ?(?:ms|µs|s)\b"), "<duration>"),
    (re.compile(r"\b\d+ rows\b"), "<n> rows"),
    (re.compile(r"\b(acked|last) seq \d+"), r"\1 seq <n>"),
    (re.compile(r"\bqueue \d+/"), "queue <n>/"),
]


@dataclass
class Block:
    section: str
    kind: str  # "file" or "console"
    text: str
    name: str = ""


@dataclass
class Command:
    line: str
    expected: list[str] = field(default_factory=list)


def blocks(text: str) -> list[Block]:
    """The fenced blocks of the page, each with the ``## `` section it is in."""
    found: list[Block] = []
    section = ""
    lines = iter(text.splitlines())
    for line in lines:
        if line.startswith("## "):
            section = line[3:].strip()
        opening = re.fullmatch(r"```(\S*)(.*)", line)
        if opening is None:
            continue
        body: list[str] = []
        for inner in lines:
            if inner == "```":
                break
            body.append(inner)
        else:
            raise AssertionError(f"unclosed block in {section!r}: {line}")
        language, info = opening.group(1), opening.group(2).strip()
        title = re.fullmatch(r'title="([\w.]+)"', info)
        content = "\n".join(body) + "\n"
        if language == "python" and title is not None:
            found.append(Block(section, "file", content, title.group(1)))
        elif language == "console" and not info:
            found.append(Block(section, "console", content))
        else:
            raise AssertionError(
                f"{section!r}: a block test_tutorial.py cannot run: {line!r} "
                '(python title="NAME" or console)'
            )
    return found


def commands(block: Block) -> list[Command]:
    found: list[Command] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            found.append(Command(line[2:]))
        else:
            assert found, f"{block.section!r}: output before any command: {line!r}"
            found[-1].expected.append(line)
    return found


def normalise(line: str) -> str:
    line = " ".join(line.split())
    for pattern, placeholder in VOLATILE:
        line = pattern.sub(placeholder, line)
    return line


def matches(expected: list[str], actual: list[str]) -> bool:
    """Whether the normalised ``actual`` lines are the ``expected`` ones (``...``: wildcards)."""
    patterns = [
        None if line == "..." else re.compile(".*".join(map(re.escape, line.split("..."))))
        for line in (normalise(e) for e in expected)
    ]
    lines = [normalise(a) for a in actual if a.strip()]
    memo: dict[tuple[int, int], bool] = {}

    def match(i: int, j: int) -> bool:
        if (i, j) not in memo:
            if i == len(patterns):
                memo[i, j] = j == len(lines)
            elif patterns[i] is None:
                memo[i, j] = any(match(i + 1, k) for k in range(j, len(lines) + 1))
            else:
                pattern = patterns[i]
                assert pattern is not None
                memo[i, j] = (
                    j < len(lines)
                    and pattern.fullmatch(lines[j]) is not None
                    and match(i + 1, j + 1)
                )
        return memo[i, j]

    return match(0, 0)


def assert_output(command: str, expected: list[str], actual: list[str]) -> None:
    shown = "\n".join(expected)
    got = "\n".join(actual)
    assert matches(expected, actual), f"$ {command}\n--- the page shows:\n{shown}\n--- got:\n{got}"


class Job:
    """A background command; a thread reads its output (stdout and stderr) into a queue."""

    def __init__(self, command: str, cwd: Path, env: dict[str, str]) -> None:
        self.command = command
        # exec: the pid is the command's own, so the signals reach it.
        self.proc = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, name=f"job {command}", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def read_lines(self, count: int) -> list[str]:
        got: list[str] = []
        while len(got) < count:
            try:
                line = self.lines.get(timeout=LINE_TIMEOUT)
            except queue.Empty:
                raise AssertionError(
                    f"{self.command}: silent for {LINE_TIMEOUT} s: {got}"
                ) from None
            assert line is not None, f"{self.command}: ended (status {self.proc.wait()}): {got}"
            got.append(line)
        return got

    def rest(self) -> list[str]:
        """The lines not read yet, once the process has ended."""
        self.reader.join(timeout=LINE_TIMEOUT)
        got: list[str] = []
        while (line := self.lines.get_nowait()) is not None:
            got.append(line)
        return got

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.reader.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Shell:
    """Runs a console block's commands the way an interactive shell would."""

    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        self.jobs: list[Job] = []

    def run(self, command: Command) -> None:
        line = command.line
        if line.endswith(" &"):
            assert "..." not in command.expected, f"{line}: show a background job's output whole"
            job = Job(line[:-2].strip(), self.cwd, self.env)
            self.jobs.append(job)
            assert_output(line, command.expected, job.read_lines(len(command.expected)))
            return
        kill = re.fullmatch(r"kill %(\d+)", line)
        if kill is not None:
            job = self.jobs[int(kill.group(1)) - 1]
            os.kill(job.proc.pid, signal.SIGTERM)
            status = job.proc.wait(timeout=30)
            assert status == 0, f"{job.command}: exit status {status} after SIGTERM"
            assert_output(line, command.expected, job.rest())
            return
        done = subprocess.run(
            ["bash", "-c", line],
            cwd=self.cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"$ {line}: exit status {done.returncode}\n{done.stdout}"
        assert_output(line, command.expected, done.stdout.splitlines())

    def stop(self) -> None:
        for job in self.jobs:
            job.stop()


@pytest.fixture
def page() -> list[Block]:
    return blocks(DOC.read_text())


@pytest.fixture
def shell(tmp_path: Path, page: list[Block]) -> Iterator[Shell]:
    for block in page:
        if block.kind == "file":
            (tmp_path / block.name).write_text(block.text)
    shell = Shell(tmp_path)
    try:
        yield shell
    finally:
        shell.stop()


def run_sections(shell: Shell, page: list[Block], offline: bool) -> int:
    ran = 0
    for block in page:
        if block.kind == "console" and (block.section == OFFLINE_SECTION) == offline:
            for command in commands(block):
                shell.run(command)
                ran += 1
    return ran


@pytest.mark.timeout(180)
def test_walkthrough_runs_as_written(shell: Shell, page: list[Block]) -> None:
    """Sections 1-7: the server in the background, the CLI, the clients, the recorder."""
    assert run_sections(shell, page, offline=False) >= 15
    assert shell.jobs, "the page starts no server"
    assert all(job.proc.poll() is not None for job in shell.jobs), "the page leaves jobs running"


def test_offline_tests_run_as_written(shell: Shell, page: list[Block]) -> None:
    """Section 8: the page's pytest file passes, without a network."""
    assert run_sections(shell, page, offline=True) == 1


def test_page_uses_public_names_and_clean_code(tmp_path: Path, page: list[Block]) -> None:
    text = DOC.read_text()
    internal = re.findall(r"rda\.(?:business|serialization|transport)\b|rda(?:\.\w+)*\._\w+", text)
    assert not internal, f"the tutorial names internal modules: {internal}"
    files = [block for block in page if block.kind == "file"]
    assert {block.name for block in files} >= {"ps_server.py", "client.py", "test_ps_server.py"}
    for block in files:
        imported = re.findall(r"^(?:from|import) (rda[\w.]*)", block.text, re.M)
        assert set(imported) <= {"rda", "rda.aio", "rda.testing"}, (block.name, imported)
        (tmp_path / block.name).write_text(block.text)
    # The reader's own folder, not this project: ruff's defaults (rda is a third-party
    # package there) with this project's rule selection and line length.
    options = ["--isolated", "--line-length", "100"]
    names = [block.name for block in files]
    for check in (["check", "--select", "E,F,W,I,B,UP,SIM,RUF"], ["format", "--check", "--diff"]):
        done = subprocess.run(
            [str(BIN / "ruff"), *check, *options, *names],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"ruff {check[0]}: {done.stdout}{done.stderr}"
    # The editable install's import hook hides rda from mypy: MYPYPATH shows it the checkout.
    # That makes rda's own modules part of the check, where an installed rda is a package whose
    # imports mypy does not report: its optional dependencies without type information
    # (pyarrow for history, p4p for rda.testing's EPICS helpers) are said to be untyped, as
    # this project's pyproject.toml says for itself.
    (tmp_path / "mypy.ini").write_text(
        "[mypy]\n[mypy-pyarrow.*,p4p.*]\nignore_missing_imports = True\n"
    )
    typed = subprocess.run(
        [str(BIN / "mypy"), "--strict", "--cache-dir", str(tmp_path / ".mypy_cache"), *names],
        cwd=tmp_path,
        env={**os.environ, "MYPYPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert typed.returncode == 0, f"mypy --strict: {typed.stdout}{typed.stderr}"
