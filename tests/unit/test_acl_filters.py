"""Which rules a DescribeAcls / DeleteAcls filter selects (app/coordinator/acl_filters.py), as
Kafka's ResourcePatternFilter and AccessControlEntryFilter select them."""

from __future__ import annotations

import pytest

from app.coordinator.acl_filters import MATCH, AclFilter
from app.coordinator.security_admin import AclRow


def rule(pattern_type: str, name: str, resource_type: str = "Topic", principal: str = "alice") -> AclRow:
    return AclRow(1, principal, resource_type, pattern_type, name, "Read", "allow")


LITERAL_ORDERS = rule("literal", "orders")
EVERY_TOPIC = rule("literal", "*")
PREFIXED_ORD = rule("prefixed", "ord")
PREFIXED_OTHER = rule("prefixed", "pay")
GROUP_ORDERS = rule("literal", "orders", resource_type="Group")
RULES = [LITERAL_ORDERS, EVERY_TOPIC, PREFIXED_ORD, PREFIXED_OTHER, GROUP_ORDERS]


@pytest.mark.parametrize(
    ("acl_filter", "selected"),
    [
        (AclFilter(), RULES),
        # MATCH: what applies to the topic "orders": its literal rule, the wildcard, a prefix of it.
        (AclFilter("Topic", MATCH, "orders"), [LITERAL_ORDERS, EVERY_TOPIC, PREFIXED_ORD]),
        (AclFilter(None, MATCH, "orders"), [LITERAL_ORDERS, EVERY_TOPIC, PREFIXED_ORD, GROUP_ORDERS]),
        (AclFilter("Topic", MATCH, None), [LITERAL_ORDERS, EVERY_TOPIC, PREFIXED_ORD, PREFIXED_OTHER]),
        # A pattern type (or ANY) with a name: that very name.
        (AclFilter("Topic", None, "orders"), [LITERAL_ORDERS]),
        (AclFilter("Topic", "literal", "*"), [EVERY_TOPIC]),
        (AclFilter(None, "prefixed", "ord"), [PREFIXED_ORD]),
        (AclFilter(None, "prefixed", "orders"), []),
        (AclFilter(principal="bob"), []),
        (AclFilter(operation="Write"), []),
        (AclFilter(permission="allow", operation="Read", principal="alice"), RULES),
    ],
)
def test_a_filter_selects_rules_as_kafka(acl_filter, selected):
    assert [r for r in RULES if acl_filter.matches(r)] == selected
