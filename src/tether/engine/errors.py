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


def invalid_json(detail: str = "") -> ApiError:
    return ApiError(400, 10025, "invalid JSON" + (f": {detail}" if detail else ""))


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
    return ApiError(500, 10052, detail)


def stream_config_invalid(detail: str) -> ApiError:
    # NewJSStreamInvalidConfigError: 400 / 10052 in nats-server for user-supplied configs.
    return ApiError(400, 10052, detail)


def invalid_stream_name() -> ApiError:
    return ApiError(400, 10128, "stream name is invalid")


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


def rollup_not_permitted() -> ApiError:
    return ApiError(400, 10053, "rollup not permitted")


def invalid_rollup(value: str) -> ApiError:
    return ApiError(400, 10049, f"rollup value invalid: {value}")


def stream_sealed() -> ApiError:
    return ApiError(400, 10109, "invalid operation on sealed stream")


def delete_not_permitted() -> ApiError:
    return ApiError(500, 10057, "message delete not permitted")


def purge_not_permitted() -> ApiError:
    return ApiError(500, 10057, "stream purge not permitted")


def sequence_not_found(seq: int) -> ApiError:
    return ApiError(400, 10067, f"sequence {seq} not found")


def max_consumers_reached() -> ApiError:
    return ApiError(400, 10026, "maximum consumers limit reached")


def jetstream_not_enabled() -> ApiError:
    return ApiError(503, 10076, "JetStream not enabled for account")
