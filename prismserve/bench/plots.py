"""PNG plots of load runs: latency CDFs, throughput bars, SLO attainment curves (matplotlib, the `bench` extra)."""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("plots need matplotlib: pip install 'prismserve[bench]'") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def latency_cdf(latencies: dict[str, list[float]], path: str | Path, title: str = "Request latency") -> Path:
    """One CDF curve per label (seconds on x)."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(6, 4))
    for label, values in latencies.items():
        ordered = sorted(values)
        if ordered:
            axes.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=label)
    axes.set(xlabel="latency (s)", ylabel="fraction of requests", title=title, ylim=(0, 1.01))
    axes.grid(alpha=0.3)
    axes.legend()
    return _save(figure, plt, path)


def throughput_bars(
    throughput: dict[str, float],
    path: str | Path,
    predicted: dict[str, float] | None = None,
    title: str = "Throughput",
) -> Path:
    """Measured req/s per deployment, with the planner's prediction beside each bar when given."""
    plt = _pyplot()
    labels = list(throughput)
    figure, axes = plt.subplots(figsize=(max(4, 1.3 * len(labels) + 1), 4))
    width = 0.4 if predicted else 0.6
    xs = range(len(labels))
    axes.bar(
        [x - (width / 2 if predicted else 0) for x in xs],
        [throughput[k] for k in labels],
        width,
        label="measured",
    )
    if predicted:
        axes.bar(
            [x + width / 2 for x in xs],
            [predicted.get(k, 0.0) for k in labels],
            width,
            label="predicted",
            alpha=0.6,
        )
        axes.legend()
    axes.set_xticks(list(xs), labels, rotation=20)
    axes.set(ylabel="requests/s", title=title)
    axes.grid(axis="y", alpha=0.3)
    return _save(figure, plt, path)


def attainment_curves(
    curves: dict[str, list[tuple[float, float]]],
    goodput: dict[str, float],
    path: str | Path,
    title: str = "SLO attainment",
) -> Path:
    """SLO attainment against per-GPU rate, one curve per deployment, a dashed line at 90 % and a
    dotted one at each deployment's goodput (as TriInfer's Figure 9 draws them)."""
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(6, 4))
    for label, points in curves.items():
        (line,) = axes.plot([r for r, _ in points], [100 * a for _, a in points], marker=".", label=label)
        if goodput.get(label):
            axes.axvline(goodput[label], color=line.get_color(), linestyle=":", alpha=0.7)
    axes.axhline(90, color="gray", linestyle="--", alpha=0.7)
    axes.set(xlabel="request rate (req/s per GPU)", ylabel="SLO attainment (%)", title=title, ylim=(0, 101))
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small", loc="lower left")
    return _save(figure, plt, path)


def _save(figure, plt, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
