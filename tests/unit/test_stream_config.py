"""Stream configuration: decoding, defaults, validation and update rules (nats-server's)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tether.engine.errors import ApiError
from tether.engine.streams.config import (
    StreamConfig,
    check_create,
    check_update,
    decode_config,
    decode_stored_config,
    encode_config,
    is_valid_name,
    normalize,
)

NS = 1_000_000_000


def config(**fields: Any) -> StreamConfig:
    fields.setdefault("name", "S")
    return decode_config(json.dumps(fields).encode())


def refused(**fields: Any) -> tuple[int, int, str]:
    with pytest.raises(ApiError) as excinfo:
        normalize(config(**fields))
    err = excinfo.value
    return err.code, err.err_code, err.description


def test_defaults_are_filled_like_nats_server() -> None:
    cfg = normalize(config())
    assert cfg.to_dict() == {
        "name": "S",
        "subjects": ["S"],
        "retention": "limits",
        "max_consumers": -1,
        "max_msgs": -1,
        "max_bytes": -1,
        "max_age": 0,
        "max_msgs_per_subject": -1,
        "max_msg_size": -1,
        "discard": "old",
        "storage": "file",
        "num_replicas": 1,
        "duplicate_window": 120 * NS,
        "compression": "none",
        "allow_direct": False,
        "mirror_direct": False,
        "sealed": False,
        "deny_delete": False,
        "deny_purge": False,
        "allow_rollup_hdrs": False,
        "consumer_limits": {},
        "allow_msg_ttl": False,
    }


def test_optional_fields_appear_only_when_set() -> None:
    cfg = normalize(
        config(
            description="d",
            first_seq=5,
            no_ack=True,
            metadata={"k": "v"},
            discard="new",
            max_msgs_per_subject=1,
            discard_new_per_subject=True,
        )
    )
    out = cfg.to_dict()
    assert out["description"] == "d"
    assert out["first_seq"] == 5
    assert out["no_ack"] is True
    assert out["metadata"] == {"k": "v"}
    assert out["discard_new_per_subject"] is True


@pytest.mark.parametrize("value", [0, -2, -100])
def test_zero_and_below_minus_one_mean_unlimited(value: int) -> None:
    cfg = normalize(
        config(
            max_msgs=value,
            max_bytes=value,
            max_msgs_per_subject=value,
            max_msg_size=value,
            max_consumers=value,
        )
    )
    assert (cfg.max_msgs, cfg.max_bytes, cfg.max_msgs_per_subject) == (-1, -1, -1)
    assert (cfg.max_msg_size, cfg.max_consumers) == (-1, -1)


def test_duplicate_window_defaults_to_two_minutes_capped_by_max_age() -> None:
    assert normalize(config()).duplicate_window == 120 * NS
    assert normalize(config(max_age=10 * NS)).duplicate_window == 10 * NS
    assert normalize(config(max_age=600 * NS)).duplicate_window == 120 * NS
    assert normalize(config(duplicate_window=5 * NS)).duplicate_window == 5 * NS


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"name": "a.b"}, "stream name is required and can not contain"),
        ({"name": "a*b"}, "stream name is required and can not contain"),
        ({"name": "a>b"}, "stream name is required and can not contain"),
        ({"name": "a b"}, "stream name is required and can not contain"),
        ({"name": ""}, "stream name is required and can not contain"),
        ({"name": "x" * 256}, "stream name is too long"),
        ({"max_age": -1}, "max age can not be negative"),
        ({"max_age": 50_000_000}, "max age needs to be >= 100ms"),
        ({"duplicate_window": -1}, "duplicates window can not be negative"),
        ({"duplicate_window": 50_000_000}, "duplicates window needs to be >= 100ms"),
        (
            {"max_age": 10 * NS, "duplicate_window": 20 * NS},
            "duplicates window can not be larger then max age",
        ),
        ({"deny_purge": True, "allow_rollup_hdrs": True}, "roll-ups require the purge permission"),
        (
            {"discard_new_per_subject": True, "max_msgs_per_subject": 1},
            "discard new per subject requires discard new policy to be set",
        ),
        (
            {"discard_new_per_subject": True, "discard": "new"},
            "discard new per subject requires max msgs per subject > 0",
        ),
        ({"subjects": ["a..b"]}, "invalid subject"),
        ({"subjects": ["a", "a"]}, 'subject "a" overlaps with "a"'),
        ({"subjects": ["a.*", "a.b"]}, 'subject "a.*" overlaps with "a.b"'),
        ({"subjects": [">"]}, "capturing all subjects requires no-ack to be true"),
        ({"subjects": ["$JS.API.>"]}, "subjects that overlap with jetstream api require no-ack"),
        ({"subjects": ["$SYS.>"]}, "subjects that overlap with system api require no-ack"),
        ({"num_replicas": 6}, "maximum replicas is 5"),
        (
            {"mirror": {"name": "O", "consumer": {"name": "C"}}},
            "durable sourcing consumers not supported",
        ),
        ({"subject_delete_marker_ttl": NS // 2}, "subject delete marker TTL must be at least 1"),
    ],
)
def test_invalid_configs_are_refused_with_nats_servers_text(
    fields: dict[str, Any], expected: str
) -> None:
    code, err_code, description = refused(**fields)
    assert (code, err_code) == (500, 10052)
    assert description.startswith(expected)


def test_negative_replicas_have_their_own_error() -> None:
    assert refused(num_replicas=-1) == (400, 10133, "replicas count cannot be negative")


def test_allow_msg_ttl_is_accepted_and_reported() -> None:
    # nats-py sets it on every KV bucket; messages with a TTL are refused at publish.
    cfg = normalize(config(allow_msg_ttl=True))
    assert cfg.to_dict()["allow_msg_ttl"] is True


def test_what_no_ack_and_the_event_space_allow() -> None:
    assert normalize(config(subjects=[">"], no_ack=True)).subjects == [">"]
    assert normalize(config(subjects=["$JS.EVENT.>"])).subjects == ["$JS.EVENT.>"]
    assert normalize(config(subjects=["$SYS.ACCOUNT.>"])).subjects == ["$SYS.ACCOUNT.>"]


@pytest.mark.parametrize(
    "raw",
    [b"{bad", b'{"name": "S", "max_msgs": "ten"}', b'{"name": "S", "foo": 1}', b"[1]"],
)
def test_bad_json_wrong_types_and_unknown_fields_are_invalid_json(raw: bytes) -> None:
    with pytest.raises(ApiError) as excinfo:
        decode_config(raw)
    assert (excinfo.value.code, excinfo.value.err_code) == (400, 10025)
    assert excinfo.value.description.startswith("invalid JSON: ")


def test_empty_body_and_pedantic_flag() -> None:
    assert decode_config(b"") == StreamConfig()
    assert decode_config(b'{"name": "S", "pedantic": true}').name == "S"


def test_stored_configs_decode_leniently_and_round_trip() -> None:
    cfg = normalize(config(subjects=["a.>"], max_msgs=5))
    assert decode_stored_config(encode_config(cfg)) == cfg
    assert decode_stored_config(b'{"name": "S", "from_the_future": 1}').name == "S"


def test_name_rules() -> None:
    assert is_valid_name("ORDERS_v2-x")
    for bad in ("", "a.b", "a*", "a>", "a b", "a\tb", "a/b", "a\\b"):
        assert not is_valid_name(bad)


def test_create_checks_come_before_validation() -> None:
    with pytest.raises(ApiError) as excinfo:
        check_create("S", config(name="T"))
    assert excinfo.value.err_code == 10056
    with pytest.raises(ApiError) as excinfo:
        check_create("S", decode_config(b""))
    assert excinfo.value.err_code == 10056
    with pytest.raises(ApiError) as excinfo:
        check_create("a/b", config(name="a/b"))
    assert (excinfo.value.code, excinfo.value.err_code) == (400, 10128)
    with pytest.raises(ApiError) as excinfo:
        check_create("S", config(sealed=True))
    assert excinfo.value.description == "stream configuration for create can not be sealed"


def old_and_new(old: dict[str, Any], new: dict[str, Any]) -> tuple[StreamConfig, StreamConfig]:
    return normalize(config(**old)), normalize(config(**new))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({}, {"max_msgs": 10, "description": "x", "subjects": ["a", "b"]}),
        ({"retention": "limits"}, {"retention": "interest"}),
        ({"retention": "interest"}, {"retention": "limits"}),
        ({}, {"deny_delete": True, "deny_purge": True}),
        ({"allow_rollup_hdrs": True}, {}),
        ({}, {"allow_direct": True}),
        ({}, {"max_age": 10 * NS}),
    ],
)
def test_allowed_updates(old: dict[str, Any], new: dict[str, Any]) -> None:
    check_update(*old_and_new(old, new))


@pytest.mark.parametrize(
    ("old", "new", "text"),
    [
        ({}, {"storage": "memory"}, "can not change storage type"),
        ({}, {"retention": "workqueue"}, "can not change retention policy to/from workqueue"),
        ({"retention": "workqueue"}, {}, "can not change retention policy to/from workqueue"),
        ({"sealed": True}, {}, "can not unseal a sealed stream"),
        ({"deny_delete": True}, {}, "can not cancel deny message deletes"),
        ({"deny_purge": True}, {}, "can not cancel deny purge"),
        ({"allow_msg_ttl": True}, {}, "message TTL status can not be disabled"),
    ],
)
def test_refused_updates(old: dict[str, Any], new: dict[str, Any], text: str) -> None:
    before = normalize(config(**old))
    before.sealed = old.get("sealed", False)  # created sealed only for the test
    with pytest.raises(ApiError) as excinfo:
        check_update(before, normalize(config(**new)))
    assert (excinfo.value.code, excinfo.value.err_code) == (500, 10052)
    assert excinfo.value.description.endswith(text)


def test_sealing_implies_what_nats_server_implies() -> None:
    old, new = old_and_new({"max_age": 10 * NS, "allow_rollup_hdrs": True}, {"sealed": True})
    check_update(old, new)
    assert (new.max_age, new.discard, new.deny_delete, new.deny_purge) == (0, "new", True, True)
    assert new.allow_rollup_hdrs is False


def test_replicas_above_one_are_refused_on_update() -> None:
    old, new = old_and_new({}, {"num_replicas": 3})
    with pytest.raises(ApiError) as excinfo:
        check_update(old, new)
    assert (excinfo.value.code, excinfo.value.err_code) == (500, 10074)
