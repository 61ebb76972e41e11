"""faste_mm.datasets: evaluation data loaders (MMEB format)."""
