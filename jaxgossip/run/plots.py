"""Figures and text tables for runs (edge module: matplotlib and files)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "plot_training",
    "plot_comparison",
    "training_figure",
    "TRAINING_PANELS",
    "LOSS_PANELS",
    "plot_consensus",
    "plot_topology",
    "plot_design_curves",
    "plot_sweep",
    "plot_topology_sweep",
    "plot_topology_training",
    "plot_gamma_tuning",
    "format_table",
    "table_legend",
    "LEGEND",
]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str) -> str:
    """Lays out ``fig``, writes it to ``path`` (folders created) and closes it."""
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


# The panels of plot_training, each written to <key>.png: x key, y key, x label, y label, log x axis.
TRAINING_PANELS = {
    "accuracy_vs_rounds": ("round", "test_acc", "rounds", "test accuracy (averaged model)", False),
    "accuracy_vs_bits": ("MB_per_node", "test_acc", "MB sent per node", "test accuracy (averaged model)", True),
    "accuracy_vs_time": ("sim_s", "test_acc", "simulated seconds", "test accuracy (averaged model)", False),
    "consensus": ("round", "consensus", "rounds", "consensus distance", False),
    "perplexity_vs_rounds": ("round", "perplexity", "rounds", "perplexity (averaged model)", False),
    "perplexity_vs_bits": ("MB_per_node", "perplexity", "MB sent per node", "perplexity (averaged model)", True),
}


# Further panels of plot_comparison (same fields as TRAINING_PANELS): the training loss, the
# objective every method minimises, against the same three budgets as the accuracy.
LOSS_PANELS = {
    "loss_vs_rounds": ("round", "train_loss", "rounds", "training loss", False),
    "loss_vs_bits": ("MB_per_node", "train_loss", "MB sent per node", "training loss", True),
    "loss_vs_time": ("sim_s", "train_loss", "simulated seconds", "training loss", False),
}


def _merged(row: Mapping) -> bool:
    return row.get("phase") == "merged"


def training_figure(runs: Mapping[str, Sequence[dict]], panel: str, title: str = ""):
    """One panel of :func:`plot_training` as a matplotlib figure (the caller saves and closes it).

    In the consensus panel (log y axis) the row of a final merge (``phase == "merged"``, see
    ``jaxgossip.run.runner``) is not joined to its run's curve: an exact or near-exact merge drops
    the distance to 0 or ~1e-13, many decades below training, and would flatten every other curve.
    The y range is set by the training rows (all runs); each merge is a triangle of its run's colour
    at its round, at its value when that lies in the range, else on the nearer edge (the bottom for
    a merge below the range), with the merged value in the legend.

    Args:
      runs: name -> metric rows (``jaxgossip.run.runner.metrics_to_rows``, a merge row last).
      panel: a key of :data:`TRAINING_PANELS` or :data:`LOSS_PANELS`.
    """
    known = {**TRAINING_PANELS, **LOSS_PANELS}
    if panel not in known:
        raise ValueError(f"panel={panel!r} is unknown; known: {', '.join(known)}")
    xkey, ykey, xlabel, ylabel, logx = known[panel]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    consensus = ykey == "consensus"
    merges, positive = [], False
    for name, rows in runs.items():
        if not rows:
            continue
        shown = [r for r in rows if not (consensus and _merged(r))]
        xs = np.array([r[xkey] for r in shown], dtype=float)
        ys = np.array([r[ykey] for r in shown], dtype=float)
        (line,) = ax.plot(xs, ys, marker="o", markersize=3, label=name)
        positive |= bool(np.any(ys > 0))
        if consensus:
            merges += [(name, line.get_color(), float(r[xkey]), float(r[ykey])) for r in rows if _merged(r)]
    if logx:
        ax.set_xscale("log")
    if consensus:
        if positive:  # exact averaging (all-reduce) has consensus distance 0 throughout: a linear axis
            ax.set_yscale("log")
        if merges:
            _mark_merges(ax, merges)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # no curve when every run diverged: an empty panel, no legend
        ax.legend(fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    return fig


def _mark_merges(ax, merges: list[tuple[str, str, float, float]]) -> None:
    """Fixes the log y range to the training curves already drawn and marks each (name, colour,
    round, merged value) with a triangle, on the edge when the value lies outside the range."""
    low, high = ax.get_ylim()
    ax.set_ylim(low, high)  # frozen: the markers below must not widen it
    for name, colour, x, value in merges:
        inside = bool(np.isfinite(value)) and low <= value <= high
        y = value if inside else (high if value > high else low)
        where = "" if inside else " (off the axis)"
        ax.scatter(
            [x],
            [y],
            marker="v",
            s=60,
            color=colour,
            edgecolors="black",
            zorder=3,
            clip_on=False,
            label=f"{name}, final merge: {value:.1e}{where}",
        )


def plot_training(runs: Mapping[str, Sequence[dict]], out_dir: str, title: str = "") -> list[str]:
    """Writes accuracy vs rounds, vs MB sent per node and vs simulated time, and consensus distance
    vs rounds (:func:`training_figure`: a final merge is marked, not drawn as the curve's last point).

    Args:
      runs: name -> metric rows (``jaxgossip.run.runner.metrics_to_rows``, with the cost fields of
        ``jaxgossip.cli.common.run_cost`` for the time panel).
      out_dir: folder for ``accuracy_vs_rounds.png``, ``accuracy_vs_bits.png``,
        ``accuracy_vs_time.png`` (only when every row has ``sim_s``), ``consensus.png``, and for
        next-token models (rows with ``perplexity``) ``perplexity_vs_rounds.png`` and
        ``perplexity_vs_bits.png``.

    Returns:
      The paths written.
    """
    os.makedirs(out_dir, exist_ok=True)
    timed = all("sim_s" in row for rows in runs.values() for row in rows)
    perplexity = all("perplexity" in row for rows in runs.values() for row in rows)
    panels = [
        p
        for p in TRAINING_PANELS
        if (timed or TRAINING_PANELS[p][0] != "sim_s") and (perplexity or TRAINING_PANELS[p][1] != "perplexity")
    ]
    return [_save(training_figure(runs, panel, title), os.path.join(out_dir, panel + ".png")) for panel in panels]


def plot_comparison(runs: Mapping[str, Sequence[dict]], out_dir: str, title: str = "") -> list[str]:
    """Overlays finished runs: the panels of :func:`plot_training` and the training loss
    (:data:`LOSS_PANELS`) against rounds, MB sent per node and, when every row has ``sim_s``,
    simulated time.

    Args:
      runs: name -> metric rows (the ``rows`` of each run's ``metrics.json``).
      out_dir: folder for the PNGs, one per panel (``<panel>.png``).

    Returns:
      The paths written.
    """
    paths = plot_training(runs, out_dir, title)
    timed = all("sim_s" in row for rows in runs.values() for row in rows)
    panels = [p for p in LOSS_PANELS if timed or LOSS_PANELS[p][0] != "sim_s"]
    paths += [_save(training_figure(runs, panel, title), os.path.join(out_dir, panel + ".png")) for panel in panels]
    return paths


def plot_consensus(
    curves: Mapping[str, tuple[np.ndarray, np.ndarray]], path: str, title: str = "", bits_unit: float = 8e6
) -> str:
    """Consensus error vs rounds and vs bits (two panels).

    Args:
      curves: name -> (error [S + 1], cumulative bits [S + 1]).
      path: PNG path.
      bits_unit: divisor for the bits axis (8e6: MB).
    """
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, (error, bits) in curves.items():
        error = np.asarray(error, dtype=float)
        ax1.plot(np.arange(error.size), error, label=name)
        sent = np.asarray(bits, dtype=float) / bits_unit
        keep = sent > 0  # a log axis; rounds before the first bit sent have nothing to show
        ax2.plot(sent[keep], error[keep], label=name)
    for ax, xlabel in ((ax1, "rounds"), (ax2, "MB sent (all nodes)" if bits_unit == 8e6 else "bits")):
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("consensus error")
        ax.grid(alpha=0.3)
    ax2.set_xscale("log")
    ax1.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def plot_gamma_tuning(result, path: str, title: str = "") -> str:
    """Two panels of a :class:`jaxgossip.engine.tuning.GammaTuning`: relative consensus error vs rounds
    for every step size (colour = step size; contracting solid, the others dashed), and the final
    relative error vs step size with the largest contracting and the recommended value marked."""
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    gammas = np.asarray(result.gammas, dtype=float)
    error = np.asarray(result.error, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        rel = error / error[:, :1]
    colours = plt.get_cmap("viridis")(np.linspace(0, 1, gammas.size))
    for g, gamma in enumerate(gammas):
        shown = np.where(np.isfinite(rel[g]) & (rel[g] > 0), rel[g], np.nan)
        ax1.plot(shown, color=colours[g], lw=1, ls="-" if result.contracts[g] else "--", label=f"{gamma:.3g}")
    ax1.set_yscale("log")
    ax1.set_xlabel("rounds")
    ax1.set_ylabel("consensus error / initial")
    ax1.legend(fontsize=6, ncol=2, title=result.option, title_fontsize=7)
    final = np.where(np.isfinite(rel[:, -1]) & (rel[:, -1] > 0), rel[:, -1], np.nan)
    ax2.plot(gammas, final, "o-", ms=3)
    bad = ~np.asarray(result.contracts, dtype=bool)
    ax2.scatter(gammas[bad], final[bad], color="red", zorder=3, s=12, label="does not contract")
    if result.largest_contracting is not None:
        label = f"largest contracting {result.largest_contracting:.3g}"
        ax2.axvline(result.largest_contracting, color="gray", ls="--", label=label)
    if result.recommended is not None:
        ax2.axvline(result.recommended, color="green", label=f"recommended {result.recommended:.3g}")
    ax2.axhline(1.0, color="black", lw=0.5)
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel(result.option)
    ax2.set_ylabel(f"error after {result.num_steps} rounds / initial")
    ax2.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def plot_design(design, path: str, title: str = "") -> str:
    """The SLEM after every Newton step of a :class:`jaxgossip.design.Design`, with the SLEMs of the
    Metropolis, max-degree and best constant weights of the same graph as horizontal lines."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(np.arange(1, design.history.size + 1), design.history, label="designed", color="black")
    for label, value, colour in (
        ("Metropolis", design.metropolis_slem, "tab:blue"),
        ("max-degree", design.max_degree_slem, "tab:orange"),
        ("best constant", design.best_constant_slem, "tab:green"),
    ):
        ax.axhline(value, ls="--", color=colour, label=f"{label} {value:.4f}")
    ax.set_xlabel("Newton step")
    ax.set_ylabel("SLEM of W")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    return _save(fig, path)


def plot_design_curves(
    history, history_label: str, curves: Mapping[str, np.ndarray], path: str, title: str = ""
) -> str:
    """Two panels: the design's objective after every optimizer step (``history``), and the
    relative squared consensus error per round of each weighting (``curves``: label -> [R + 1])."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    history = np.asarray(history, dtype=np.float64)
    left.plot(np.arange(history.size), history, color="black")
    if np.all(history > 0):
        left.set_yscale("log")
    left.set_xlabel("design step")
    left.set_ylabel(history_label)
    left.grid(alpha=0.3)
    for label, curve in curves.items():
        curve = np.maximum(np.asarray(curve, dtype=np.float64), 1e-30)
        right.semilogy(np.arange(curve.size), curve, label=label)
    right.axhline(1e-6, ls=":", color="grey")
    right.set_xlabel("round")
    right.set_ylabel("consensus error / start")
    right.grid(alpha=0.3)
    right.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, path)


def plot_topology(topo, path: str | None = None, t: int = 0):
    """Draws round ``t`` of a topology with networkx (arrows for directed graphs)."""
    import networkx as nx

    plt = _pyplot()
    w = topo.matrix(t)
    graph = nx.DiGraph() if topo.directed else nx.Graph()
    graph.add_nodes_from(range(topo.num_nodes))
    receivers, senders = np.nonzero(w)
    graph.add_edges_from((int(s), int(r)) for s, r in zip(senders, receivers) if s != r)
    fig, ax = plt.subplots(figsize=(4, 4))
    nx.draw_circular(graph, ax=ax, with_labels=True, node_size=250, font_size=7, arrows=topo.directed)
    ax.set_title(f"{topo.name}, round {t}", fontsize=9)
    if path:
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return fig


def plot_sweep(rows: Sequence[Mapping], axes: Sequence[str], path: str) -> str:
    """Final accuracy (mean +- std over seeds) against the first axis, one line per value of the
    other axes."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    first, rest = axes[0], list(axes[1:])
    # an axis of link specs (text) is categorical: its values at 0, 1, ... in the order given
    labels = list(dict.fromkeys(r[first] for r in rows))
    categorical = any(isinstance(v, str) for v in labels)

    def x(row):
        return labels.index(row[first]) if categorical else row[first]

    def show(value):
        return value if isinstance(value, str) else f"{value:.3g}"

    groups: dict[tuple, list] = {}
    for row in rows:
        groups.setdefault(tuple(row[a] for a in rest), []).append(row)
    diverged = [r for r in rows if r.get("diverged_at_round") is not None]
    for key, group in groups.items():
        group = sorted((r for r in group if r.get("diverged_at_round") is None), key=x)
        if not group:
            continue
        ax.errorbar(
            [x(r) for r in group],
            [r["test_acc"] for r in group],
            yerr=[r["test_acc_std"] for r in group],
            marker="o",
            capsize=3,
            label=", ".join(f"{a.split('.')[-1]}={show(v)}" for a, v in zip(rest, key)) or None,
        )
    for r in diverged:  # marked at the bottom, not plotted as NaN
        ax.scatter([x(r)], [0.0], marker="x", color="red")
        ax.annotate(
            f"diverged at round {r['diverged_at_round']}",
            (x(r), 0.0),
            fontsize=7,
            rotation=90,
            xytext=(3, 3),
            textcoords="offset points",
        )
    if categorical:
        ax.set_xticks(range(len(labels)), [show(v) for v in labels], rotation=20, fontsize=8)
    else:
        ax.set_xscale("log")
    ax.set_xlabel(first.split(".")[-1])
    ax.set_ylabel("test accuracy (averaged model)")
    ax.grid(alpha=0.3)
    if rest and len(groups) > 0 and len(diverged) < len(rows):
        ax.legend(fontsize=8)
    return _save(fig, path)


def _number(value) -> float:
    """``value`` as a float, NaN for None (diverged or not reached)."""
    return float("nan") if value is None else float(value)


def _family(name: str) -> str:
    return name.split("(")[0]


def plot_topology_sweep(rows: Sequence[Mapping], path: str, title: str = "", tol: float | None = None) -> str:
    """Three panels over graphs: final relative consensus error, rounds and MB per node to reach the
    target error, each against the spectral gap (log-log). One marker per family, colour by N.

    Args:
      rows: :func:`jaxgossip.engine.sweeps.topology_rows` output.
      path: PNG file to write.
      tol: the target used for the rows (for the axis labels).
    """
    plt = _pyplot()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    families = sorted({_family(r["name"]) for r in rows})
    sizes = sorted({r["N"] for r in rows})
    cmap = plt.get_cmap("viridis")
    colours = {n: cmap(i / max(1, len(sizes) - 1)) for i, n in enumerate(sizes)}
    markers = dict(zip(families, "osD^v<>ph*Xd"))
    target = f" (error {tol:g})" if tol else ""
    panels = [
        ("final_error", "final relative error"),
        ("rounds_to_tol", "rounds to target" + target),
        ("MB_to_tol", "MB per node to target" + target),
    ]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for ax, (key, label) in zip(axes, panels):
        for r in rows:
            gap, value = _number(r.get("spectral_gap")), _number(r.get(key))
            if np.isfinite(gap) and np.isfinite(value) and gap > 0 and value > 0:
                ax.scatter(gap, value, color=colours[r["N"]], marker=markers[_family(r["name"])], s=36)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("spectral gap 1 - |lambda_2|")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    for fam in families:
        axes[0].scatter([], [], color="gray", marker=markers[fam], label=fam)
    for n in sizes:
        axes[0].scatter([], [], color=colours[n], marker="s", label=f"N={n}")
    axes[0].legend(fontsize=7, ncol=2)
    diverged = [f"{r['name']} (round {r['diverged_at_round']})" for r in rows if r.get("diverged_at_round") is not None]
    if diverged:  # not plotted (their error is NaN/inf): named instead
        fig.text(0.01, 0.01, "diverged, not shown: " + ", ".join(diverged), fontsize=7, color="red")
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def plot_topology_training(rows: Sequence[Mapping], path: str, title: str = "") -> str:
    """Final test accuracy (mean +- std over seeds) against the spectral gap, one point per graph.

    One marker per graph family, each point labelled with its graph. Graphs without a spectral gap
    (column-stochastic only, NaN) are left out.

    Args:
      rows: dicts with ``name``, ``spectral_gap``, ``test_acc`` and ``test_acc_std`` (the rows of
        ``jaxgossip topology-sweep --train``).
      path: PNG file to write.
    """
    plt = _pyplot()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    shown = [
        r
        for r in rows
        if np.isfinite(_number(r.get("spectral_gap"))) and r["spectral_gap"] > 0 and r.get("test_acc") is not None
    ]
    families = sorted({_family(r["name"]) for r in shown})
    markers = dict(zip(families, "osD^v<>ph*Xd"))
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for fam in families:
        mine = [r for r in shown if _family(r["name"]) == fam]
        ax.errorbar(
            [r["spectral_gap"] for r in mine],
            [r["test_acc"] for r in mine],
            yerr=[r["test_acc_std"] for r in mine],
            marker=markers[fam],
            linestyle="none",
            capsize=3,
            label=fam,
        )
    for r in shown:
        ax.annotate(
            r["name"], (r["spectral_gap"], r["test_acc"]), fontsize=7, xytext=(4, 4), textcoords="offset points"
        )
    ax.set_xscale("log")
    ax.set_xlabel("spectral gap 1 - |lambda_2|")
    ax.set_ylabel("final test accuracy (averaged model)")
    ax.grid(True, which="both", alpha=0.3)
    if families:
        ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=9)
    return _save(fig, path)


# Meaning of table headers that are not self-explanatory (printed under Markdown tables).
LEGEND = {
    "acc(avg)": "test accuracy of the model averaged over nodes",
    "acc(nodes)": "mean test accuracy of the nodes' own models",
    "min": "lowest test accuracy of a node's own model",
    "consensus": "mean squared distance of the node models to their average",
    "vs gossip": "MB per node of gossip divided by this run's (x-fold saving)",
    "vs first": "MB per node of the first run divided by this run's (x-fold saving)",
    "+-": "standard deviation over seeds",
    "gap": "spectral gap 1 - |lambda_2| of the mixing matrix",
    "eff. neighbours": "effective number of neighbours at gamma = 0.99 (Vogels et al., NeurIPS 2022; "
    "jaxgossip.topology.effective_neighbors; - where it is not defined)",
    "final rel. error": "||X_R - mean||^2 / ||X_0 - mean||^2 after the last round",
    "final error": "mean squared distance of the nodes to the average after the last round",
    "rounds to tol": "first round with relative error below --tol (mean over seeds; - if never)",
    "comm s": "simulated communication time (time model of --time.*)",
    "comm s/round": "simulated communication time per round",
    "sim s": "simulated wall-clock: compute + communication",
    "status": "ok, or the round where NaN/inf first appeared",
    "e_R/e_0": "consensus error after the last round divided by the initial error",
    "rate/round": "per-round factor of the consensus error over the second half of the rounds (< 1 contracts)",
    "watchdog": "ok, or the round where the consensus distance first grew 10x above its running minimum "
    "(growth) or beyond the averaged model's squared norm (norm); see jaxgossip.run.watchdog",
}


def _cell(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)) and spec:
        try:
            return format(value, spec)
        except ValueError:
            return format(float(value), ".4g")
    return str(value)


def format_table(rows: Sequence[Mapping], columns: Sequence[tuple[str, str, str]], *, markdown: bool = False) -> str:
    """The one table formatter: aligned plain text for terminals, or a Markdown table.

    Args:
      rows: one mapping per row; a missing key, None or NaN shows as ``-``.
      columns: (key, header, format spec) per column; numbers are formatted with the spec.
      markdown: a GitHub Markdown table (numbers right-aligned) instead of plain text.
    """
    header = [h for _, h, _ in columns]
    body = [[_cell(r.get(k), f) for k, _, f in columns] for r in rows]
    numeric = [
        all(isinstance(r.get(k), (int, float)) or r.get(k) is None for r in rows)
        and any(isinstance(r.get(k), (int, float)) for r in rows)
        for k, _, _ in columns
    ]
    widths = [max([len(h)] + [len(b[i]) for b in body]) for i, h in enumerate(header)]
    if markdown:
        lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |"]
        rule = [("-" * (w + 1) + ":") if num else ("-" * (w + 2)) for w, num in zip(widths, numeric)]
        lines.append("|" + "|".join(rule) + "|")
        lines += [
            "| " + " | ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(b, widths, numeric)) + " |"
            for b in body
        ]
        return "\n".join(lines)
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) if num else c.ljust(w) for c, w, num in zip(b, widths, numeric)) for b in body]
    return "\n".join(lines)


def table_legend(columns: Sequence[tuple[str, str, str]]) -> str:
    """One line per header of ``columns`` that :data:`LEGEND` explains (Markdown list)."""
    seen = []
    for _, header, _ in columns:
        if header in LEGEND and header not in seen:
            seen.append(header)
    return "\n".join(f"- `{h}`: {LEGEND[h]}" for h in seen)
