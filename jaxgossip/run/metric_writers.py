"""TensorBoard event files of a run's metrics (edge module: file I/O; optional extra).

Writes the rows of ``metrics.json`` as TensorBoard scalars through ``tensorboardX`` (install with
``pip install 'jaxgossip[tensorboard]'``), so runs can be compared in ``tensorboard --logdir``.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence

__all__ = ["SCALAR_TAGS", "scalar_tag", "write_tensorboard"]

# metrics.json column -> TensorBoard tag (the group before the slash is a TensorBoard section).
# Other numeric columns (wall time, cost-model fields) are written as "other/<column>".
SCALAR_TAGS = {
    "test_acc": "accuracy/test_acc",  # the averaged model
    "node_acc_mean": "accuracy/node_acc_mean",
    "node_acc_min": "accuracy/node_acc_min",
    "node_acc_max": "accuracy/node_acc_max",
    "train_loss": "loss/train_loss",
    "test_loss": "loss/test_loss",
    "node_loss_mean": "loss/node_loss_mean",
    "consensus": "consensus/consensus",
    "MB_per_node": "communication/MB_per_node",
    "bits_mean": "communication/bits_mean",
    "bits_max": "communication/bits_max",
}


def scalar_tag(column: str, phase: str | None = None) -> str:
    """The tag of a metrics column; rows of a phase other than "train" (the final merge) get the
    phase as a prefix (``merged/accuracy/test_acc``)."""
    tag = SCALAR_TAGS.get(column, f"other/{column}")
    return tag if phase in (None, "train") else f"{phase}/{tag}"


def _summary_writer():
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise ImportError("TensorBoard output needs tensorboardX: pip install 'jaxgossip[tensorboard]'") from None
    return SummaryWriter


def write_tensorboard(log_dir: str, rows: Sequence[Mapping]) -> list[str]:
    """Writes every numeric column of ``rows`` as a scalar at step ``row["round"]``.

    The event files written here before are replaced, so ``rows`` is the whole history of the run
    (calling this again after a resumed run gives one curve per tag, without duplicate points).

    Args:
      log_dir: the folder of this run's event files (created if missing).
      rows: the ``metrics.json`` rows: dicts with an int ``"round"``, numbers (``test_acc``,
        ``node_acc_mean``/``min``/``max``, ``consensus``, ``MB_per_node``, ``bits_mean``, losses,
        ...) and optionally a ``"phase"`` string. None, strings and booleans are skipped.

    Returns:
      The tags written.

    Raises:
      ImportError: tensorboardX is not installed (the message names the pip extra).
    """
    SummaryWriter = _summary_writer()
    os.makedirs(log_dir, exist_ok=True)
    for path in glob.glob(os.path.join(log_dir, "events.out.tfevents.*")):
        os.remove(path)
    tags = []
    writer = SummaryWriter(log_dir)
    try:
        for row in rows:
            step = int(row["round"])
            for column, value in row.items():
                if column in ("round", "phase") or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                tag = scalar_tag(column, row.get("phase"))
                writer.add_scalar(tag, float(value), step)
                if tag not in tags:
                    tags.append(tag)
    finally:
        writer.close()
    return tags
