"""Token chunks with their character offsets in the document (for citations)."""

import itertools
from dataclasses import dataclass

from knowledge.tokens import encode, encoding


@dataclass(frozen=True)
class ChunkSpan:
    order: int
    text: str
    token_count: int
    char_start: int
    char_end: int


def chunk_text(text: str, *, size: int = 1200, overlap: int = 100) -> list[ChunkSpan]:
    """Windows of `size` tokens, each starting `size - overlap` tokens after the last.

    A chunk's text is exactly `text[char_start:char_end]`, so a citation can point into the
    document; a boundary that falls inside a multi-byte character moves to the next character.
    """
    if size < 1:
        raise ValueError("chunk size must be at least one token")
    overlap = min(max(overlap, 0), size - 1)
    tokens = encode(text)
    if not tokens:
        return []
    step = size - overlap
    windows = []
    for start in range(0, len(tokens), step):
        end = min(start + size, len(tokens))
        windows.append((start, end))
        if end == len(tokens):
            break
    char_at = _char_offsets(text, tokens, sorted({index for window in windows for index in window}))
    return [
        ChunkSpan(
            order=order,
            text=text[char_at[start] : char_at[end]],
            token_count=end - start,
            char_start=char_at[start],
            char_end=char_at[end],
        )
        for order, (start, end) in enumerate(windows)
    ]


def _char_offsets(text: str, tokens: list[int], boundaries: list[int]) -> dict[int, int]:
    """Character offset of each token boundary, in one pass over byte lengths."""
    data = text.encode("utf-8")
    byte_ends = [0, *itertools.accumulate(map(len, encoding().decode_tokens_bytes(tokens)))]
    offsets, previous_byte, previous_char = {}, 0, 0
    for boundary in boundaries:
        byte = byte_ends[boundary]
        while byte < len(data) and data[byte] & 0xC0 == 0x80:  # a UTF-8 continuation byte
            byte += 1
        previous_char += len(data[previous_byte:byte].decode("utf-8"))
        previous_byte = byte
        offsets[boundary] = previous_char
    return offsets
