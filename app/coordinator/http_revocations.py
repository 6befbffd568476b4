"""HTTP groups' revocation barrier: a partition a new generation moves from member A to member B is
held back from B's answered assignment until A has given it up, KIP-848's rule (a partition is not
assigned to its new owner while its previous owner still owns it; consumer_groups.py) on HTTP's one
heartbeat endpoint. Without it, B read the partition from the group's committed offset while A was
still processing it, and A's pre-revocation commit (on_revoke, or the auto-commit before it), made in
the new generation and so accepted, could move the group's offset back behind what B committed.

State: the group row's `assignment[HTTP_STATE_KEY]` (app/storage/groups/groups.py), beside the
members' target (range) assignments, changed only under the group row's lock (FOR UPDATE) as every
membership change is, so every worker and node sees one barrier. Per member:
- `owned`: the partitions it may still be processing: every partition it was answered, until it
  acknowledges a generation whose answer left it out (or its revocation deadline passes). No
  partition is in two members' `owned` (a partition is answered only when no other member owns it).
- `answered`, `answered_generation`: its last heartbeat's answer and that answer's generation.
- `rebalance_timeout_ms`, `revocation_due_ms`: how long it is given to revoke, and when the
  partitions it owns outside its target are released whatever it says (None: it owns none).
  Mirrored on its `group_members.revocation_due_ms` (migration 0016, KIP-848's column), where the
  eviction worker finds the overdue ones by index.

Acknowledgement: a heartbeat's `generation_id` is the generation whose revocations the member has
finished (the SDK sends it once its pre-revocation commit and on_revoke have returned). When it is
the generation of the member's last answer, the member holds nothing outside that answer (within a
generation a member's answers only grow: its target is fixed and what others own only shrinks), so
its `owned` shrinks to it. Any other value (-1, an older generation) acknowledges nothing.

A member that leaves or is evicted owns nothing from then on: its entry goes with it.
"""

from __future__ import annotations

import copy

from app.coordinator.consumer_groups import Partitions, partition_set, partitions_by_topic
from app.storage.groups.groups import HTTP_STATE_KEY, Member


def targets(assignment: dict) -> dict[str, Partitions]:
    """The members' target (range) assignments of a group row's assignment, with the topic ids."""
    return {key: value for key, value in assignment.items() if key != HTTP_STATE_KEY}


def loaded(assignment: dict, generation_id: int, members: list[Member]) -> dict:
    """The barrier's state of a group row's `assignment`, one entry per member of `members` (a copy:
    the caller compares it with the row's to know whether to write). A group without one (written
    before the barrier existed) gets, for each member, the partitions its last answer gave it (its
    target) as owned; a member new to an existing state owns nothing yet."""
    previous = assignment.get(HTTP_STATE_KEY)
    state: dict = {}
    for member in members:
        entry = None if previous is None else previous.get(member.member_id)
        if entry is None:
            held = {} if previous is not None else assignment.get(member.member_id, {})
            entry = {
                "owned": held,
                "answered": held,
                "answered_generation": generation_id,
                "rebalance_timeout_ms": member.session_timeout_ms,
                "revocation_due_ms": None,
            }
        state[member.member_id] = copy.deepcopy(entry)
    return state


def acknowledge(state: dict, member_id: str, generation_id: int) -> None:
    """The member's heartbeat says it finished the revocations of `generation_id` (see the module's
    doc): when that is its last answer's generation, it owns no more than that answer."""
    entry = state[member_id]
    if generation_id >= 0 and generation_id == entry["answered_generation"]:
        entry["owned"] = partitions_by_topic(partition_set(entry["owned"]) & partition_set(entry["answered"]))


def settle(state: dict, target: dict[str, Partitions], now: int) -> None:
    """Each member's revocation deadline: set when it owns partitions outside its target (its
    rebalance timeout from now), kept while it does, cleared when it does not; once passed (or with a
    rebalance timeout of 0), those partitions are released: the member is taken to have given them
    up, as if it had acknowledged (it stays in the group, unlike KIP-848's member, which is removed:
    an HTTP client that never acknowledges keeps working, its partitions moving at the deadline)."""
    for member_id, entry in state.items():
        owned = partition_set(entry["owned"])
        wanted = partition_set(target.get(member_id, {}))
        if owned <= wanted:
            entry["revocation_due_ms"] = None
            continue
        # From when it was first due to revoke; sooner if its rebalance timeout became shorter.
        due = now + entry["rebalance_timeout_ms"]
        if entry["revocation_due_ms"] is None or due < entry["revocation_due_ms"]:
            entry["revocation_due_ms"] = due
        if entry["revocation_due_ms"] <= now:
            entry["owned"] = partitions_by_topic(owned & wanted)
            entry["revocation_due_ms"] = None


def _owned_elsewhere(state: dict, member_id: str) -> set[tuple[str, int]]:
    return set().union(*(partition_set(e["owned"]) for mid, e in state.items() if mid != member_id))


def answer(state: dict, member_id: str, target: Partitions, generation_id: int) -> Partitions:
    """The member's answered assignment: its target less the partitions another member still owns;
    those it is answered are its own from now on."""
    given = partition_set(target) - _owned_elsewhere(state, member_id)
    entry = state[member_id]
    entry["owned"] = partitions_by_topic(partition_set(entry["owned"]) | given)
    entry["answered"] = partitions_by_topic(given)
    entry["answered_generation"] = generation_id
    return entry["answered"]


def member_barrier(assignment: dict, member_id: str) -> tuple[Partitions, Partitions] | None:
    """What a describe shows of a member of an HTTP group (`assignment`: its row's): the partitions
    it owns outside its target (it has still to revoke them), and those of its target another
    member still owns (held back from it); None for a member the barrier does not know (a group of
    another kind, or written before the barrier existed)."""
    state = assignment.get(HTTP_STATE_KEY)
    if state is None or member_id not in state:
        return None
    target = partition_set(assignment.get(member_id, {}))
    revoking = partition_set(state[member_id]["owned"]) - target
    return partitions_by_topic(revoking), partitions_by_topic(target & _owned_elsewhere(state, member_id))


def deadlines(state: dict) -> dict[str, int | None]:
    """Each member's revocation deadline, for its group_members row."""
    return {member_id: entry["revocation_due_ms"] for member_id, entry in state.items()}
