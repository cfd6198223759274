"""What a source holds now: the files of a folder, the pages of a site, the files of a git branch.

Each fetcher lists items with a cheap fingerprint (mtime and size; ETag or Last-Modified; the git
blob id), so the sync reads only what changed. Nothing here writes to the database.
"""

import hashlib
import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin, urlsplit, urlunsplit
from urllib.robotparser import RobotFileParser

import httpx
from defusedxml import ElementTree
from django.conf import settings

from knowledge.models import Source
from knowledge.rag import parsing

USER_AGENT = "GraphRAG-Teams-sync"
_SITEMAP_NAMESPACE = "{http://www.sitemaps.org/schemas/sitemap/0.9}"
# The file name a fetched page is parsed under, by its media type.
_EXTENSIONS = {
    "text/html": ".html",
    "application/xhtml+xml": ".html",
    "text/plain": ".txt",
    "text/markdown": ".md",
    "application/pdf": ".pdf",
}


class SourceError(Exception):
    """The source cannot be read at all; `str(err)` is shown on its page (never a credential)."""


@dataclass
class Item:
    key: str
    filename: str
    fingerprint: str
    # The bytes, when the fetcher already has them; else `read` fetches them.
    data: bytes | None = None
    read: Callable[[], bytes] | None = None
    # The source says it is unchanged since `fingerprint` (a 304): nothing to read.
    unchanged: bool = False


@dataclass
class Listing:
    items: list[Item] = field(default_factory=list)
    # Items the source could not give this time: kept as they are, never removed for it.
    kept: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    state: dict = field(default_factory=dict)


def listing(source: Source, previous: dict[str, str]) -> Listing:
    """What the source holds now; `previous` maps keys to the fingerprints the last sync saw."""
    return {Source.Kind.FOLDER: _folder, Source.Kind.WEB: _web, Source.Kind.GIT: _git_source}[source.kind](
        source, previous
    )


def allowed_path(location: str) -> Path:
    """The folder, resolved, if it lies under one of SOURCES_ROOTS; else SourceError."""
    path = Path(location).expanduser().resolve()
    roots = [Path(root).expanduser().resolve() for root in settings.SOURCES_ROOTS]
    if not any(path == root or path.is_relative_to(root) for root in roots):
        allowed = ", ".join(str(root) for root in roots) or "none: the administrator has set no SOURCES_ROOTS"
        raise SourceError(f"{location} is not under a folder this server may read (allowed: {allowed}).")
    return path


def _files(root: Path, keys: Callable[[Path], str]) -> tuple[list[tuple[Path, str]], list[str]]:
    """The readable files under `root` (hidden ones and unknown types left out), with their keys."""
    found, problems = [], []
    for directory, folders, names in os.walk(root):
        folders[:] = sorted(folder for folder in folders if not folder.startswith("."))
        for name in sorted(names):
            if name.startswith("."):
                continue
            try:
                parsing.kind_of(name)
            except parsing.ParseError:
                continue
            path = Path(directory) / name
            found.append((path, keys(path)))
    if len(found) > settings.SOURCES_MAX_FILES:
        problems.append(f"Only the first {settings.SOURCES_MAX_FILES} of {len(found)} files are synced.")
    return found[: settings.SOURCES_MAX_FILES], problems


def _folder(source: Source, previous: dict[str, str]) -> Listing:
    root = allowed_path(source.location)
    if not root.is_dir():
        raise SourceError(f"The folder {source.location} does not exist (or is not a folder).")
    files, problems = _files(root, lambda path: path.relative_to(root).as_posix())
    result = Listing(problems=problems)
    for path, key in files:
        stat = path.stat()
        result.items.append(
            Item(key=key, filename=path.name, fingerprint=f"{stat.st_mtime_ns}:{stat.st_size}", read=path.read_bytes)
        )
    return result


# ---------------------------------------------------------------------------------------
# Web pages and sitemaps


def _client() -> httpx.Client:
    return httpx.Client(
        headers={"User-Agent": USER_AGENT}, timeout=settings.SOURCES_FETCH_TIMEOUT, follow_redirects=False
    )


def _limited(response: httpx.Response, limit: int) -> bytes | None:
    """The body, or None once it passes `limit` bytes (read no further)."""
    body = bytearray()
    for piece in response.iter_bytes():
        body += piece
        if len(body) > limit:
            return None
    return bytes(body)


def _robots(client: httpx.Client, origin: str) -> RobotFileParser:
    robots = RobotFileParser()
    try:
        response = client.get(f"{origin}/robots.txt")
    except httpx.HTTPError as err:
        raise SourceError(f"{origin}/robots.txt could not be read: {err.__class__.__name__}.") from None
    # As robotparser itself: no robots.txt allows everything, a refused one nothing.
    if response.status_code in (401, 403):
        robots.disallow_all = True
    elif response.status_code < 400:
        robots.parse(response.text.splitlines())
    else:
        robots.allow_all = True
    return robots


def _page_urls(client: httpx.Client, source: Source) -> list[str]:
    lines = [line.strip() for line in source.location.splitlines() if line.strip()]
    if len(lines) != 1 or not urlsplit(lines[0]).path.endswith(".xml"):
        return lines
    try:
        response = client.get(lines[0])
        response.raise_for_status()
        tree = ElementTree.fromstring(response.content)
    except (httpx.HTTPError, ElementTree.ParseError) as err:
        raise SourceError(f"The sitemap {lines[0]} could not be read: {err.__class__.__name__}.") from None
    return [element.text.strip() for element in tree.iter(f"{_SITEMAP_NAMESPACE}loc") if element.text]


def _conditional(fingerprint: str) -> dict[str, str]:
    kind, _, value = fingerprint.partition(":")
    return {"etag": {"If-None-Match": value}, "modified": {"If-Modified-Since": value}}.get(kind, {})


def _page_name(url: str, media_type: str) -> str:
    stem = re.sub(r"[^\w.-]+", "-", urlsplit(url).path.strip("/")).strip("-") or "index"
    extension = _EXTENSIONS.get(media_type, "")
    return stem if stem.endswith(extension) else stem + extension


def _web(source: Source, previous: dict[str, str]) -> Listing:
    result = Listing()
    limit = settings.UPLOAD_MAX_MB * 2**20
    with _client() as client:
        urls = _page_urls(client, source)
        if not urls:
            raise SourceError("No page to sync: give page URLs, one a line, or a sitemap's URL.")
        first = urlsplit(urls[0])
        if first.scheme not in ("http", "https"):
            raise SourceError(f"{urls[0]} is not an http or https URL.")
        origin = urlunsplit((first.scheme, first.netloc, "", "", ""))
        robots = _robots(client, origin)
        pages = list(dict.fromkeys(urls))
        if len(pages) > settings.SOURCES_MAX_PAGES:
            result.problems.append(f"Only the first {settings.SOURCES_MAX_PAGES} of {len(pages)} pages are synced.")
        for url in pages[: settings.SOURCES_MAX_PAGES]:
            if urlsplit(urljoin(origin, url)).netloc != first.netloc:
                result.problems.append(f"{url}: skipped, not on {first.netloc}.")
                continue
            if not robots.can_fetch(USER_AGENT, url):
                result.problems.append(f"{url}: robots.txt asks not to fetch it.")
                continue
            _fetch_page(client, url, previous.get(url, ""), limit, result)
    return result


def _fetch_page(client: httpx.Client, url: str, known: str, limit: int, result: Listing) -> None:
    try:
        with client.stream("GET", url, headers=_conditional(known)) as response:
            if response.status_code == 304 and known:
                result.items.append(Item(key=url, filename="", fingerprint=known, unchanged=True))
                return
            if response.status_code in (404, 410):
                return  # gone: removed after the grace period
            if response.status_code != 200:
                result.kept.add(url)
                result.problems.append(f"{url}: the server answered {response.status_code}.")
                return
            body = _limited(response, limit)
    except httpx.HTTPError as err:
        result.kept.add(url)
        result.problems.append(f"{url}: {err.__class__.__name__}.")
        return
    if body is None:
        result.kept.add(url)
        result.problems.append(f"{url}: larger than the {settings.UPLOAD_MAX_MB} MB upload limit.")
        return
    media_type = response.headers.get("content-type", "text/html").split(";")[0].strip().lower()
    if response.headers.get("etag"):
        fingerprint = f"etag:{response.headers['etag']}"
    elif response.headers.get("last-modified"):
        fingerprint = f"modified:{response.headers['last-modified']}"
    else:
        fingerprint = f"sha256:{hashlib.sha256(body).hexdigest()}"
    result.items.append(Item(key=url, filename=_page_name(url, media_type), fingerprint=fingerprint, data=body))


# ---------------------------------------------------------------------------------------
# Git repositories


def _without_credentials(text: str) -> str:
    """URLs in `text` without their user and password (git echoes them in its errors)."""
    return re.sub(r"(\w+://)[^/@\s]+@", r"\1***@", text)


def _run_git(*arguments: str, cwd: Path | None = None) -> str:
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"}
    try:
        done = subprocess.run(  # noqa: S603 - fixed git arguments, no shell
            ["git", *arguments],  # noqa: S607 - git from PATH, as an operator installs it
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=settings.SOURCES_FETCH_TIMEOUT * 10,
        )
    except subprocess.TimeoutExpired:
        raise SourceError("git took too long; try again later.") from None
    if done.returncode != 0:
        message = _without_credentials(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed")
        raise SourceError(f"git {arguments[0]}: {message}")
    return done.stdout


def _remote(location: str) -> str:
    if location.startswith("https://"):
        return location
    return str(allowed_path(location))


def _git_checkout(source: Source) -> Path:
    remote = _remote(source.location.strip())
    checkout = Path(settings.SOURCES_CHECKOUTS) / f"source-{source.pk}"
    branch = source.branch.strip()
    if not (checkout / ".git").is_dir():
        checkout.parent.mkdir(parents=True, exist_ok=True)
        _run_git(
            "clone", "--depth", "1", "--single-branch", *(["--branch", branch] if branch else []), remote, str(checkout)
        )
        return checkout
    _run_git("remote", "set-url", "origin", remote, cwd=checkout)
    _run_git("fetch", "--depth", "1", "origin", branch or "HEAD", cwd=checkout)
    _run_git("reset", "--hard", "FETCH_HEAD", cwd=checkout)
    return checkout


def _git_source(source: Source, previous: dict[str, str]) -> Listing:
    checkout = _git_checkout(source)
    commit = _run_git("rev-parse", "HEAD", cwd=checkout).strip()
    blobs = {}
    for line in _run_git("ls-tree", "-r", "-z", "HEAD", cwd=checkout).split("\0"):
        if line:
            meta, path = line.split("\t", 1)
            blobs[path] = meta.split()[2]
    files, problems = _files(checkout, lambda path: path.relative_to(checkout).as_posix())
    result = Listing(problems=problems, state={"commit": commit})
    for path, key in files:
        if key in blobs:
            result.items.append(Item(key=key, filename=path.name, fingerprint=blobs[key], read=path.read_bytes))
    return result
