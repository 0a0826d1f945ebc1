"""Example configs shipped with the package, usable by bare name from any folder.

``jaxgossip train --config digits_choco.yaml`` reads ``digits_choco.yaml`` from the current folder
when there is one, and else the file of that name here (see
:func:`jaxgossip.run.config_files.read_config_file`), so the examples of the README work from a wheel
as from a checkout. Each file's first line is the command that runs it:

* ``digits_choco.yaml``: ``jaxgossip train``, Choco-SGD top-10 % on the embedded digits;
* ``digits_sweep.yaml``: ``jaxgossip sweep``, learning rate x gamma x seeds in one compile;
* ``consensus_ring.yaml``: ``jaxgossip consensus``, exact and compressed gossip compared;
* ``topology_sweep.yaml``: ``jaxgossip topology-sweep``, eight graph families at three sizes;
* ``demo_mild.yaml``: ``jaxgossip demo`` with a milder non-IID split.

Copy one (:func:`path` names it) to change it. The paper recipes, Python configs of CIFAR-10 runs,
stay with the experiments of a checkout (``experiments/configs/*.py``).
"""

from __future__ import annotations

import os

__all__ = ["FOLDER", "names", "path"]

#: The folder of the shipped configs (inside the installed package).
FOLDER = os.path.dirname(os.path.abspath(__file__))

_SUFFIXES = (".yaml", ".yml", ".json")


def names() -> list[str]:
    """The file names of the shipped configs, sorted (``["consensus_ring.yaml", ...]``)."""
    return sorted(f for f in os.listdir(FOLDER) if f.endswith(_SUFFIXES))


def path(name: str) -> str | None:
    """The path of the shipped config ``name`` (a bare file name such as ``digits_choco.yaml``), or
    None when no shipped config has that name (a name with a folder in it never does)."""
    if os.path.basename(name) != name or name not in names():
        return None
    return os.path.join(FOLDER, name)
