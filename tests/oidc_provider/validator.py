import os

from oauth2_provider.oauth2_validators import OAuth2Validator


class Validator(OAuth2Validator):
    """Claims as real providers send them: email, whether it is verified, names, groups."""

    # Every claim below goes out whatever the scopes (groups has no standard scope).
    oidc_claim_scope = None

    def get_additional_claims(self, request):
        user = request.user
        return {
            "email": user.email,
            # A user whose last name is "Unverified" has an address the provider never checked.
            "email_verified": user.last_name != "Unverified",
            "preferred_username": user.username,
            "given_name": user.first_name,
            "family_name": user.last_name,
            "groups": sorted(user.groups.values_list("name", flat=True)),
        }

    def get_oidc_issuer_endpoint(self, request):
        # OP_TOKEN_ISSUER makes the ID tokens claim an issuer other than the discovery document's,
        # as a misconfigured or impersonating provider would.
        return os.environ.get("OP_TOKEN_ISSUER") or super().get_oidc_issuer_endpoint(request)
