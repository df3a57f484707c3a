"""The one lifecycle table: its shape, and the engine words it reads."""

import pytest

from llmserve.lifecycle import ALLOWED, InstanceState as S, LifecycleError, check_transition

LIVE = (S.STARTING, S.WARMING, S.READY, S.DRAINING)


def reachable(start: S) -> set[S]:
    seen, todo = set(), [start]
    while todo:
        for nxt in ALLOWED[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_table_names_every_state_and_only_states():
    assert set(ALLOWED) == set(S)
    assert all(targets <= set(S) for targets in ALLOWED.values())


def test_every_state_is_reachable_from_starting():
    assert reachable(S.STARTING) | {S.STARTING} == set(S)


def test_stopped_and_failed_are_the_only_terminal_states():
    assert {s for s in S if s.terminal} == {S.STOPPED, S.FAILED}


def test_every_state_can_end():
    for s in S:
        assert s.terminal or reachable(s) & {S.STOPPED, S.FAILED}, s


def test_stopping_is_reachable_from_each_live_state():
    for s in LIVE:
        assert S.STOPPING in reachable(s), s


def test_every_stop_goes_through_stopping_and_a_stopping_instance_only_stops():
    into_stopped = {old for old, targets in ALLOWED.items() if S.STOPPED in targets}
    assert into_stopped == {S.STOPPING}
    assert ALLOWED[S.STOPPING] == {S.STOPPED}
    assert not reachable(S.STOPPING) & set(LIVE)  # no coming back once the stop was sent


def test_a_stopping_instance_is_billed_but_not_capacity():
    assert S.STOPPING.billed and not S.STOPPING.provisioned
    assert {s for s in S if s.provisioned} == {S.STARTING, S.WARMING, S.READY}
    assert {s for s in S if not s.billed} == {S.STOPPED, S.FAILED}


@pytest.mark.parametrize("old,new", [(S.STARTING, S.READY), (S.STOPPED, S.READY), (S.READY, S.STOPPED),
                                     (S.WARMING, S.DRAINING), (S.STARTING, S.STOPPED), (S.DRAINING, S.STOPPED),
                                     (S.READY, S.STOPPING), (S.STOPPING, S.READY), (S.STOPPING, S.DRAINING),
                                     (S.FAILED, S.STOPPING)])
def test_forbidden_transitions(old, new):
    with pytest.raises(LifecycleError):
        check_transition(old, new)


@pytest.mark.parametrize("old,new", [(S.STARTING, S.WARMING), (S.WARMING, S.READY), (S.READY, S.DRAINING),
                                     (S.DRAINING, S.READY), (S.STARTING, S.STOPPING), (S.WARMING, S.STOPPING),
                                     (S.DRAINING, S.STOPPING), (S.STOPPING, S.STOPPED), (S.READY, S.FAILED)])
def test_allowed_transitions(old, new):
    check_transition(old, new)


@pytest.mark.parametrize("state", list(S))
def test_each_state_reads_back_from_its_own_word(state):
    assert S.from_wire(state.value) is state
    assert S.from_wire(state.value.upper()) is state


def test_the_old_engine_word_loading_still_means_starting():
    assert S.from_wire("loading") is S.STARTING


@pytest.mark.parametrize("word", [None, "", "booting", "healthy", 3, {"state": "ready"}])
def test_a_word_we_do_not_know_reads_as_no_word(word):
    assert S.from_wire(word) is None
