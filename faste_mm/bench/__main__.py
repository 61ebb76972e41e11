"""`python -m faste_mm.bench SUITE [OPTIONS]`: the same entry point as `faste-mm bench SUITE`."""

import sys

from faste_mm.cli.bench import bench_app

if __name__ == "__main__":
    bench_app()(sys.argv[1:], prog_name="python -m faste_mm.bench")
