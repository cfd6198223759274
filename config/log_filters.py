"""Logging filters named by settings.LOGGING."""

import logging

EXPECTED_STATUSES = {403, 404}


class ExpectedRefusalsWithoutTraceback(logging.Filter):
    """Django logs a PermissionDenied with its traceback; a refusal is expected, so it keeps its
    one line ("Forbidden (Permission denied): /path") and loses the traceback. 5xx keep theirs."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "status_code", None) in EXPECTED_STATUSES:
            record.exc_info = None
            record.exc_text = None
        return True
