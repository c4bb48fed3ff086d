"""``/openapi.json``: an OpenAPI 3.0 description of every route of the HTTP API."""

from __future__ import annotations

from typing import Any

from tether.version import __version__

_ID = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,128}$"}
_TEXT = {"text/plain": {"schema": {"type": "string"}}}
_LIST = {
    "type": "object",
    "properties": {
        "Result": {"type": "array", "items": {"type": "string"}},
        "Pages": {"type": "object", "additionalProperties": {"type": "string"}},
        "Links": {"nullable": True},
    },
}
_STAKEHOLDER = {
    "type": "object",
    "properties": {
        "ID": {"type": "string"},
        "Name": {"type": "string"},
        "Token": {"type": "string", "description": "empty unless the request carries it"},
        "ChangedAt": {"type": "string", "format": "date-time"},
    },
}
_QUEUED_JOB = {
    "type": "object",
    "properties": {
        "ID": {"type": "string"},
        "Priority": {"type": "integer"},
        "IncrementalTimeout": {"type": "integer"},
        "Deadline": {"type": "string", "format": "date-time"},
        "Message": {
            "type": "object",
            "properties": {
                "MessageID": {"type": "string"},
                "Payload": {"type": "string"},
                "Headers": {"type": "object", "additionalProperties": {"type": "string"}},
                "ContentType": {"type": "string"},
            },
        },
    },
}
_STATE_FIELDS: dict[str, Any] = {
    "NextState": {"type": "string", "enum": ["QUEUED", "INFLIGHT", "DELIVERED", "DEAD"]},
    "IncrementalTimeout": {"type": "integer", "minimum": 0},
}
_STATE_CHANGE: dict[str, Any] = {"type": "object", "properties": _STATE_FIELDS}


def _param(
    name: str, where: str = "path", schema: dict[str, Any] | None = None, required: bool = True
) -> dict[str, Any]:
    return {"name": name, "in": where, "required": required, "schema": schema or {"type": "string"}}


def _header(name: str, required: bool = False) -> dict[str, Any]:
    return _param(name, "header", {"type": "string"}, required)


def _responses(ok: int, schema: dict[str, Any] | None, *errors: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if schema is None:
        out[str(ok)] = {"description": "success"}
    else:
        out[str(ok)] = {
            "description": "success",
            "content": {"application/json": {"schema": schema}},
        }
    for code in errors:
        out[str(code)] = {"description": "error (plain text)", "content": _TEXT}
    return out


def _op(
    summary: str,
    responses: dict[str, Any],
    params: list[dict[str, Any]] | None = None,
    body: dict[str, Any] | None = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if params:
        op["parameters"] = params
    if body is not None:
        op["requestBody"] = body
    return op


def _form(fields: dict[str, Any]) -> dict[str, Any]:
    return {
        "required": True,
        "content": {
            "application/x-www-form-urlencoded": {
                "schema": {"type": "object", "properties": fields}
            }
        },
    }


def _json_body(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": schema}}}


_OBJECT: dict[str, Any] = {"type": "object"}
_JSON_ERROR = {"application/json": {"schema": {"type": "object"}}}


def _ui_responses(*errors: int) -> dict[str, Any]:
    """The dashboard's answers: JSON, errors as ``{"error": "..."}``."""
    out: dict[str, Any] = {
        "200": {"description": "success", "content": {"application/json": {"schema": _OBJECT}}}
    }
    for code in errors:
        out[str(code)] = {"description": "error", "content": _JSON_ERROR}
    return out


def _dashboard_paths() -> dict[str, Any]:
    """``/ui/api/``: what the dashboard reads and the actions it takes (docs/operations.md).
    Actions need the ``X-Tether-CSRF`` token of ``/ui/api/session`` and, when
    ``http_admin_password`` is set, its Basic credentials."""
    stream = _param("stream")
    consumer = _param("consumer")
    action = _param("action", schema={"type": "string", "enum": ["requeue", "delete"]})
    csrf = _header("X-Tether-CSRF", required=True)
    basic = _header("Authorization")
    seq_body = _json_body(
        {"type": "object", "properties": {"seq": {"type": "integer", "minimum": 1}}},
        required=False,
    )
    job_body = _json_body(
        {"type": "object", "properties": {"job": {"type": "string"}}}, required=False
    )
    base = "/ui/api/streams/{stream}/consumers/{consumer}"
    return {
        "/ui/api/session": {
            "get": _op(
                "The dashboard's session: CSRF token, whether the caller may act",
                _ui_responses(401),
                [basic],
            )
        },
        "/ui/api/login": {
            "post": _op(
                "Check the admin's Basic credentials", _ui_responses(401, 403), [csrf, basic]
            )
        },
        "/ui/api/overview": {
            "get": _op("Server, store, connections and totals", _ui_responses(401), [basic])
        },
        "/ui/api/streams": {
            "get": _op("Every stream with its state, lag and dead letters", _ui_responses(401, 503))
        },
        "/ui/api/streams/{stream}": {
            "get": _op(
                "A stream: state, configuration and consumers",
                _ui_responses(401, 404, 503),
                [stream],
            )
        },
        "/ui/api/streams/{stream}/messages": {
            "get": _op(
                "A page of a stream's messages (the newest unless start is given)",
                _ui_responses(400, 401, 404, 503),
                [
                    stream,
                    _param("start", "query", {"type": "integer", "minimum": 1}, required=False),
                    _param("subject", "query", required=False),
                    _param("limit", "query", {"type": "integer", "minimum": 1}, required=False),
                    basic,
                ],
            )
        },
        base: {
            "get": _op(
                "A consumer: lag, ack pending, redelivered, dead letters",
                _ui_responses(401, 404, 503),
                [stream, consumer],
            )
        },
        base + "/dead/{action}": {
            "post": _op(
                "Requeue or remove one dead letter ({seq}) or all ({})",
                _ui_responses(400, 401, 403, 404, 503),
                [stream, consumer, action, csrf, basic],
                seq_body,
            )
        },
        "/ui/api/jobs": {
            "get": _op(
                "webhook-broker channels, consumers, job counts and dead jobs",
                _ui_responses(401, 503),
            )
        },
        "/ui/api/jobs/{channel}/{consumer}/dead/{action}": {
            "post": _op(
                "Requeue or delete one dead job ({job}) or all ({})",
                _ui_responses(400, 401, 403, 404, 503),
                [_param("channel"), consumer, action, csrf, basic],
                job_body,
            )
        },
    }


def openapi_document() -> dict[str, Any]:
    ch = _param("channelId", schema=_ID)
    co = _param("consumerId", schema=_ID)
    job = _param("jobId")
    pager = [_param("next", "query", required=False), _param("previous", "query", required=False)]
    cond = _header("If-Unmodified-Since")
    pull_auth = [_header("X-Broker-Channel-Token"), _header("X-Broker-Consumer-Token")]
    stake_form = _form({"token": {"type": "string"}, "name": {"type": "string"}})
    consumer_form = _form(
        {
            "token": {"type": "string"},
            "name": {"type": "string"},
            "callbackUrl": {"type": "string", "format": "uri"},
            "type": {"type": "string", "enum": ["", "push", "pull"]},
        }
    )
    base = "/channel/{channelId}/consumer/{consumerId}"
    paths: dict[str, Any] = {
        "/producers": {"get": _op("List producers", _responses(200, _LIST), pager)},
        "/producer/{producerId}": {
            "get": _op(
                "Get a producer",
                _responses(200, _STAKEHOLDER, 404),
                [_param("producerId", schema=_ID), _header("X-Broker-Producer-Token")],
            ),
            "put": _op(
                "Create or update a producer",
                _responses(200, _STAKEHOLDER, 400, 412, 415),
                [_param("producerId", schema=_ID), cond],
                stake_form,
            ),
        },
        "/channels": {"get": _op("List channels", _responses(200, _LIST), pager)},
        "/channel/{channelId}": {
            "get": _op(
                "Get a channel",
                _responses(200, _STAKEHOLDER, 404),
                [ch, _header("X-Broker-Channel-Token")],
            ),
            "put": _op(
                "Create or update a channel (its stream WB_<id>)",
                _responses(200, _STAKEHOLDER, 400, 412, 415),
                [ch, cond],
                stake_form,
            ),
        },
        "/channel/{channelId}/consumers": {
            "get": _op("List consumers", _responses(200, _LIST, 404), [ch, *pager])
        },
        base: {
            "get": _op(
                "Get a consumer",
                _responses(200, _STAKEHOLDER, 404),
                [ch, co, _header("X-Broker-Consumer-Token")],
            ),
            "put": _op(
                "Create or update a consumer",
                _responses(200, _STAKEHOLDER, 400, 404, 412, 415),
                [ch, co, cond],
                consumer_form,
            ),
            "delete": _op(
                "Delete a consumer", _responses(204, None, 400, 404, 412), [ch, co, cond]
            ),
        },
        "/channel/{channelId}/broadcast": {
            "post": _op(
                "Broadcast a message",
                _responses(201, None, 400, 401, 403, 404, 409, 412, 413),
                [
                    ch,
                    _header("X-Broker-Channel-Token"),
                    _header("X-Broker-Producer-ID"),
                    _header("X-Broker-Producer-Token"),
                    _header("X-Broker-Message-ID"),
                    _header("X-Broker-Message-Priority"),
                    _header("X-Broker-Metadata-Headers"),
                    _header("X-Broker-Scheduled-For"),
                ],
                {
                    "content": {
                        "application/octet-stream": {
                            "schema": {"type": "string", "format": "binary"}
                        }
                    }
                },
            )
        },
        "/channel/{channelId}/message/{messageId}": {
            "get": _op(
                "Get a message", _responses(200, {"type": "object"}, 404), [ch, _param("messageId")]
            )
        },
        "/channel/{channelId}/messages": {
            "get": _op(
                "List messages",
                _responses(200, _LIST, 404),
                [ch, _param("status", "query", {"type": "integer"}, False), *pager],
            )
        },
        "/channel/{channelId}/messages-status": {
            "get": _op("Message counts per status", _responses(200, {"type": "object"}, 404), [ch])
        },
        "/channel/{channelId}/scheduled-messages": {
            "get": _op(
                "List scheduled messages",
                _responses(200, {"type": "object"}, 404),
                [ch, _param("status", "query", {"type": "integer"}, False), *pager],
            )
        },
        "/channel/{channelId}/scheduled-message/{messageId}": {
            "get": _op(
                "Get a scheduled message",
                _responses(200, {"type": "object"}, 404),
                [ch, _param("messageId")],
            )
        },
        f"{base}/queued-jobs": {
            "get": _op(
                "Queued jobs, highest priority first then oldest (no lease)",
                _responses(
                    200,
                    {
                        "type": "object",
                        "properties": {"Result": {"type": "array", "items": _QUEUED_JOB}},
                    },
                    400,
                    401,
                    403,
                    404,
                    412,
                ),
                [ch, co, *pull_auth, _param("limit", "query", {"type": "string"}, False)],
            )
        },
        f"{base}/job/{{jobId}}": {
            "get": _op(
                "Get a job",
                _responses(200, {"type": "object"}, 401, 403, 404, 412),
                [ch, co, job, *pull_auth],
            ),
            "post": _op(
                "Change a job's state",
                _responses(202, None, 400, 401, 403, 404, 412),
                [ch, co, job, *pull_auth],
                _json_body(_STATE_CHANGE),
            ),
            "delete": _op(
                "Delete a dead job", _responses(204, None, 403, 404), [ch, co, job, *pull_auth]
            ),
        },
        f"{base}/job/{{jobId}}/requeue-dead-job": {
            "post": _op(
                "Requeue a dead job",
                _responses(202, None, 400, 401, 403, 404, 412),
                [ch, co, job, *pull_auth],
            )
        },
        f"{base}/job/{{jobId}}/touch": {
            "post": _op(
                "Extend an in-flight job's deadline (Tether)",
                _responses(
                    200,
                    {"type": "object", "properties": {"Deadline": {"type": "string"}}},
                    400,
                    401,
                    403,
                    404,
                    412,
                ),
                [ch, co, job, *pull_auth],
                _json_body(
                    {
                        "type": "object",
                        "properties": {"IncrementalTimeout": {"type": "integer", "minimum": 0}},
                    },
                    False,
                ),
            )
        },
        f"{base}/claim": {
            "post": _op(
                "Atomically claim up to Max queued jobs, waiting up to Wait seconds (Tether)",
                _responses(
                    200,
                    {
                        "type": "object",
                        "properties": {"Result": {"type": "array", "items": _QUEUED_JOB}},
                    },
                    400,
                    401,
                    403,
                    404,
                    412,
                ),
                [ch, co, *pull_auth],
                _json_body(
                    {
                        "type": "object",
                        "properties": {
                            "Max": {"type": "integer", "minimum": 0, "maximum": 100},
                            "Wait": {"type": "number", "minimum": 0, "maximum": 30},
                            "IncrementalTimeout": {"type": "integer", "minimum": 0},
                        },
                    },
                    False,
                ),
            )
        },
        f"{base}/jobs": {
            "post": _op(
                "Change the state of many jobs (Tether)",
                _responses(200, {"type": "object"}, 400, 401, 403, 404, 412),
                [ch, co, *pull_auth],
                _json_body(
                    {
                        "type": "object",
                        "required": ["Jobs"],
                        "properties": {
                            "Jobs": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["ID"],
                                    "properties": {
                                        **_STATE_FIELDS,
                                        "ID": {"type": "string"},
                                    },
                                },
                            }
                        },
                    }
                ),
            )
        },
        f"{base}/dlq": {
            "get": _op("Dead jobs", _responses(200, {"type": "object"}, 404), [ch, co, *pager]),
            "post": _op(
                "Requeue every dead job",
                _responses(202, None, 400, 404, 415),
                [ch, co],
                _form({"requeue": {"type": "string"}}),
            ),
            "delete": _op(
                "Delete every dead job",
                _responses(200, {"type": "object"}, 403, 404),
                [ch, co, *pull_auth],
            ),
        },
        "/_status": {
            "get": _op("Server status and seed data", _responses(200, {"type": "object"}))
        },
        "/job-status": {
            "get": _op(
                "Job counts per channel, consumer and status", _responses(200, {"type": "object"})
            )
        },
        "/dlq-status": {
            "get": _op("Dead job counts per consumer", _responses(200, {"type": "object"}))
        },
        "/metrics": {
            "get": _op(
                "Prometheus metrics",
                {
                    "200": {
                        "description": "metrics",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            )
        },
        "/openapi.json": {"get": _op("This document", _responses(200, {"type": "object"}))},
        **_dashboard_paths(),
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "Tether HTTP API (webhook-broker compatible)", "version": __version__},
        "paths": paths,
    }
