"""The Content Security Policy holds in a real browser: every main page, the chat and the admin
load under `script-src 'self'` with no violation (issue 16, point 1)."""

import pytest

from knowledge.models import Role
from tests.browser.conftest import console_errors, log_in
from tests.factories import make_chunk, make_document, make_entity, make_relation, make_user, make_workspace

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Recorded by the browser itself, whatever the console says; Playwright injects this script
# through the DevTools protocol, which the page's policy does not govern.
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", (event) => {
  const where = `${event.sourceFile}:${event.lineNumber}`;
  window.__cspViolations.push(`${event.violatedDirective} blocked ${event.blockedURI || "inline"} (${where})`);
});
"""


@pytest.fixture
def site(transactional_db):
    owner = make_user("owner", password="owner-pass-1", is_staff=True)
    workspace = make_workspace(slug="acme", members={owner: Role.OWNER})
    document = make_document(workspace, title="Report", text="Ada worked with Babbage on the Engine.")
    make_chunk(document, text="Ada worked with Babbage on the Engine.")
    ada = make_entity(workspace, "Ada", type="person", description="Wrote the first published algorithm.")
    make_relation(ada, make_entity(workspace, "Babbage", type="person"), description="Ada worked with Babbage.")
    return {"workspace": workspace, "document": document, "ada": ada}


def test_the_main_pages_load_without_a_content_security_policy_violation(daphne_server, browser_page, site):
    page = browser_page
    page.add_init_script(RECORD_VIOLATIONS)
    errors = console_errors(page)
    log_in(page, daphne_server, "owner", "owner-pass-1")
    base = f"{daphne_server}/workspaces/acme"
    pages = [
        f"{daphne_server}/",
        f"{base}/",
        f"{base}/documents/",
        f"{base}/documents/upload/",
        f"{base}/documents/{site['document'].pk}/",
        f"{base}/entities/",
        f"{base}/entities/{site['ada'].pk}/",
        f"{base}/graph/",
        f"{base}/chat/",
        f"{base}/members/",
        f"{base}/settings/",
        f"{base}/audit/",
        f"{daphne_server}/admin/",
        f"{daphne_server}/admin/knowledge/entity/",
    ]
    violations = {}
    for url in pages:
        response = page.goto(url)
        page.wait_for_load_state("networkidle")
        assert "script-src 'self'" in response.headers["content-security-policy"], url
        found = page.evaluate("window.__cspViolations")
        if found:
            violations[url] = found

    assert violations == {}
    csp_errors = [error for error in errors if "Content Security Policy" in error]
    assert csp_errors == []
    assert errors == []
