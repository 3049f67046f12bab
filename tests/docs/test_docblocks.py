"""``docblocks``: how a document's code blocks are found and read (no I/O)."""

from __future__ import annotations

import docblocks
import pytest

DOC = """# Title

```sh
make run   # a comment
```

- a list item:

  ```python no-run
  spark.read.load()
  ```

~~~text
output
~~~
```
"""


def test_blocks_with_language_flags_and_indentation() -> None:
    found = docblocks.blocks(DOC.rsplit("```", 1)[0], "README.md")
    assert [(b.line, b.lang, b.flags, b.text) for b in found] == [
        (3, "sh", frozenset(), "make run   # a comment\n"),
        (9, "python", frozenset({"no-run"}), "spark.read.load()\n"),
        (13, "text", frozenset(), "output\n"),
    ]
    assert [(b.runs, b.illustrative) for b in found] == [
        (True, False),
        (False, True),
        (False, False),
    ]
    assert found[0].name == "README.md:3"


def test_an_unclosed_fence_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"README.md:16: the fence is never closed"):
        docblocks.blocks(DOC, "README.md")


def test_commands_join_continuations_and_drop_comments() -> None:
    script = "# setup\n.venv/bin/dcpkv server \\\n  --port 11210   # note\n\necho hi\n"
    assert docblocks.commands(script) == [
        ".venv/bin/dcpkv server    --port 11210   # note",
        "echo hi",
    ]


@pytest.mark.parametrize(
    ("command", "argv", "sub", "opts"),
    [
        (
            ".venv/bin/dcpkv cluster add-node HOST:PORT --url ...  # joins --empty",
            [".venv/bin/dcpkv", "cluster", "add-node", "HOST:PORT", "--url", "..."],
            [".venv/bin/dcpkv", "cluster", "add-node", "HOST:PORT"],
            {"--url"},
        ),
        (
            ".venv/bin/dcpkv view run revenue [--once] [--mirror mirror/]",
            [".venv/bin/dcpkv", "view", "run", "revenue", "[--once]", "[--mirror", "mirror/]"],
            [".venv/bin/dcpkv", "view", "run", "revenue"],
            {"--once", "--mirror"},
        ),
        ("make test", ["make", "test"], ["make", "test"], set()),
    ],
)
def test_words_subcommand_and_options(
    command: str, argv: list[str], sub: list[str], opts: set[str]
) -> None:
    assert docblocks.words(command) == argv
    assert docblocks.subcommand(argv) == sub
    assert docblocks.options(command) == opts


def test_transcript() -> None:
    script = "$ echo a\na\n$ echo b; echo c\nb\nc\n"
    assert docblocks.is_transcript(script)
    assert docblocks.transcript(script) == (["echo a", "echo b; echo c"], "a\nb\nc")
    assert not docblocks.is_transcript("echo a\n")


def test_references_and_links() -> None:
    text = (
        "see `tests/server/test_x.py::test_y` and tests/chaos/chaos.py; "
        "[a](docs/a.md#part), [b](https://example.org/b), [c](#here), [d](../bench/README.md)"
    )
    assert docblocks.named_tests(text) == {
        "tests/server/test_x.py::test_y",
        "tests/chaos/chaos.py",
    }
    assert docblocks.relative_links(text) == {"docs/a.md", "../bench/README.md"}
