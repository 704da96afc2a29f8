"""Files for the knowledge-base tests: Markdown, plain text, and a tiny PDF written here with pypdf."""

from __future__ import annotations

from pathlib import Path

HANDBOOK_MD = """# Refund policy

## Refunds over 100 EUR
A refund over 100 EUR needs the approval of a support lead before it is issued.

## Damaged parcels
A damaged parcel is refunded in full once the customer sends a photo.
"""

SHIPPING_TXT = """Shipping times

Orders to Austria ship with DHL and arrive within three working days.

Orders to Norway ship with Posten and arrive within five working days."""


def tiny_pdf(path: Path, lines: list[str]) -> Path:
    """A one-page PDF whose text layer holds `lines` (Helvetica), its bytes and cross-reference table written
    out by hand (the PDF 1.4 layout) so the test needs nothing but the parser under test."""
    text = " T* ".join(f"({line})Tj" for line in lines)
    content = f"BT /F1 12 Tf 14 TL 72 720 Td {text} ET".encode("latin-1")
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
               b"/Resources << /Font << /F1 5 0 R >> >> >>",
               b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content),
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    path.write_bytes(bytes(out))
    return path
