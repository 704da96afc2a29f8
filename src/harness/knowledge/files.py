"""Reading files for a knowledge base: Markdown, plain text and PDF, cut into chunks with the section they
come from.

Markdown is cut at its headings (a chunk's section is its heading path, "Refunds > Over 100 EUR", searched
with its text), plain
text at blank lines, a PDF page by page (its text as pypdf extracts it; the section is "page N"). Within a
section, paragraphs are packed into chunks of at most MAX_CHUNK_CHARS; a longer paragraph is cut between
sentences, or between words when a sentence alone is too long. A file that cannot be read, is of another
kind, or holds no text is a DocumentError naming the file: nothing of it is stored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePath

from harness.domain.errors import DocumentError

#: the longest chunk, in characters (about 300 tokens of English): small enough that a few fit beside memory
MAX_CHUNK_CHARS = 1_200
#: the largest file read (a handbook, not a data dump)
MAX_FILE_BYTES = 20 * 1024 * 1024
MEDIA_TYPES = {".md": "text/markdown", ".markdown": "text/markdown", ".txt": "text/plain", ".text": "text/plain",
               ".pdf": "application/pdf"}
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class Section:
    """A part of a document and where it is: a heading path, "page N", or "" for plain text."""

    where: str
    text: str


@dataclass(frozen=True)
class Chunk:
    """A piece of a document small enough to give a model, with the section it comes from."""

    section: str
    text: str


def media_type_of(name: str) -> str:
    """The media type a file is read as, by its suffix; DocumentError for a kind not read."""
    media_type = MEDIA_TYPES.get(PurePath(name).suffix.lower())
    if media_type is None:
        raise DocumentError(f"{name}: not a Markdown (.md), plain text (.txt) or PDF (.pdf) file")
    return media_type


def read_file(path: Path) -> bytes:
    """A file's bytes; DocumentError naming it when it is missing, not a file, too large or unreadable."""
    media_type_of(str(path))  # a file of another kind is refused before it is read
    try:
        if not path.is_file():
            raise DocumentError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise DocumentError(f"{path}: {size} bytes; the largest file read is {MAX_FILE_BYTES}")
        return path.read_bytes()
    except OSError as exc:
        raise DocumentError(f"{path}: cannot be read: {exc.strerror or exc}") from None


def sections_of(name: str, data: bytes) -> tuple[str, list[Section]]:
    """(media type, sections) of a file's bytes; DocumentError naming it when it holds no text or cannot be
    parsed."""
    media_type = media_type_of(name)
    if len(data) > MAX_FILE_BYTES:
        raise DocumentError(f"{name}: {len(data)} bytes; the largest file read is {MAX_FILE_BYTES}")
    if media_type == "application/pdf":
        sections = _pdf_sections(name, data)
    else:
        text = _decoded(name, data)
        sections = _markdown_sections(text) if media_type == "text/markdown" else [Section("", text)]
    sections = [s for s in sections if s.text.strip()]
    if not sections:
        raise DocumentError(f"{name}: holds no text")
    return media_type, sections


def _decoded(name: str, data: bytes) -> str:
    if b"\x00" in data:
        raise DocumentError(f"{name}: a binary file, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(f"{name}: not UTF-8 text (byte {exc.start})") from None


def _markdown_sections(text: str) -> list[Section]:
    """Sections at the headings; each is named by its heading path."""
    path: list[tuple[int, str]] = []
    sections: list[Section] = []
    lines: list[str] = []

    def close() -> None:
        sections.append(Section(" > ".join(title for _, title in path), "\n".join(lines)))
        lines.clear()

    fence = False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
        heading = None if fence else _HEADING.match(line)
        if heading is None:
            lines.append(line)
            continue
        close()
        level = len(heading.group(1))
        path = [(lvl, title) for lvl, title in path if lvl < level] + [(level, heading.group(2).strip())]
    close()
    return sections


def _pdf_sections(name: str, data: bytes) -> list[Section]:
    """One section per page with text."""
    import io

    from pypdf import PdfReader
    from pypdf.errors import PyPdfError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            raise DocumentError(f"{name}: an encrypted PDF")
        return [Section(f"page {n}", page.extract_text() or "") for n, page in enumerate(reader.pages, start=1)]
    except DocumentError:
        raise
    except (PyPdfError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DocumentError(f"{name}: not a readable PDF: {exc}") from None


def chunks_of(sections: list[Section], max_chars: int = MAX_CHUNK_CHARS) -> list[Chunk]:
    """The sections' text packed into chunks of at most `max_chars`, paragraph by paragraph."""
    out: list[Chunk] = []
    for section in sections:
        pieces = [p for para in re.split(r"\n\s*\n", section.text) for p in _fit(" ".join(para.split()), max_chars)]
        current = ""
        for piece in pieces:
            if current and len(current) + 2 + len(piece) > max_chars:
                out.append(Chunk(section.where, current))
                current = ""
            current = f"{current}\n\n{piece}" if current else piece
        if current:
            out.append(Chunk(section.where, current))
    return out


def _fit(paragraph: str, max_chars: int) -> list[str]:
    """A paragraph as pieces of at most `max_chars`: between sentences, else between words, else hard."""
    if len(paragraph) <= max_chars:
        return [paragraph] if paragraph else []
    pieces: list[str] = []
    current = ""
    for unit in _units(paragraph, max_chars):
        if current and len(current) + 1 + len(unit) > max_chars:
            pieces.append(current)
            current = ""
        current = f"{current} {unit}" if current else unit
    return [*pieces, current] if current else pieces


def _units(paragraph: str, max_chars: int) -> list[str]:
    units: list[str] = []
    for sentence in _SENTENCE_END.split(paragraph):
        if len(sentence) <= max_chars:
            units.append(sentence)
            continue
        for word in sentence.split():
            units.extend(word[i:i + max_chars] for i in range(0, len(word), max_chars))
    return units
