"""Bench the photo-library features (faste_mm/tools/library_costs.py): OCR per photo and per scanned
page, duplicates over 100k synthetic vectors, an idle watcher's CPU. Writes JSON with the commit, CPU
flags and load averages. Usage: python scripts/bench_library.py OUT.json [--quick]"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from faste_mm.tools.library_costs import duplicates_cost, ocr_cost, watch_idle_cpu  # noqa: E402
from tests.test_ocr import invoice_image, plate_photo, scanned_pdf  # noqa: E402  (the tests' rendered text)


def cpu_flags() -> list[str]:
    wanted = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8"}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return sorted(wanted & set(line.split(":", 1)[1].split()))
    return []


def main() -> None:
    out, quick = Path(sys.argv[1]), "--quick" in sys.argv
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"command": " ".join(sys.argv), "commit": commit, "cpu": platform.processor() or platform.machine(),
              "cpu_flags": cpu_flags(), "cores": os.cpu_count(), "load_start": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        photos = []
        for i in range(3):
            photos.append(plate_photo(tmp / f"car{i}.jpg"))
            photos.append(invoice_image(tmp / f"invoice{i}.png"))
        # a 12-megapixel phone photo with a plate in it: decoded, then read at OCR_MAX_PIXELS
        from PIL import Image

        big = Image.open(photos[0]).resize((4000, 3000))
        big.save(tmp / "phone.jpg", quality=90)
        photos.append(tmp / "phone.jpg")
        pages = [(scanned_pdf(tmp / f"scan{i}.pdf"), 1) for i in range(3)]
        result["ocr"] = ocr_cost(photos, pages, rounds=1 if quick else 2)
        print("ocr", result["ocr"], flush=True)
        result["duplicates"] = [duplicates_cost(tmp / f"dups{d}", n=20_000 if quick else 100_000, dim=d)
                                for d in (256,)]
        print("duplicates", result["duplicates"], flush=True)
        result["watch_idle"] = watch_idle_cpu(tmp / "watched", tmp / "watchcol", n_files=2_000 if quick else 10_000,
                                              idle_s=20 if quick else 120)
        print("watch", result["watch_idle"], flush=True)
    result["load_end"] = os.getloadavg()
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
