"""Tests for the transaction state machine (pure, no I/O).

The expected table is written out here independently of the module, so a
change to VALID_PREVIOUS_STATES that adds or drops a transition fails a test.
"""

import itertools
import pickle

import pytest

from app.coordinator.transaction_states import (
    VALID_PREVIOUS_STATES,
    IllegalStateTransition,
    TransactionState,
    is_transition_valid,
    transition,
)

# Persisted in PostgreSQL and shown in the HTTP API: must never change.
PERSISTED_NAMES = [
    "Empty",
    "Ongoing",
    "Prepared",
    "PrepareCommit",
    "PrepareAbort",
    "PrepareEpochFence",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
]

# (from, to) pairs that are legal, as names, copied from the spec table.
ALLOWED = {
    ("Empty", "Empty"),
    ("CompleteCommit", "Empty"),
    ("CompleteAbort", "Empty"),
    ("Empty", "Ongoing"),
    ("Ongoing", "Ongoing"),
    ("CompleteCommit", "Ongoing"),
    ("CompleteAbort", "Ongoing"),
    ("Ongoing", "Prepared"),
    ("Ongoing", "PrepareCommit"),
    ("Prepared", "PrepareCommit"),
    ("Ongoing", "PrepareAbort"),
    ("Prepared", "PrepareAbort"),
    ("PrepareEpochFence", "PrepareAbort"),
    ("Ongoing", "PrepareEpochFence"),
    ("PrepareCommit", "CompleteCommit"),
    ("PrepareAbort", "CompleteAbort"),
    ("Empty", "Dead"),
    ("CompleteCommit", "Dead"),
    ("CompleteAbort", "Dead"),
}

# name -> (is_open, is_completing, takes_writes, is_complete)
PREDICATES = {
    "Empty": (False, False, True, False),
    "Ongoing": (True, False, True, False),
    "Prepared": (True, False, False, False),
    "PrepareCommit": (True, True, False, False),
    "PrepareAbort": (True, True, False, False),
    "PrepareEpochFence": (True, True, False, False),
    "CompleteCommit": (False, False, True, True),
    "CompleteAbort": (False, False, True, True),
    "Dead": (False, False, False, False),
}

MATRIX = list(itertools.product(PERSISTED_NAMES, repeat=2))


def test_persisted_values_are_frozen():
    assert [s.value for s in TransactionState] == PERSISTED_NAMES


def test_table_has_every_state_as_target():
    assert set(VALID_PREVIOUS_STATES) == set(TransactionState)


def test_table_is_read_only():
    with pytest.raises(TypeError):
        VALID_PREVIOUS_STATES[TransactionState.DEAD] = frozenset()  # type: ignore[index]


def test_allowed_set_is_inside_matrix():
    # Guards the test data itself against typos in state names.
    assert ALLOWED <= set(MATRIX)
    assert len(ALLOWED) == 19


@pytest.mark.parametrize(("current", "target"), MATRIX, ids=[f"{a}->{b}" for a, b in MATRIX])
def test_transition_matrix(current, target):
    cur, tgt = TransactionState(current), TransactionState(target)
    if (current, target) in ALLOWED:
        assert is_transition_valid(cur, tgt)
        assert transition(cur, tgt) is tgt
    else:
        assert not is_transition_valid(cur, tgt)
        with pytest.raises(IllegalStateTransition) as info:
            transition(cur, tgt)
        assert info.value.current is cur
        assert info.value.target is tgt


def test_error_message_names_states_sources_and_bug():
    with pytest.raises(IllegalStateTransition) as info:
        transition(TransactionState.ONGOING, TransactionState.COMPLETE_COMMIT)
    msg = str(info.value)
    assert "Ongoing -> CompleteCommit" in msg
    assert "reached from PrepareCommit" in msg
    assert "bug" in msg


def test_error_message_lists_all_sources():
    with pytest.raises(IllegalStateTransition) as info:
        transition(TransactionState.COMPLETE_ABORT, TransactionState.PREPARE_ABORT)
    assert "from Ongoing, Prepared, PrepareEpochFence." in str(info.value)


def test_illegal_transition_is_a_plain_exception_and_picklable():
    err = IllegalStateTransition(TransactionState.DEAD, TransactionState.ONGOING)
    assert isinstance(err, Exception) and not isinstance(err, AssertionError)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.current, copy.target) == (err.current, err.target)
    assert str(copy) == str(err)


def test_dead_is_terminal():
    assert not any(TransactionState.DEAD in srcs for srcs in VALID_PREVIOUS_STATES.values())


@pytest.mark.parametrize("name", PERSISTED_NAMES)
def test_parse_round_trips(name):
    state = TransactionState.parse(name)
    assert isinstance(state, TransactionState)
    assert state.value == name
    assert TransactionState.parse(state.value) is state


@pytest.mark.parametrize("name", ["", "empty", "ONGOING", "Ongoing ", "PREPARE_COMMIT", "Unknown"])
def test_parse_rejects_unknown_names(name):
    with pytest.raises(ValueError) as info:
        TransactionState.parse(name)
    msg = str(info.value)
    assert repr(name) in msg
    assert "PrepareEpochFence" in msg  # lists the known states


@pytest.mark.parametrize("name", PERSISTED_NAMES)
def test_predicates(name):
    state = TransactionState(name)
    assert (
        state.is_open,
        state.is_completing,
        state.takes_writes,
        state.is_complete,
    ) == PREDICATES[name]


def test_predicates_cover_every_state():
    assert set(PREDICATES) == set(PERSISTED_NAMES)
