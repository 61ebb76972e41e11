"""The plots of docs/performance.md, drawn from committed result JSON (docs/bench/) so a figure
and its numbers cannot part: FastE's measured forward speed-up against r_max beside the
FLOPs-implied one (model-suite results), and seconds per item against the pixel cap (a pixels-
suite result). Reads the one schema (`rows`) and the model suite's older reports (`settings`).

    python -m faste_mm.bench.plots speedup docs/bench/A.json docs/bench/B.json --out docs/speedup-vs-rmax.png
    python -m faste_mm.bench.plots pixels docs/bench/pixels.json --out docs/seconds-vs-pixels.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from faste_mm.errors import ConfigError


def rows_of(path: Path) -> tuple[list[dict], dict]:
    """(rows, the facts around them) of a result file: the one schema, or an older model report."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ConfigError(f"{path}: not a readable result JSON ({error})") from None
    if "rows" in data:
        return data["rows"], {**data.get("params", {}), "device": data.get("device"), "commit": data.get("commit")}
    if "settings" in data:
        return data["settings"], {key: value for key, value in data.items() if key != "settings"}
    raise ConfigError(f"{path}: neither a faste-mm bench result (rows) nor a model report (settings)")


def speedup_plot(paths: list[Path], out: Path) -> Path:
    """Forward speed-up (solid) and FLOPs-implied speed-up (dashed) against r_max, one colour per file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for path in paths:
        rows, facts = rows_of(path)
        points = sorted((row["r_max"], row["forward_speedup"], row["flops_implied_speedup"]) for row in rows
                        if row.get("r_max") is not None)
        if not points:
            raise ConfigError(f"{path}: no FastE settings (rows with an r_max) to plot")
        r, measured, implied = zip(*points)
        label = facts.get("inputs") or path.stem  # the model suite's label names the inputs and the shape
        line, = axes.plot(r, measured, marker="o", label=f"{label}: measured")
        axes.plot(r, implied, linestyle="--", color=line.get_color(), label="  FLOPs-implied")
    axes.set_xlabel("r_max (share of prefix tokens removed)")
    axes.set_ylabel("forward speed-up over the full forward")
    return _saved(figure, axes, out)


def pixels_plot(path: Path, out: Path) -> Path:
    """Seconds per item (and the vision tower's part) against the pixel cap, per kind and dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, facts = rows_of(path)
    figure, axes = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    for kind, dtype in sorted({(row["kind"], row["dtype"]) for row in rows}):
        points = sorted((row["max_pixels"] / 1e6, row["s_per_item"], row["tower_s_per_item"]) for row in rows
                        if row["kind"] == kind and row["dtype"] == dtype)
        pixels, seconds, tower = zip(*points)
        line, = axes.plot(pixels, seconds, marker="o", label=f"{kind}, {dtype}: s / item")
        axes.plot(pixels, tower, linestyle="--", color=line.get_color(), label="  of which the vision tower")
    axes.set_xlabel("pixel cap (megapixels, index --max-pixels)")
    axes.set_ylabel("seconds per item")
    axes.set_title(f"{facts.get('shape', '')} x{facts.get('scale_hidden', '')} on {facts.get('device') or '?'}", fontsize=8)
    return _saved(figure, axes, out)


def _saved(figure, axes, out: Path) -> Path:
    """Both plots' finish: a light grid, a small legend, the PNG written, the figure freed."""
    import matplotlib.pyplot as plt

    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(out)
    plt.close(figure)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plot", choices=("speedup", "pixels"))
    parser.add_argument("results", type=Path, nargs="+", help="result JSON files (docs/bench/)")
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = parser.parse_args(argv)
    try:
        if args.plot == "speedup":
            speedup_plot(args.results, args.out)
        else:
            pixels_plot(args.results[0], args.out)
    except ConfigError as error:
        parser.exit(1, f"Error: {error}\n")


if __name__ == "__main__":
    main()
