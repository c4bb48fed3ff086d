"""JetStream API errors with nats-server's stable codes (``code``, ``err_code``, text)."""

from __future__ import annotations


class ApiError(Exception):
    """An error reply: ``{"error": {"code", "err_code", "description"}}``."""

    def __init__(self, code: int, err_code: int, description: str) -> None:
        super().__init__(description)
        self.code = code
        self.err_code = err_code
        self.description = description

    def to_dict(self) -> dict[str, object]:
        return {"code": self.code, "err_code": self.err_code, "description": self.description}


def bad_request(description: str = "bad request") -> ApiError:
    return ApiError(400, 10003, description)


def invalid_header(name: str, why: str) -> ApiError:
    """A publish header whose value cannot be used (checked before it is stored)."""
    return ApiError(400, 10003, f"invalid {name} header: {why}")


def managed_by_http(what: str, instead: str) -> ApiError:
    """A NATS request that would pull an HTTP API consumer out from under it."""
    return ApiError(400, 10003, f"{what} is managed by the HTTP API; use {instead}")


def invalid_json(detail: str = "") -> ApiError:
    # nats-server appends its decoder's message; ours is msgspec's.
    return ApiError(400, 10025, f"invalid JSON: {detail or 'malformed request'}")


def stream_not_found() -> ApiError:
    return ApiError(404, 10059, "stream not found")


def consumer_not_found() -> ApiError:
    return ApiError(404, 10014, "consumer not found")


def no_message_found() -> ApiError:
    return ApiError(404, 10037, "no message found")


def stream_name_exists() -> ApiError:
    return ApiError(400, 10058, "stream name already in use with a different configuration")


def stream_name_mismatch() -> ApiError:
    return ApiError(400, 10056, "stream name in subject does not match request")


def subjects_overlap() -> ApiError:
    return ApiError(400, 10065, "subjects overlap with an existing stream")


def invalid_stream_config(detail: str) -> ApiError:
    # NewJSStreamInvalidConfigError: 500 / 10052 in nats-server, even for user mistakes.
    return ApiError(500, 10052, detail)


def stream_config_invalid(detail: str) -> ApiError:
    return invalid_stream_config(detail)


def invalid_stream_name() -> ApiError:
    return invalid_stream_config(
        "stream name is required and can not contain '.', '*', '>', '\\', '/'"
    )


def stream_name_has_path_separators() -> ApiError:
    return ApiError(400, 10128, "Stream name can not contain path separators")


def replicas_not_supported() -> ApiError:
    return ApiError(500, 10074, "replicas > 1 not supported in non-clustered mode")


def replicas_negative() -> ApiError:
    return ApiError(400, 10133, "replicas count cannot be negative")


def expected_last_subject_sequence_missing() -> ApiError:
    return ApiError(400, 10193, "missing sequence for expected last sequence per subject")


def wrong_last_sequence(seq: int) -> ApiError:
    return ApiError(400, 10071, f"wrong last sequence: {seq}")


def wrong_last_msg_id(msg_id: str) -> ApiError:
    return ApiError(400, 10070, f"wrong last msg ID: {msg_id}")


def expected_stream_mismatch() -> ApiError:
    return ApiError(400, 10060, "expected stream does not match")


def message_too_large() -> ApiError:
    return ApiError(400, 10054, "message size exceeds maximum allowed")


def store_failed(detail: str) -> ApiError:
    return ApiError(503, 10077, detail)


def rollup_failed(detail: str) -> ApiError:
    return ApiError(500, 10111, detail)


def rollup_not_permitted() -> ApiError:
    return rollup_failed("rollup not permitted")


def invalid_rollup(value: str) -> ApiError:
    return rollup_failed(f'rollup value invalid: "{value}"')


def msg_ttl_invalid() -> ApiError:
    return ApiError(400, 10165, "invalid per-message TTL")


def msg_ttl_disabled() -> ApiError:
    return ApiError(400, 10166, "per-message TTL is disabled")


def msg_ttl_not_supported() -> ApiError:
    return ApiError(400, 10166, "per-message TTL not supported by this server")


def header_too_large() -> ApiError:
    return ApiError(400, 10097, "header size exceeds maximum allowed of 64k")


def stream_sealed() -> ApiError:
    return ApiError(400, 10109, "invalid operation on sealed stream")


def msg_delete_failed(detail: str) -> ApiError:
    return ApiError(500, 10057, detail)


def delete_not_permitted() -> ApiError:
    return msg_delete_failed("message delete not permitted")


def purge_not_permitted() -> ApiError:
    return ApiError(500, 10110, "stream purge not permitted")


def sequence_not_found(seq: int) -> ApiError:
    return ApiError(400, 10043, f"sequence {seq} not found")


def max_consumers_reached() -> ApiError:
    return ApiError(400, 10026, "maximum consumers limit reached")


def jetstream_not_enabled() -> ApiError:
    return ApiError(503, 10076, "JetStream not enabled")


def jetstream_not_enabled_for_account() -> ApiError:
    return ApiError(503, 10039, "JetStream not enabled for account")


def insufficient_resources() -> ApiError:
    return ApiError(503, 10023, "insufficient resources")
