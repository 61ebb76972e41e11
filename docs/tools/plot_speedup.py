"""The README's plot: FastE's end-to-end speed-up over the full forward against r_max, read from
committed `faste-mm bench` results (docs/bench/*.json), never typed in by hand.

    python docs/tools/plot_speedup.py            # writes docs/figures/faste-speedup.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

DOCS = Path(__file__).resolve().parents[1]
# (committed result, label): 1,000-token texts on the same 2-core CPU, one bench run each
RUNS = (("cpu_qwen3-vl-embedding-2b_scale0.25_text1000.json", "Qwen3-VL-Embedding-2B shape, 1/4 width"),
        ("cpu_qwen3-embedding-0.6b_scale0.5_text1000.json", "Qwen3-Embedding-0.6B shape, 1/2 width"))


def faste_points(result: dict) -> tuple[list[float], list[float], list[float]]:
    """(r_max, measured end-to-end speed-up, FLOPs-implied speed-up) of the full and FastE rows."""
    rows = sorted((s for s in result["settings"] if s.get("r_max") is not None), key=lambda s: s["r_max"])
    return [s["r_max"] for s in rows], [s["e2e_speedup"] for s in rows], [s["flops_implied_speedup"] for s in rows]


def plot(out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=120)
    for (name, label), colour in zip(RUNS, ("#4f46e5", "#db2777")):
        r_max, measured, implied = faste_points(json.loads((DOCS / "bench" / name).read_text()))
        ax.plot(r_max, measured, "o-", color=colour, label=f"{label}: measured")
        ax.plot(r_max, implied, "--", color=colour, alpha=0.5, label="  FLOPs-implied")
    ax.axhline(1.0, color="#888", linewidth=0.8)
    ax.set_xlabel("r_max (largest share of prefix tokens removed)")
    ax.set_ylabel("speed-up over full forward")
    ax.set_title("FastE on 1,000-token texts, 2 CPU cores (float32, random weights)", fontsize=9)
    ax.legend(fontsize=7, frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out


if __name__ == "__main__":
    print(plot(Path(sys.argv[1]) if len(sys.argv) > 1 else DOCS / "figures" / "faste-speedup.png"))
