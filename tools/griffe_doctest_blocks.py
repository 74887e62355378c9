"""A Griffe extension for the API reference (mkdocs.yml): doctest blocks become code.

keras-adapt's docstrings carry their examples as doctest blocks (``>>>``
lines and their output, ended by a blank line), which ``tests/test_docstrings.py``
runs. Markdown knows no doctest blocks: it would render them as running text
and read outputs such as ``[0, 1]`` as link references. This extension wraps
every such block in a fenced ``pycon`` code block before mkdocstrings parses
the docstring, so the reference shows exactly what the doctest runs. The
docstrings' Sphinx roles (``:class:`~keras_adapt.data.AdaptiveBatchDataset```,
``:meth:`fit```) are shown as code, as Sphinx would show them.

Example:

>>> from griffe_doctest_blocks import fence_doctests
>>> fence_doctests("Text.\\n\\n>>> 1 + 1\\n2\\n\\nMore.").split("\\n")
['Text.', '', '```pycon', '>>> 1 + 1', '2', '```', '', 'More.']
"""

import re

import griffe

__all__ = ["DoctestBlocks", "fence_doctests", "roles_as_code"]

# :role:`target`, :role:`~a.b.Name`, :role:`title <target>`
_ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj):`(~?)([^`<]+?)(?:\s*<[^`>]+>)?`")


def roles_as_code(text):
    """``text`` with each Sphinx cross-reference role shown as inline code:
    the title if it has one, the last name after ``~``, else the target.

    Example:

    >>> from griffe_doctest_blocks import roles_as_code
    >>> roles_as_code(":class:`~a.b.Model`, :meth:`fit`, :meth:`Files.x <a.Files.x>`")
    '`Model`, `fit`, `Files.x`'
    """
    def code(match):
        tilde, target = match.group(1), match.group(2).strip()
        return "`" + (target.rsplit(".", 1)[-1] if tilde else target) + "`"
    return _ROLE.sub(code, text)


def fence_doctests(text):
    """``text`` with each doctest block wrapped in a fenced ``pycon`` block
    (at the block's indentation); blocks already inside a fence are left alone.

    Example: see the module's.
    """
    out, in_fence, in_doctest, indent = [], False, False, ""
    for line in text.split("\n"):
        stripped = line.strip()
        if in_doctest and not stripped:
            out.append(indent + "```")
            in_doctest = False
        if not in_doctest and stripped.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and not in_doctest and (stripped == ">>>"
                                                  or stripped.startswith(">>> ")):
            indent = line[:len(line) - len(line.lstrip())]
            out.append(indent + "```pycon")
            in_doctest = True
        out.append(line)
    if in_doctest:
        out.append(indent + "```")
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    """Fences the doctest blocks of every docstring Griffe loads and shows
    its Sphinx roles as code.

    Example (mkdocs.yml)::

        plugins:
          - mkdocstrings:
              handlers:
                python:
                  options:
                    extensions: [tools/griffe_doctest_blocks.py:DoctestBlocks]
    """

    def on_instance(self, *, node, obj, agent, **kwargs):
        if obj.docstring is not None:
            obj.docstring.value = roles_as_code(fence_doctests(obj.docstring.value))
