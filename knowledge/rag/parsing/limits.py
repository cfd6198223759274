"""Bounds on what a parser may read: decompressed size of zip-based files, PDF pages, text."""

import io
import zipfile
from dataclasses import dataclass

from knowledge.rag.parsing.errors import ParseError

# Compound File Binary: what an encrypted .docx/.xlsx/.pptx really is (the zip inside is encrypted).
_OLE_SIGNATURE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
# Members below this size are never called bombs whatever their ratio (an empty XML part compresses 50:1).
_RATIO_FLOOR_BYTES = 2**20


@dataclass(frozen=True)
class Limits:
    max_text_chars: int = 5_000_000
    max_unzipped_bytes: int = 200 * 2**20
    max_zip_ratio: int = 100
    max_pdf_pages: int = 2000

    @classmethod
    def from_settings(cls) -> "Limits":
        from django.conf import settings

        return cls(
            max_text_chars=settings.PARSE_MAX_TEXT_CHARS,
            max_unzipped_bytes=settings.PARSE_MAX_UNZIPPED_MB * 2**20,
            max_zip_ratio=settings.PARSE_MAX_ZIP_RATIO,
            max_pdf_pages=settings.PARSE_MAX_PDF_PAGES,
        )


def checked_zip(filename: str, data: bytes, limits: Limits, what: str) -> zipfile.ZipFile:
    """The archive, after refusing it (without inflating a byte) when it is encrypted, broken or a bomb.

    The check reads the central directory only. It is enough because zipfile never returns more
    of a member than the directory declares (it cuts the inflated stream at the declared size and
    then checks the CRC), and every library here reads through zipfile: the declared sizes bound
    what parsing the file can inflate.
    """
    if data.startswith(_OLE_SIGNATURE):
        raise ParseError(f"{filename} is password-protected or encrypted. Remove the password and upload it again.")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError) as exc:
        raise ParseError(f"{filename} could not be read as {what} (it is not a valid zip archive: {exc}).") from exc
    if any(member.flag_bits & 0x1 for member in members):
        archive.close()
        raise ParseError(f"{filename} is password-protected or encrypted. Remove the password and upload it again.")
    declared = sum(member.file_size for member in members)
    if declared > limits.max_unzipped_bytes:
        archive.close()
        raise ParseError(
            f"{filename} would expand to {declared / 2**20:,.0f} MB when unpacked, more than the "
            f"{limits.max_unzipped_bytes / 2**20:,.0f} MB allowed (PARSE_MAX_UNZIPPED_MB)."
        )
    for member in members:
        if member.file_size > _RATIO_FLOOR_BYTES and member.file_size > limits.max_zip_ratio * max(
            member.compress_size, 1
        ):
            archive.close()
            ratio = member.file_size // max(member.compress_size, 1)
            raise ParseError(
                f"{filename} looks like a zip bomb: {member.filename} expands {ratio:,} times, more than the "
                f"{limits.max_zip_ratio} allowed (PARSE_MAX_ZIP_RATIO)."
            )
    return archive
