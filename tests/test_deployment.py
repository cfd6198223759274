"""docker-compose.yml as a deployment (issue 16, point 7), read as data: no Docker engine here.

What a reviewer checks: TLS terminates in a proxy in front of daphne and nothing else is
published; every long-running service restarts; web and worker have healthchecks; the sweeper
runs as one beat; the settings a deployment must set are passed through; the media volume is
mounted where the image made a folder owned by the app user; `.env` never enters the image.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from django.urls import reverse

from tests.processes import daphne, process_env

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
LONG_RUNNING = ["proxy", "db", "redis", "web", "worker", "beat"]


def _command(service: str) -> str:
    command = SERVICES[service]["command"]
    return command if isinstance(command, str) else " ".join(command)


def test_it_puts_caddy_in_front_of_daphne_for_tls():
    proxy = SERVICES["proxy"]

    assert proxy["image"].startswith("caddy:")
    assert {"80:80", "443:443"} <= set(proxy["ports"])
    assert proxy["depends_on"]["web"]["condition"] == "service_healthy"
    source = next(volume.split(":")[0] for volume in proxy["volumes"] if "/etc/caddy/Caddyfile" in volume)
    caddyfile = (ROOT / source).read_text()
    assert "{$DOMAIN}" in caddyfile
    assert re.search(r"reverse_proxy\s*\{[^}]*dynamic a web 8000", caddyfile)
    assert any(volume.endswith(":/data") for volume in proxy["volumes"]), "certificates must outlive the container"


def test_it_publishes_no_port_but_the_proxys():
    published = {name for name, service in SERVICES.items() if service.get("ports")}

    assert published == {"proxy"}
    assert "--proxy-headers" in _command("web")
    assert "daphne" in _command("web")


@pytest.mark.parametrize("service", LONG_RUNNING)
def test_every_long_running_service_restarts(service):
    assert SERVICES[service]["restart"] in {"always", "unless-stopped"}


def test_the_one_shot_migration_does_not_restart():
    assert SERVICES["migrate"]["restart"] == "no"


@pytest.mark.parametrize("service", ["web", "worker", "db", "redis"])
def test_it_checks_the_health_of_web_worker_and_their_stores(service):
    assert SERVICES[service]["healthcheck"]["test"]


def test_it_runs_the_sweeper_as_celery_beat():
    assert "celery -A config beat" in _command("beat")
    assert "knowledge.tasks.sweep" in (ROOT / "config" / "settings.py").read_text()


@pytest.mark.parametrize("service", ["web", "worker", "beat", "migrate"])
def test_it_passes_the_deployment_settings_through(service):
    environment = SERVICES[service]["environment"]

    for name in ["DEBUG", "ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS", "SECRET_KEY", "DATABASE_URL", "REDIS_URL"]:
        assert name in environment, f"{service} lacks {name}"
    assert environment["BEHIND_PROXY"] == "true"
    assert environment["DEBUG"] == "${DEBUG:-false}"
    assert environment["SECRET_KEY"].startswith("${SECRET_KEY:?")


def test_it_mounts_media_where_the_image_made_a_folder_owned_by_the_app_user():
    dockerfile = (ROOT / "Dockerfile").read_text()
    mounts = {volume.split(":")[1] for volume in SERVICES["web"]["volumes"] if volume.startswith("media:")}
    [media] = mounts

    user_line = dockerfile.index("USER app")
    folder = re.search(r"mkdir -p (\S*media)\S* && chown -R app(?::app)? (\S+)", dockerfile)
    assert folder is not None, "the Dockerfile must create the media folder and give it to app"
    assert folder.group(1) == media
    assert media.startswith(folder.group(2))
    assert folder.start() < user_line
    assert all(media in {volume.split(":")[1] for volume in SERVICES[name]["volumes"]} for name in ("worker", "beat"))


def test_it_keeps_the_env_file_out_of_the_image():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}

    assert ".env" in ignored
    assert ".data" in ignored


def test_the_health_endpoint_answers_behind_the_https_redirect(client, db, settings):
    settings.SECURE_SSL_REDIRECT = True

    response = client.get(reverse("healthz"))

    assert response.status_code == 200
    assert response.content == b"ok"
    assert client.get(reverse("login")).status_code == 301


def test_the_web_healthcheck_script_passes_against_a_running_server(transactional_db):
    with daphne(process_env()) as server:
        port = server.url.rsplit(":", 1)[1]
        environment = {**process_env(), "PORT": port}
        healthy = subprocess.run(
            [sys.executable, "scripts/healthcheck.py"], cwd=ROOT, env=environment, capture_output=True, timeout=60
        )
        unknown_host = subprocess.run(
            [sys.executable, "scripts/healthcheck.py"],
            cwd=ROOT,
            env={**environment, "ALLOWED_HOSTS": "not-this-server.example"},
            capture_output=True,
            timeout=60,
        )

    assert healthy.returncode == 0, healthy.stderr
    assert unknown_host.returncode == 1
