"""Renders the "Open in Colab" badge from the repository address in pyproject.toml.

The address lives in one place, ``Repository`` under ``[project.urls]`` in ``pyproject.toml``
(``https://github.com/OWNER/NAME``). This script writes, between ``<!-- colab-badge -->`` markers,
the badge into the notebook's first cell and into the README, and makes the notebook's install cell
default to ``JAXGOSSIP_SOURCE = "git+<address>"``. Without an address it removes the badge and
leaves the source empty, so the notebook never carries a placeholder that breaks.

    python experiments/colab_badge.py           # rewrite README.md and experiments/colab_demo.ipynb
    python experiments/colab_badge.py --check   # exit 1 if they disagree with pyproject.toml
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "experiments" / "colab_demo.ipynb"
README = ROOT / "README.md"
PYPROJECT = ROOT / "pyproject.toml"
NOTEBOOK_PATH = "experiments/colab_demo.ipynb"  # inside the repository, for the Colab link

START = "<!-- colab-badge: written by experiments/colab_badge.py from pyproject.toml [project.urls] Repository -->"
END = "<!-- /colab-badge -->"
SOURCE_LINE = re.compile(r'^JAXGOSSIP_SOURCE = ".*"', re.M)


def repository(pyproject: pathlib.Path = PYPROJECT) -> str | None:
    """``[project.urls] Repository`` as ``https://github.com/OWNER/NAME``, or None when unset.

    Raises:
      ValueError: the address is set but is not a GitHub repository (Colab opens notebooks from
        GitHub only).
    """
    urls = tomllib.loads(pyproject.read_text()).get("project", {}).get("urls", {})
    url = urls.get("Repository")
    if url is None:
        return None
    match = re.fullmatch(r"https://github\.com/([\w.-]+)/([\w.-]+?)(?:\.git)?/?", str(url).strip())
    if not match:
        raise ValueError(
            f"{pyproject.name} [project.urls] Repository={url!r} must be a GitHub address "
            "https://github.com/OWNER/NAME (Colab opens notebooks from GitHub)"
        )
    return f"https://github.com/{match.group(1)}/{match.group(2)}"


def badge(repo: str | None, branch: str = "main") -> str:
    """The Markdown badge for ``repo`` (empty without one)."""
    if repo is None:
        return ""
    link = repo.replace("https://github.com/", "https://colab.research.google.com/github/", 1)
    return (
        "[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
        f"({link}/blob/{branch}/{NOTEBOOK_PATH})"
    )


def render_text(text: str, repo: str | None, branch: str = "main") -> str:
    """``text`` with the block between the badge markers replaced.

    Raises:
      ValueError: the markers are missing.
    """
    pattern = re.compile(re.escape(START) + r"\n.*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"the badge markers are missing; add the two lines\n{START}\n{END}")
    inner = badge(repo, branch)
    return pattern.sub(lambda _: f"{START}\n{inner}{chr(10) if inner else ''}{END}", text, count=1)


def render_notebook(notebook: dict, repo: str | None, branch: str = "main") -> dict:
    """A copy of ``notebook`` (nbformat 4 JSON) with the badge in its first cell and the install
    cell's default source set from ``repo``."""
    notebook = json.loads(json.dumps(notebook))
    intro, install = notebook["cells"][0], notebook["cells"][1]
    intro["source"] = _lines(render_text("".join(intro["source"]), repo, branch))
    code = "".join(install["source"])
    if not SOURCE_LINE.search(code):
        raise ValueError('the install cell (second cell) has no line JAXGOSSIP_SOURCE = "..."')
    value = f"git+{repo}" if repo else ""
    install["source"] = _lines(SOURCE_LINE.sub(lambda _: f"JAXGOSSIP_SOURCE = {json.dumps(value)}", code, count=1))
    return notebook


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True)


def dump_notebook(notebook: dict) -> str:
    """The notebook as Jupyter writes it (one-space indent, UTF-8, final newline)."""
    return json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if a file is out of date")
    parser.add_argument("--branch", default="main", help="branch the Colab link opens (default main)")
    args = parser.parse_args(argv)
    repo = repository()
    wanted = {
        NOTEBOOK: dump_notebook(render_notebook(json.loads(NOTEBOOK.read_text()), repo, args.branch)),
        README: render_text(README.read_text(), repo, args.branch),
    }
    stale = [path for path, text in wanted.items() if path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(ROOT)} is out of date: run python experiments/colab_badge.py", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(wanted[path])
        print(f"wrote {path.relative_to(ROOT)}")
    print(f"badge: {badge(repo, args.branch) or 'none ([project.urls] Repository is not set in pyproject.toml)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
