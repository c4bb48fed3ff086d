"""nsqlookupd's registration database as derived from the nodes' topics, and edited by
nsqlookupd's write routes."""

from __future__ import annotations

from tether.server.nsq.registrations import Registrations


def test_a_node_s_topics_and_channels_register() -> None:
    regs = Registrations()
    regs.sync([("a", {"t": ["c1", "c2"], "u": []}), ("b", {"t": ["c3"]})])
    assert regs.topics() == ["t", "u"]
    assert regs.channels("t") == ["c1", "c2", "c3"]
    assert regs.topic_producers("t") == {"a", "b"}
    assert regs.topics("b") == ["t"]


def test_what_a_node_no_longer_has_unregisters() -> None:
    regs = Registrations()
    regs.sync([("a", {"t": ["c1", "c2"]}), ("b", {"t": []})])
    regs.sync([("a", {"t": ["c1"]}), ("b", {"t": []})])
    assert regs.channels("t") == ["c1"]
    regs.sync([("b", {})])  # a went away, b deleted t
    assert regs.topics() == []
    assert not regs.has_topic("t")


def test_created_registrations_stay_without_producers() -> None:
    regs = Registrations()
    regs.create_topic("made")
    regs.create_channel("other", "ch")
    regs.sync([("a", {"made": ["x"]})])
    regs.sync([("a", {})])
    assert regs.topics() == ["made", "other"]
    assert regs.channels("other") == ["ch"]
    assert regs.topic_producers("made") == set()
    regs.create_topic("gone#ephemeral")
    regs.sync([("a", {"gone#ephemeral": []})])
    regs.sync([("a", {})])
    assert not regs.has_topic("gone#ephemeral")  # nsqlookupd drops an ephemeral one


def test_a_deleted_topic_stays_deleted_until_registered_again() -> None:
    regs = Registrations()
    node = {"t": ["c1"]}
    regs.sync([("a", node)])
    regs.delete_topic("t")
    regs.sync([("a", node)])  # the node still has it: no new REGISTER
    assert not regs.has_topic("t")
    assert regs.channels("t") == []
    regs.sync([("a", {"t": ["c1", "c2"]})])  # a new channel: REGISTER t c2
    assert regs.topic_producers("t") == {"a"}
    assert regs.channels("t") == ["c2"]


def test_a_node_that_comes_back_registers_everything_again() -> None:
    regs = Registrations()
    regs.sync([("a", {"t": ["c"]})])
    regs.delete_topic("t")
    regs.sync([])
    regs.sync([("a", {"t": ["c"]})])
    assert regs.channels("t") == ["c"]


def test_delete_channel_and_tombstones() -> None:
    regs = Registrations()
    regs.sync([("a", {"t": ["c"]})])
    assert regs.delete_channel("t", "c")
    assert not regs.delete_channel("t", "c")
    assert regs.has_topic("t")
    regs.tombstone("t", "a")
    regs.tombstone("t", "nobody")
    assert regs.tombstoned("t", "a")
    assert not regs.tombstoned("t", "nobody")
    regs.delete_topic("t")
    regs.sync([("a", {"t": ["c", "d"]})])
    assert not regs.tombstoned("t", "a")  # a new producer entry
