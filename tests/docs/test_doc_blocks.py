"""README.md and docs/*.md run as written: every fenced code block is run, or checked as far
as it can be without running it (``docblocks.py`` gives the rules), and every test, example
and page a document names exists.

Each document gets a sandbox: a temporary folder that looks like the repository's root (a link
to each of its entries, ``.venv`` to the virtual environment running the tests), so the paths
the blocks write work as they are while what the blocks write stays out of the repository.
A document's blocks run in order in one sandbox, so a block may use what an earlier one wrote.

The pages of ``docs/`` start the servers their blocks need (``docs/README.md``). The README's
quick starts talk to the node a reader started with ``dcpkv server`` on 127.0.0.1:11210: its
sandbox gets a real ``dcpkv server`` on a free port, and that port is the one thing changed:
every ``11210`` in its blocks, and in the copy of ``examples/`` the sandbox holds, is the
server's port.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import docblocks
import pytest
from docblocks import PORT, Block

from support.serverproc import ServerProcess, tracked_servers

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [
    block
    for doc in DOCUMENTS
    for block in docblocks.blocks(doc.read_text(), str(doc.relative_to(ROOT)))
]
# Safety net against a hang, never an assertion on speed (a Spark block starts a JVM).
BLOCK_TIMEOUT_S = 600.0
README_MAX_LINES = 250
# The documents whose blocks use the node of the quick start (module docstring).
ON_THE_NODE = {"README.md"}
# Not linked into a sandbox: the examples are copied (the port changed), a demo's data stays.
NOT_LINKED = {"examples", "dcpkv-data"}
# Pages other changes write: links to them are checked once they exist.
WRITTEN_ELSEWHERE = ("docs/", "bench/README.md")


class Sandbox:
    """A document's folder, and the server its blocks use if they use one (module docstring)."""

    def __init__(self, root: Path, server: ServerProcess | None) -> None:
        self.root = root
        self.server = server
        (root / ".venv").symlink_to(Path(sys.executable).parent.parent)
        for entry in ROOT.iterdir():
            if not entry.name.startswith(".") and entry.name not in NOT_LINKED:
                (root / entry.name).symlink_to(entry)
        (root / "examples").mkdir()
        for script in (ROOT / "examples").glob("*.py"):
            (root / "examples" / script.name).write_text(self.as_run(script.read_text()))

    def as_run(self, text: str) -> str:
        return text if self.server is None else text.replace(PORT, str(self.server.port))

    def run(self, argv: list[str], *, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, COLUMNS="200")  # typer's help: no option names cut by wrapping
        return subprocess.run(
            argv, cwd=cwd or self.root, env=env, capture_output=True, text=True,
            timeout=BLOCK_TIMEOUT_S,
        )  # fmt: skip


@pytest.fixture(scope="session")
def sandboxes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Sandbox]]:
    """One :class:`Sandbox` per document, made when its first block runs."""
    with tracked_servers() as factory:

        class Lazy(dict[str, Sandbox]):
            def __missing__(self, path: str) -> Sandbox:
                root = tmp_path_factory.mktemp(Path(path).stem)
                server = None
                if path in ON_THE_NODE:
                    server = factory(root / "data", root / "server.log")
                    server.start()
                self[path] = Sandbox(root, server)
                return self[path]

        yield Lazy()


@functools.cache
def _bash_builtins() -> frozenset[str]:
    listed = subprocess.run(["bash", "-c", "compgen -b"], capture_output=True, text=True)
    return frozenset(listed.stdout.split())


def _outcome(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.runs], ids=lambda b: b.name)
def test_block_runs_as_written(block: Block, sandboxes: dict[str, Sandbox]) -> None:
    box = sandboxes[block.path]
    text = box.as_run(block.text)
    if block.lang == "python":
        script = box.root / f"block_{block.line}.py"
        script.write_text(text)
        result = box.run([sys.executable, str(script)])
        assert result.returncode == 0, _outcome(result)
    elif docblocks.is_transcript(text):
        cmds, expected = docblocks.transcript(text)
        outputs = []
        for cmd in cmds:
            result = box.run(["bash", "-c", cmd])
            assert result.returncode == 0, f"{cmd}\n{_outcome(result)}"
            outputs.append(result.stdout)
        assert "".join(outputs).strip("\n") == expected
    else:
        result = box.run(["bash", "-e", "-c", text])
        assert result.returncode == 0, _outcome(result)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.illustrative], ids=lambda b: b.name)
def test_illustrative_block_is_real(block: Block, sandboxes: dict[str, Sandbox]) -> None:
    """A ``no-run`` block is not run, but what it says must exist: Python that compiles,
    make targets that make knows, commands that answer ``--help`` with every option used."""
    if block.lang == "python":
        compile(block.text, block.name, "exec")
        return
    box = sandboxes[block.path]
    for cmd in docblocks.commands(block.text):
        argv = docblocks.words(cmd)
        if argv[0] == "make":
            rules = (ROOT / "Makefile").read_text()
            for target in argv[1:]:
                assert re.search(rf"^{re.escape(target)}:", rules, re.M), f"{cmd}: no rule"
            result = box.run(["make", "-n", *argv[1:]], cwd=ROOT)
            assert result.returncode == 0, f"{cmd}\n{_outcome(result)}"
        elif argv[0].startswith(".venv/bin/"):
            result = box.run([*docblocks.subcommand(argv), "--help"])
            assert result.returncode == 0, f"{cmd}\n{_outcome(result)}"
            unknown = {o for o in docblocks.options(cmd) if o not in result.stdout}
            assert not unknown, f"{cmd}: {sorted(unknown)} not in its --help"
        elif not re.match(r"\w+=", argv[0]) and argv[0] not in _bash_builtins():
            assert shutil.which(argv[0]), f"{cmd}: no {argv[0]} on PATH"


def test_every_block_says_what_it_is() -> None:
    """A block of code with no language would be neither run nor checked."""
    bare = [b.name for b in BLOCKS if not b.lang]
    assert not bare, f"fences without a language: {bare}"


def test_readme_is_short() -> None:
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines < README_MAX_LINES


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_named_tests_exist(doc: Path) -> None:
    for ref in sorted(docblocks.named_tests(doc.read_text())):
        path, _, name = ref.partition("::")
        assert (ROOT / path).is_file(), f"{doc.name} names {ref}: no such file"
        if name:
            source = (ROOT / path).read_text()
            assert re.search(rf"^(async )?def {name}\(", source, re.M), f"no test {ref}"


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_links_stay_in_the_repository_and_resolve(doc: Path) -> None:
    text = doc.read_text()
    assert "shared/spec" not in text, "a clone has no ../shared: say it in docs/protocol.md"
    pending = []
    for target in sorted(docblocks.relative_links(text)):
        path = (doc.parent / target).resolve()
        assert path.is_relative_to(ROOT), f"{doc.name} links outside the repository: {target}"
        where = str(path.relative_to(ROOT))
        if not path.exists() and where.startswith(WRITTEN_ELSEWHERE):
            pending.append(where)
            continue
        assert path.exists(), f"{doc.name} links to {target}: no such file"
    if pending:
        pytest.skip(f"not written yet: {', '.join(pending)}")


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda d: str(d.relative_to(ROOT)))
def test_examples_named_are_under_test(doc: Path) -> None:
    tested = (ROOT / "tests" / "examples" / "test_examples.py").read_text()
    for name in sorted(set(re.findall(r"examples/(\w+\.py)", doc.read_text()))):
        assert (ROOT / "examples" / name).is_file(), f"{doc.name} names examples/{name}"
        assert f'"{name}"' in tested, f"tests/examples does not run examples/{name}"
