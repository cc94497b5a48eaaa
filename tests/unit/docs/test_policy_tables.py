"""docs/policies.md's parameter tables are the registries' defaults and field comments."""

from __future__ import annotations

from tests.unit.docs.policy_tables import PAGE, render


def test_policies_page_matches_the_registries() -> None:
    page = PAGE.read_text()
    assert render(page) == page, (
        "docs/policies.md differs from the policy registries: "
        "rewrite it with `.venv/bin/python -m tests.unit.docs.policy_tables`"
    )
