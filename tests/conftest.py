import pytest

from knowledge.models import Role
from tests.factories import make_user, make_workspace


@pytest.fixture
def owner(db):
    return make_user("owner")


@pytest.fixture
def workspace(owner):
    return make_workspace(slug="acme", members={owner: Role.OWNER})
