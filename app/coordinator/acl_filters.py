"""Which ACL rules a filter selects, as Kafka's AclBindingFilter (ResourcePatternFilter and
AccessControlEntryFilter) selects them for DescribeAcls and DeleteAcls. Pure.

A field left None matches every value (Kafka's ANY, or a null name or principal). The pattern type
MATCH selects the rules that apply to the named resource: literal rules of that name or of the
wildcard "*", and prefixed rules whose prefix the name starts with (which is what the authorizer
applies, authorizer.pattern_applies). Any other pattern type, or none with a name, compares
the name exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.coordinator.authorizer import pattern_applies
from app.storage.security.principals import AclRow

# Kafka's PatternType.MATCH: a filter's pattern type only, never a rule's.
MATCH = "match"


@dataclass(frozen=True, slots=True)
class AclFilter:
    resource_type: str | None = None
    pattern_type: str | None = None  # authorizer.PatternType's values, MATCH, or None for any
    resource_name: str | None = None
    principal: str | None = None
    operation: str | None = None
    permission: str | None = None

    def matches(self, rule: AclRow) -> bool:
        return (
            self._equal(self.resource_type, rule.resource_type)
            and self._matches_pattern(rule)
            and self._equal(self.principal, rule.principal)
            and self._equal(self.operation, rule.operation)
            and self._equal(self.permission, rule.permission)
        )

    @staticmethod
    def _equal(wanted: str | None, value: str) -> bool:
        return wanted is None or wanted == value

    def _matches_pattern(self, rule: AclRow) -> bool:
        if self.pattern_type not in (None, MATCH, rule.pattern_type):
            return False
        if self.resource_name is None:
            return True
        if self.pattern_type != MATCH:
            return self.resource_name == rule.resource_name
        return pattern_applies(rule.pattern_type, rule.resource_name, self.resource_name)
