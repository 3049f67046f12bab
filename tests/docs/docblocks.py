"""The fenced code blocks of a Markdown document, and what the documentation tests do with
each (sans I/O: ``test_doc_blocks.py`` runs them).

A fence's info string is its language and, optionally, flags: `` ```sh no-run ``. Markdown
renderers show the language's highlighting and ignore the rest, so the flag costs the reader
nothing.

==========================  ===============================================================
block                       what the tests do
==========================  ===============================================================
``python``                  run as a script against a real server (:data:`PORT` is its port)
``sh``                      run by bash, stopping at the first command that fails
``sh`` with ``$`` prompts   a transcript: the commands run, their output must be the rest
``python no-run``           compiled only (an illustration that cannot run on its own)
``sh no-run``               each command checked, not run: ``make -n TARGET``; a command of
                            ``.venv/bin`` answers ``--help`` and knows every ``--option`` used
anything else               not code (output, JSON, TOML): nothing
==========================  ===============================================================

``no-run`` is for commands that do not end by themselves (a server, ``make run``), that run
the tests themselves (``make test``), or that need more than one node (a cluster); keep it
for those.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

PORT = "11210"  # the port the blocks name; the tests replace it by their server's
NO_RUN = "no-run"
RUN = frozenset({"python", "sh"})

_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_TEST_REF = re.compile(r"\btests/[\w/]+\.py(?:::\w+)?")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


@dataclass(frozen=True, slots=True)
class Block:
    path: str  # the document, relative to the repository
    line: int  # the opening fence's line, 1-based
    lang: str
    flags: frozenset[str]
    text: str

    @property
    def name(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in RUN and NO_RUN not in self.flags

    @property
    def illustrative(self) -> bool:
        return self.lang in RUN and NO_RUN in self.flags


def blocks(text: str, path: str) -> list[Block]:
    """Every fenced block of ``text``, in order; an unclosed fence is an error."""
    found: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if opened is None:
            i += 1
            continue
        fence, indent = opened["fence"], len(opened["indent"])
        words = opened["info"].split()
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            body.append(lines[j][indent:] if lines[j][:indent].isspace() else lines[j])
            j += 1
        if j == len(lines):
            raise ValueError(f"{path}:{i + 1}: the fence is never closed")
        lang = words[0].lower() if words else ""
        found.append(Block(path, i + 1, lang, frozenset(words[1:]), "\n".join(body) + "\n"))
        i = j + 1
    return found


def commands(script: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, comments and blanks dropped."""
    out: list[str] = []
    pending = ""
    for line in script.splitlines():
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        if whole and not whole.startswith("#"):
            out.append(whole)
    return out


def is_transcript(script: str) -> bool:
    return any(line.startswith("$ ") for line in script.splitlines())


def transcript(script: str) -> tuple[list[str], str]:
    """A transcript's commands (after ``$ ``) and the output they must print, in order."""
    cmds = [line[2:] for line in script.splitlines() if line.startswith("$ ")]
    output = [line for line in script.splitlines() if not line.startswith("$ ")]
    return cmds, "\n".join(output).strip("\n")


def words(command: str) -> list[str]:
    """A command's words, its comment dropped (``# ...`` outside quotes)."""
    return shlex.split(command, comments=True)


def subcommand(argv: list[str]) -> list[str]:
    """The program and the words before its first option: what ``--help`` is asked of."""
    out = [argv[0]]
    for word in argv[1:]:
        if word.startswith(("-", "[")) or "|" in word:
            break
        out.append(word)
    return out


def options(command: str) -> set[str]:
    """The long options a command line uses (``[--once]`` included)."""
    return set(_OPTION.findall(command.split(" #", 1)[0]))


def named_tests(text: str) -> set[str]:
    """The tests a document names: ``tests/x/test_y.py`` or ``tests/x/test_y.py::test_z``."""
    return set(_TEST_REF.findall(text))


def relative_links(text: str) -> set[str]:
    """The link targets inside the repository (no scheme, no bare anchor), anchors dropped."""
    targets = set()
    for target in _LINK.findall(text):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        targets.add(target.split("#", 1)[0])
    return targets
