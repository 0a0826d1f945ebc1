"""Every relative Markdown link in the repository's pages (README, docs/, experiments/ pages and
result tables) names a file or folder that exists. Web links and in-page anchors are not checked."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
SKIP = {".git", ".ci-venv", ".venv", "runs", ".cache", "node_modules", "build", "dist"}
LINK = re.compile(r"\]\(([^)\s]+)\)")


def pages():
    return sorted(
        p for p in ROOT.rglob("*.md") if not SKIP & set(p.relative_to(ROOT).parts[:-1]) and ".egg-info" not in str(p)
    )


def test_relative_links_resolve():
    found = pages()
    assert ROOT / "README.md" in found and any("studies" in p.parts for p in found)
    broken = []
    for page in found:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-zA-Z][a-zA-Z+.-]*:", target) or target.startswith("#"):
                continue  # a web or mail address, or an anchor in the same page
            path = target.split("#", 1)[0]
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)
