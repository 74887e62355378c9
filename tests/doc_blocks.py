"""The fenced code blocks of README.md and docs/**/*.md, and what to do with each.

Our own small reader rather than Sybil or pytest-codeblocks: the rules need
the page's HTML-comment markers, a page-wide namespace for its Python blocks
run in a fresh process, multi-worker blocks under the suite's launcher with
its process cleanup (tests/conftest.py), and an account of every block by
kind; a plain line scan does all of that with no extra dependency, and the
pages stay plain Markdown for mkdocs.

The convention, for the whole repository (the line just before a fence
holds its marker, if any):

- ``python`` blocks run as written, in one namespace per page, in order (a
  later block may use an earlier one's names), each page in a fresh process
  with a fresh temporary working directory (blocks may write ``runs/...``).
- ``<!-- run: horovodrun -np N -->`` before a ``python`` block: the block
  alone (it must be complete) is written to ``train.py`` and run under
  ``horovodrun -np N -H localhost:N --gloo``; it must exit 0.
- ``<!-- run -->`` before a ``bash``/``sh``/``console`` block: its commands
  run under ``bash -e`` in the page's working directory, in order with the
  page's Python blocks (so they may read the ``runs/`` those wrote), with the
  environment's ``bin`` first on PATH (a ``console`` block's commands are its
  ``$ `` lines).
- ``json`` blocks are parsed (one or more JSON values); a value with
  ``kind`` and ``step`` is an event and must have a known kind.
- ``yaml`` blocks are parsed.
- ``text`` blocks are diagrams, formulas and program output: shown, not run.
- ``<!-- not run: REASON -->`` before any block: not run, for that reason.
- ``<!-- invisible-code-block: python`` ... ``-->`` (a comment of several
  lines, no fence): Python that runs in the page's namespace at that place
  (the data and model a fragment uses), hidden on the site.

Any other block (a shell block with no marker, an unknown language, a block
with no language) is an error that names its file and line.
"""

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")
_NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.*?)\s*-->$")
_HOROVODRUN = re.compile(r"^<!--\s*run:\s*horovodrun -np (\d+)\s*-->$")
_RUN = re.compile(r"^<!--\s*run\s*-->$")
_INVISIBLE = "<!-- invisible-code-block: python"
SHELLS = ("bash", "sh", "console")


def pages():
    """README.md and every page under docs/, relative to the checkout."""
    found = sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True))
    return ["README.md"] + [os.path.relpath(p, ROOT) for p in found]


class Block:
    """One fenced block (or invisible code block) of a page and its kind.

    ``kind`` is one of ``python``, ``horovodrun``, ``shell``, ``json``,
    ``yaml``, ``text``, ``not run``, ``invisible`` or ``error``; ``detail``
    holds the not-run reason, the worker count or the error.
    """

    def __init__(self, page, line, lang, code, kind, detail=""):
        self.page, self.line, self.lang, self.code = page, line, lang, code
        self.kind, self.detail = kind, detail

    @property
    def where(self):
        return f"{self.page}:{self.line}"


def _classify(lang, marker):
    if marker and _NOT_RUN.match(marker):
        reason = _NOT_RUN.match(marker).group(1)
        return ("not run", reason) if reason else ("error", "a not-run marker needs a reason")
    if marker and _HOROVODRUN.match(marker):
        if lang != "python":
            return "error", "<!-- run: horovodrun --> marks python blocks only"
        return "horovodrun", _HOROVODRUN.match(marker).group(1)
    if lang in SHELLS:
        if marker and _RUN.match(marker):
            return "shell", ""
        return "error", (f"a {lang} block needs <!-- run --> or <!-- not run: REASON --> "
                         "on the line before it")
    if lang in ("python", "json", "yaml", "text"):
        return lang, ""
    if not lang:
        return "error", "a block needs a language (text for diagrams and output)"
    return "error", f"no rule runs {lang} blocks; mark it <!-- not run: REASON -->"


def read_page(page):
    """The blocks of ``page`` (relative to the checkout), in order."""
    lines = open(os.path.join(ROOT, page), encoding="utf-8").read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped == _INVISIBLE:
            j = i + 1
            while lines[j].strip() != "-->":
                j += 1
            blocks.append(Block(page, i + 1, "python", "\n".join(lines[i + 1:j]), "invisible"))
            i = j + 1
            continue
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m.group(1)), m.group(2), m.group(3)
        j = i + 1
        while not lines[j].strip().startswith(fence):
            j += 1
        code = "\n".join(l[indent:] for l in lines[i + 1:j])
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = lines[k].strip() if k >= 0 and lines[k].strip().startswith("<!--") else ""
        kind, detail = _classify(lang, marker)
        blocks.append(Block(page, i + 1, lang, code, kind, detail))
        i = j + 1
    return blocks


def count_fences(page):
    """The fenced blocks of ``page`` by a plain scan: opening fence lines."""
    n, inside = 0, None
    for line in open(os.path.join(ROOT, page), encoding="utf-8"):
        s = line.strip()
        if inside is None and (s.startswith("```") or s.startswith("~~~")):
            inside, n = s[:3], n + 1
        elif inside is not None and s.startswith(inside):
            inside = None
    return n


def shell_commands(block):
    """The commands of a shell block: a console block's ``$ `` lines, else it all."""
    if block.lang != "console":
        return block.code
    return "\n".join(l[2:] for l in block.code.split("\n") if l.startswith("$ "))
