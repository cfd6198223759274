"""Text-based data and mail formats: .csv, .json, .yaml, .xml, .eml, .rtf."""

import csv
import email
import email.policy
import io
import json

import lxml.etree
import lxml.html

from knowledge.rag.parsing.errors import ParseError
from knowledge.rag.parsing.html import html_document
from knowledge.rag.parsing.office import table_rows
from knowledge.rag.parsing.structure import Builder

_CSV_DELIMITERS = ",;\t|"


def csv_document(filename: str, text: str, builder: Builder) -> None:
    sample = text[:65536]
    try:
        dialect = csv.Sniffer().sniff(sample, delimiters=_CSV_DELIMITERS)
    except csv.Error:
        dialect = csv.excel
    try:
        table_rows(csv.reader(io.StringIO(text), dialect), builder)
    except csv.Error as exc:
        raise ParseError(f"{filename} could not be read as CSV ({exc}).") from exc


def json_document(filename: str, text: str, builder: Builder) -> None:
    """The file's own text, once it is known to be JSON: its keys and layout are what people search for."""
    try:
        json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ParseError(f"{filename} is not valid JSON ({exc}).") from exc
    builder.block(text)


def yaml_document(filename: str, text: str, builder: Builder) -> None:
    import yaml

    # Parsing events only checks the syntax without building values, so aliases are never
    # expanded (a "billion laughs" document stays as small as its text).
    try:
        for _ in yaml.parse(text, Loader=yaml.SafeLoader):
            pass
    except yaml.YAMLError as exc:
        raise ParseError(f"{filename} is not valid YAML ({' '.join(str(exc).split())}).") from exc
    builder.block(text)


def _safe_xml_parser() -> lxml.etree.XMLParser:
    # No entity expansion, no DTD or network fetches: entity bombs and external entities stay inert.
    return lxml.etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False)


def xml_document(filename: str, data: bytes, builder: Builder) -> None:
    """Each element's own text as a block, headed by its element name when it has one."""
    try:
        root = lxml.etree.fromstring(data, _safe_xml_parser())
    except lxml.etree.XMLSyntaxError as exc:
        raise ParseError(f"{filename} is not well-formed XML ({exc}).") from exc
    lines = []
    for element in root.iter():
        if not isinstance(element.tag, str):
            continue
        text = " ".join((element.text or "").split())
        attributes = " ".join(f'{lxml.etree.QName(name).localname}="{value}"' for name, value in element.attrib.items())
        if text or attributes:
            name = lxml.etree.QName(element).localname
            lines.append(f"{name}{' ' + attributes if attributes else ''}: {text}".rstrip(": "))
        if len(lines) == 50:
            builder.block("\n".join(lines))
            lines = []
    builder.block("\n".join(lines))


def eml_document(filename: str, data: bytes, builder: Builder) -> None:
    """Subject as the heading, the sender, recipients and date, the body (plain text preferred,
    else the HTML part's text) and the names of attachments."""
    try:
        message = email.message_from_bytes(data, policy=email.policy.default)
    except Exception as exc:  # the email package raises many types for damaged headers
        raise ParseError(f"{filename} could not be read as an email message ({exc}).") from exc
    if not any(message.get(name) for name in ("From", "To", "Subject", "Date", "Message-ID")):
        raise ParseError(f"{filename} is not an email message: it has no From, To, Subject or Date header.")
    builder.heading(1, str(message.get("Subject", "")) or "(no subject)")
    builder.block(
        "\n".join(f"{name}: {message[name]}" for name in ("From", "To", "Cc", "Date") if message.get(name) is not None)
    )
    try:
        body = message.get_body(preferencelist=("plain", "html"))
        content = body.get_content() if body is not None else ""
    except (LookupError, ValueError) as exc:
        raise ParseError(f"{filename} has a body that could not be decoded ({exc}).") from exc
    if body is not None and body.get_content_type() == "text/html":
        html_document(content, builder)
    else:
        builder.block(content)
    attachments = [part.get_filename() for part in message.iter_attachments() if part.get_filename()]
    if attachments:
        builder.block("Attachments: " + ", ".join(attachments))


def rtf_document(filename: str, text: str, builder: Builder) -> None:
    from striprtf.striprtf import rtf_to_text

    if not text.lstrip().startswith("{\\rtf"):
        raise ParseError(f"{filename} is not an RTF document (it does not start with {{\\rtf).")
    try:
        builder.block(rtf_to_text(text, errors="ignore"))
    except (ValueError, IndexError) as exc:
        raise ParseError(f"{filename} could not be read as RTF ({exc}).") from exc
