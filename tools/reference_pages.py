"""Writes the API reference pages of the documentation site (docs/reference/).

One page per public module of ``keras_adapt`` (the package's top level
aside, whose page is written by hand): the module's own names (for a
package, what its ``__all__`` exports), then, for a package, each public
submodule with the public names it defines that the package does not
export, so that every public class and function of the library is on the
site exactly once (a function named as its submodule, such as
``keras_adapt.elastic.fit``, under that submodule). mkdocstrings renders each ``:::`` block from the
docstrings (mkdocs.yml); this script only decides what goes where, reading
the source with ``ast`` (nothing is imported).

    python tools/reference_pages.py            # rewrite docs/reference/
    python tools/reference_pages.py --check    # exit 1 listing the pages that differ

tests/test_docs_site.py runs the check, so a new module or function cannot
be left out of the site.

Example:

>>> from reference_pages import public_names
>>> public_names("def f(): pass\\ndef _g(): pass\\nclass C: pass\\nX = 1\\n")
['f', 'C']
"""

import argparse
import ast
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "keras_adapt")
PAGES = os.path.join(ROOT, "docs", "reference")
#: Modules without a page: the command line's plumbing and the version string.
LEFT_OUT = ("cli", "version")


def public_names(source):
    """The public classes and functions a module's source defines at its top level, in order."""
    return [node.name for node in ast.parse(source).body
            if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and not node.name.startswith("_")]


def _read(path):
    with open(path) as f:
        return f.read()


def _exports(source):
    """The names of a module's ``__all__`` (a literal list or tuple), or None."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return [elt.value for elt in node.value.elts]
    return None


def _summary(source):
    doc = ast.get_docstring(ast.parse(source)) or ""
    return doc.split("\n\n")[0].replace("\n", " ").strip()


def modules():
    """``(name, path)`` of every public top-level module and package, sorted."""
    found = []
    for entry in sorted(os.listdir(PACKAGE)):
        path = os.path.join(PACKAGE, entry)
        name = entry[:-3] if entry.endswith(".py") else entry
        if name.startswith("_") or name in LEFT_OUT:
            continue
        if entry.endswith(".py"):
            found.append((name, path))
        elif os.path.isfile(os.path.join(path, "__init__.py")):
            found.append((name, os.path.join(path, "__init__.py")))
    return found


def page(name, path):
    """The Markdown of ``keras_adapt.<name>``'s reference page."""
    source = _read(path)
    full = f"keras_adapt.{name}"
    lines = [f"# {full}", "", _summary(source), "", f"::: {full}"]
    if not path.endswith("__init__.py"):
        return "\n".join(lines) + "\n"
    exported = set(_exports(source) or [])
    folder = os.path.dirname(path)
    for entry in sorted(os.listdir(folder)):
        if not entry.endswith(".py") or entry.startswith("_"):
            continue
        sub = entry[:-3]
        # A name the package exports but that is also its submodule's name
        # (keras_adapt.elastic.fit) is read as the submodule: list it here.
        extra = [n for n in public_names(_read(os.path.join(folder, entry)))
                 if n not in exported or n == sub]
        if extra:
            lines += ["", f"::: {full}.{sub}", "    options:", "      show_root_heading: true",
                      f"      members: [{', '.join(extra)}]"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 listing the pages that differ")
    args = parser.parse_args(argv)
    wanted = {f"keras_adapt.{name}.md": page(name, path) for name, path in modules()}
    differ = []
    for file, text in wanted.items():
        target = os.path.join(PAGES, file)
        current = _read(target) if os.path.exists(target) else None
        if current != text:
            differ.append(file)
            if not args.check:
                with open(target, "w") as f:
                    f.write(text)
    stale = sorted(set(os.listdir(PAGES)) - set(wanted) - {"keras_adapt.md"})
    for file in stale:
        differ.append(file)
        if not args.check:
            os.remove(os.path.join(PAGES, file))
    if args.check and differ:
        print("pages that differ from tools/reference_pages.py's (run it to rewrite them): "
              + ", ".join(differ), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
