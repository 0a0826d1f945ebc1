"""The README's quickstart block runs as written."""

import os
import re

README = os.path.join(os.path.dirname(__file__), os.pardir, "README.md")


def test_readme_quickstart_runs(capsys):
    text = open(README).read()
    section = text.split("## Quickstart", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(block, "README quickstart", "exec"), {})
    out = capsys.readouterr().out
    assert "->" in out and "MB" in out
