"""`python -m faste_mm.bench SUITE [OPTIONS]`: the same entry point as `faste-mm bench SUITE`."""

import sys

from faste_mm.cli.app import app

if __name__ == "__main__":
    app(["bench", *sys.argv[1:]], prog_name="python -m faste_mm.bench")
