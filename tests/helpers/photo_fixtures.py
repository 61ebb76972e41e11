"""Real photo files for the metadata tests, written the way cameras and editors write them: EXIF
(date, offset, camera, lens, GPS, orientation) through Pillow's Exif, XMP packets embedded in the
JPEG's APP1 segment, IPTC-IIM in a Photoshop APP13 segment, a HEIC through pillow-heif."""

from __future__ import annotations

import struct
from fractions import Fraction
from pathlib import Path

import numpy as np
from PIL import Image, TiffImagePlugin

XMP_TEMPLATE = """<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?>
<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">
<rdf:Description rdf:about="" xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:xmp="http://ns.adobe.com/xap/1.0/"
  xmp:Rating="{rating}">
 <dc:title><rdf:Alt><rdf:li xml:lang="x-default">{title}</rdf:li></rdf:Alt></dc:title>
 <dc:description><rdf:Alt><rdf:li xml:lang="x-default">{description}</rdf:li></rdf:Alt></dc:description>
 <dc:subject><rdf:Bag>{keywords}</rdf:Bag></dc:subject>
</rdf:Description></rdf:RDF></x:xmpmeta>
<?xpacket end="w"?>"""

BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
<!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">]>
<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">
<rdf:Description xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:subject><rdf:Bag><rdf:li>&lol4;</rdf:li>
</rdf:Bag></dc:subject></rdf:Description></rdf:RDF></x:xmpmeta>"""


def xmp_packet(title: str = "", description: str = "", keywords: tuple[str, ...] = (), rating: int = 0) -> bytes:
    items = "".join(f"<rdf:li>{k}</rdf:li>" for k in keywords)
    return XMP_TEMPLATE.format(title=title, description=description, keywords=items, rating=rating).encode()


def _rational(value: float) -> TiffImagePlugin.IFDRational:
    fraction = Fraction(value).limit_denominator(1_000_000)
    return TiffImagePlugin.IFDRational(fraction.numerator, fraction.denominator)


def _dms(degrees: float) -> tuple:
    degrees = abs(degrees)
    d = int(degrees)
    m = int((degrees - d) * 60)
    s = (degrees - d - m / 60) * 3600
    return (_rational(d), _rational(m), _rational(round(s, 4)))


def exif_block(taken: str | None = None, offset: str | None = None, make: str | None = None,
               model: str | None = None, lens: str | None = None, gps: tuple | None = None,
               orientation: int | None = None, raw_gps: dict | None = None) -> Image.Exif:
    """An EXIF block as a camera writes it; `gps` (lat, lon, alt); `raw_gps` GPS tags as given."""
    exif = Image.Exif()
    if make:
        exif[0x010F] = make
    if model:
        exif[0x0110] = model
    if orientation:
        exif[0x0112] = orientation
    sub = exif.get_ifd(0x8769)
    if taken:
        sub[0x9003] = taken
    if offset:
        sub[0x9011] = offset
    if lens:
        sub[0xA434] = lens
    if gps is not None:
        lat, lon, alt = gps
        exif.get_ifd(0x8825).update({1: "N" if lat >= 0 else "S", 2: _dms(lat), 3: "E" if lon >= 0 else "W",
                                     4: _dms(lon), 5: b"\x00", 6: _rational(alt)})
    if raw_gps is not None:
        exif.get_ifd(0x8825).update(raw_gps)
    return exif


def iptc_segment(title: str = "", caption: str = "", keywords: tuple[str, ...] = ()) -> bytes:
    """A JPEG APP13 segment: Photoshop's image resource 0x0404 holding IPTC-IIM datasets."""
    data = b""
    for (record, number), value in [((2, 5), title), ((2, 120), caption), *[((2, 25), k) for k in keywords]]:
        if value:
            raw = value.encode()
            data += struct.pack(">BBBH", 0x1C, record, number, len(raw)) + raw
    if len(data) % 2:
        data += b"\0"
    resource = b"8BIM" + struct.pack(">H", 0x0404) + b"\0\0" + struct.pack(">I", len(data)) + data
    body = b"Photoshop 3.0\0" + resource
    return b"\xff\xed" + struct.pack(">H", len(body) + 2) + body


def make_photo(path: Path, seed: int = 0, size: tuple[int, int] = (64, 48), exif: Image.Exif | None = None,
               xmp: bytes | None = None, iptc: bytes | None = None) -> Path:
    """A JPEG of random pixels with the given EXIF, XMP packet and IPTC segment."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    kwargs = {}
    if exif is not None:
        kwargs["exif"] = exif
    if xmp is not None:
        kwargs["xmp"] = xmp
    Image.fromarray(pixels, "RGB").save(path, "JPEG", **kwargs)
    if iptc is not None:  # after SOI: readers take APP13 anywhere before the scan
        data = path.read_bytes()
        path.write_bytes(data[:2] + iptc + data[2:])
    return path


# Five Pixel 8 photos (date taken, GPS): p0 in Lisbon, the others without a position; p4 without a
# date (undated: "since 2021" leaves it out). The page's and the MCP view's photo tests share them.
DATED_PHOTOS = [("2021:06:01 10:00:00", (38.7223, -9.1393, 5.0)), ("2023:08:15 09:30:00", None),
                ("2024:05:02 18:00:00", None), ("2024:12:24 20:00:00", None), (None, None)]


def make_dated_photos(folder: Path, seed: int, titled: bool = False) -> list[Path]:
    """`DATED_PHOTOS` as p0.jpg..p4.jpg in `folder` (made), with XMP titles "photo i" when `titled`."""
    folder.mkdir(parents=True, exist_ok=True)
    return [make_photo(folder / f"p{i}.jpg", seed=seed + i, size=(96, 64),
                       exif=exif_block(taken, "+00:00", "Google", "Pixel 8", gps=gps),
                       xmp=xmp_packet(title=f"photo {i}") if titled else None)
            for i, (taken, gps) in enumerate(DATED_PHOTOS)]


def solid_gray_jpeg(path: Path, width: int, height: int) -> Path:
    """A baseline grayscale JPEG of `width` x `height` mid-gray (128) pixels, written without ever
    holding its pixels: Pillow encodes one 8x8 block for the header and tables, whose size fields
    are then set, and every block of the scan is the same 6 bits (DC difference 0: "00", end of
    block: "1010", the standard tables' codes), four blocks to three bytes. A 20000x20000 photo in
    4.7 MB and a tenth of a second, where Pillow would allocate 400 MB to encode it."""
    import io

    if width % 8 or height % 8 or (width // 8) * (height // 8) % 4:
        raise ValueError("solid_gray_jpeg: width and height multiples of 8, with a block count divisible by 4")
    encoded = io.BytesIO()
    Image.new("L", (8, 8), 128).save(encoded, "JPEG", quality=75, optimize=False)
    data = encoded.getvalue()
    sos = data.index(b"\xff\xda")
    header = bytearray(data[:sos + 2 + struct.unpack(">H", data[sos + 2:sos + 4])[0]])
    assert data[len(header):] == b"\x2b\xff\xd9", "Pillow's block is no longer the one this expects"  # 001010 + 11 padding
    sof = header.index(b"\xff\xc0")
    header[sof + 5:sof + 9] = struct.pack(">HH", height, width)
    path.write_bytes(bytes(header) + b"\x28\xa2\x8a" * ((width // 8) * (height // 8) // 4) + b"\xff\xd9")
    return path
