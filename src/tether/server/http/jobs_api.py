"""Jobs over HTTP: the pull-consumer spec (queued-jobs, job GET/POST, requeue), dead
letters, and Tether's atomic claim, touch and bulk state change."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tether.engine.jobs.registry import Consumer, verify_token
from tether.engine.jobs.view import DEAD, NOT_DEAD, JobError, JobInfo
from tether.protocol.numbers import parse_uint
from tether.server.http.auth import job_of, pull_consumer
from tether.server.http.common import (
    NOT_FOUND,
    UNSUPPORTED_MEDIA,
    Api,
    channel_url,
    consumer_url,
    decode_body,
    form_values,
    is_form,
    job_url,
    json,
    message_url,
    rfc3339,
    text,
)
from tether.server.http.messages import payload_text
from tether.server.http.pagination import paginate

DEFAULT_LIMIT = 25
MAX_LIMIT = 100
MAX_TIMEOUT = 366 * 24 * 3600  # IncrementalTimeout above a year is refused
MAX_BULK = 1000


def job_id(k: Consumer, seq: int) -> str:
    return f"{k.num}-{seq}"


# Request bodies: every field typed and bounded, decoded in one step (common.decode_body).
Timeout = Annotated[int, msgspec.Meta(ge=0, le=MAX_TIMEOUT)]


class StateChange(msgspec.Struct):
    """``POST …/job/{id}``: webhook-broker's state change."""

    NextState: str = ""
    IncrementalTimeout: Timeout = 0


class BulkChange(msgspec.Struct, kw_only=True):
    ID: str
    NextState: str = ""
    IncrementalTimeout: Timeout = 0


class BulkRequest(msgspec.Struct):
    """``POST …/jobs``: many state changes at once."""

    Jobs: Annotated[list[BulkChange], msgspec.Meta(max_length=MAX_BULK)]


class ClaimRequest(msgspec.Struct):
    """``POST …/claim``; ``Max`` is bounded by the server's ``max_claim`` after decoding."""

    Max: Annotated[int, msgspec.Meta(ge=0)] = DEFAULT_LIMIT
    IncrementalTimeout: Timeout = 0
    Wait: Annotated[float, msgspec.Meta(ge=0)] = 0.0


class TouchRequest(msgspec.Struct):
    """``POST …/job/{id}/touch``; no timeout keeps the consumer's."""

    IncrementalTimeout: Timeout | None = None


def routes(api: Api) -> list[Route]:
    service = api.service

    async def jobs_body(k: Consumer, jobs: list[JobInfo], with_deadline: bool = False) -> list[Any]:
        views = {v.seq: v for v in await service.read_many(k.channel, [j.seq for j in jobs])}
        out = []
        for j in jobs:
            v = views.get(j.seq)
            if v is None:
                continue
            item: dict[str, Any] = {
                "ID": job_id(k, j.seq),
                "Priority": j.priority,
                "IncrementalTimeout": j.timeout,
                "Message": {
                    "MessageID": v.message_id,
                    "Payload": payload_text(v.payload),
                    "Headers": v.metadata,
                    "ContentType": v.content_type,
                },
            }
            if with_deadline:
                item["Deadline"] = rfc3339(j.deadline)
            out.append(item)
        return out

    async def stored(k: Consumer) -> Response | None:
        """None once the job changes just made are committed (a 2xx means stored, as a
        PubAck does); a 503 saying so when they could not be (a full disk)."""
        error = await service.committed(k)
        if error is None:
            return None
        cause = error.__cause__ if error.__cause__ is not None else error
        return text(503, f"the job change could not be stored ({cause}): retry it")

    async def queued_jobs(request: Request) -> Response:
        k = pull_consumer(
            api, request, request.path_params["channelId"], request.path_params["consumerId"]
        )
        if isinstance(k, Response):
            return k
        raw = request.query_params.get("limit", "")
        if raw == "":
            limit = DEFAULT_LIMIT
        else:  # webhook-broker: not an integer or negative → 400
            given = parse_uint(raw)
            if given is None:
                return text(400, "invalid query parameter")
            limit = min(given, MAX_LIMIT)
        jobs = service.jobs(k).peek(limit)
        return json({"Result": await jobs_body(k, jobs)})

    async def _job_route(request: Request) -> tuple[Consumer, int] | Response:
        k = pull_consumer(
            api, request, request.path_params["channelId"], request.path_params["consumerId"]
        )
        if isinstance(k, Response):
            return k
        seq = job_of(api, k, request.path_params["jobId"])
        if isinstance(seq, Response):
            return seq
        return k, seq

    async def job(request: Request) -> Response:
        if request.method == "DELETE":
            return await delete_dead_job(request)
        found = await _job_route(request)
        if isinstance(found, Response):
            return found
        k, seq = found
        jobs_view = service.jobs(k)
        if request.method == "GET":
            info = jobs_view.info(seq)
            view = await service.read(k.channel, seq)
            if info is None or view is None:
                return text(404, "job could not be found")
            jid = job_id(k, seq)
            producer = service.registry.producers.get(view.producer)
            return json(
                {
                    "ListenerEndpoint": k.callback,
                    "ListenerName": k.name,
                    "Status": info.status,
                    "StatusChangedAt": rfc3339(info.changed or view.ts),
                    "MessageURL": message_url(k.channel, view.message_id),
                    "ChannelURL": channel_url(k.channel),
                    "ConsumerURL": consumer_url(k.channel, k.id),
                    "ProducerURL": f"/producer/{producer.id}" if producer else "",
                    "JobRequeueURL": (
                        job_url(k.channel, k.id, jid) + "/requeue-dead-job"
                        if info.status == DEAD
                        else ""
                    ),
                }
            )
        try:
            change = decode_body(await request.body(), StateChange)
            jobs_view.transition(seq, change.NextState, change.IncrementalTimeout)
        except (ValueError, JobError) as exc:
            return text(400, str(exc))
        return await stored(k) or Response(status_code=202)

    async def requeue_dead_job(request: Request) -> Response:
        found = await _job_route(request)
        if isinstance(found, Response):
            return found
        k, seq = found
        if not service.jobs(k).requeue_dead(seq):
            return text(400, NOT_DEAD)
        return await stored(k) or Response(status_code=202)

    async def delete_dead_job(request: Request) -> Response:
        k = pull_consumer(
            api,
            request,
            request.path_params["channelId"],
            request.path_params["consumerId"],
            pull=False,
        )
        if isinstance(k, Response):
            return k
        seq = job_of(api, k, request.path_params["jobId"])
        if isinstance(seq, Response):
            return text(404, "job could not be found")
        if not service.jobs(k).delete_dead(seq):
            return text(404, "job is not dead")
        return await stored(k) or Response(status_code=204)

    async def dlq(request: Request) -> Response:
        cid, kid = request.path_params["channelId"], request.path_params["consumerId"]
        if request.method == "DELETE":
            k = pull_consumer(api, request, cid, kid, pull=False)
            if isinstance(k, Response):
                return k
            deleted = service.jobs(k).delete_all_dead()
            return await stored(k) or json({"deletedCount": deleted})
        if request.method == "POST" and not is_form(request):
            return text(415, UNSUPPORTED_MEDIA)
        found = service.registry.consumers.get((cid, kid))
        if found is None:
            return text(404, NOT_FOUND)
        jobs_view = service.jobs(found)
        if request.method == "POST":
            form = await form_values(request)
            if form is None or not verify_token(form.get("requeue"), found.token_hash):
                return text(400, "`requeue` form param must match consumer token")
            jobs_view.requeue_all_dead()
            return await stored(found) or Response(status_code=202)
        dead = jobs_view.dead()
        page, links = paginate(request, dead, lambda j: (job_id(found, j.seq), j.changed))
        views = {v.seq: v for v in await service.read_many(cid, [j.seq for j in page])}
        items = []
        for j in page:
            v = views.get(j.seq)
            jid = job_id(found, j.seq)
            items.append(
                {
                    "ListenerEndpoint": found.callback,
                    "ListenerName": found.name,
                    "Status": DEAD,
                    "StatusChangedAt": rfc3339(j.changed),
                    "MessageURL": message_url(cid, v.message_id) if v else "",
                    "JobRequeueURL": job_url(cid, kid, jid) + "/requeue-dead-job",
                }
            )
        return json({"DeadJobs": items, "Pages": links})

    # -- Tether extensions ---------------------------------------------------------------------------
    async def claim(request: Request) -> Response:
        k = pull_consumer(
            api, request, request.path_params["channelId"], request.path_params["consumerId"]
        )
        if isinstance(k, Response):
            return k
        try:
            req = decode_body(await request.body(), ClaimRequest, empty_ok=True)
            if req.Max > api.settings.max_claim:
                raise ValueError(f"Max must be an integer from 0 to {api.settings.max_claim}")
            if req.Wait > api.settings.max_claim_wait:
                raise ValueError(
                    f"Wait must be a number of seconds from 0 to {api.settings.max_claim_wait:g}"
                )
            limit, timeout, wait = req.Max, req.IncrementalTimeout, req.Wait
        except ValueError as exc:
            return text(400, str(exc))
        key = (k.channel, k.id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(wait)
        jobs_view = service.jobs(k)
        jobs = jobs_view.claim(limit, timeout or None)
        while not jobs and not jobs_view.closed:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            fut: asyncio.Future[None] = loop.create_future()
            api.waiters.setdefault(key, set()).add(fut)
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                pass
            finally:
                api.waiters.get(key, set()).discard(fut)
            jobs = jobs_view.claim(limit, timeout or None)
        service.counters.claimed += len(jobs)
        if jobs and (failed := await stored(k)) is not None:
            return failed  # in flight in memory: they come back when their deadline passes
        return json({"Result": await jobs_body(k, jobs, with_deadline=True)})

    async def touch(request: Request) -> Response:
        found = await _job_route(request)
        if isinstance(found, Response):
            return found
        k, seq = found
        try:
            touched = decode_body(await request.body(), TouchRequest, empty_ok=True)
            deadline = service.jobs(k).touch(seq, touched.IncrementalTimeout)
        except (ValueError, JobError) as exc:
            return text(400, str(exc))
        return await stored(k) or json({"Deadline": rfc3339(deadline)})

    async def bulk(request: Request) -> Response:
        k = pull_consumer(
            api, request, request.path_params["channelId"], request.path_params["consumerId"]
        )
        if isinstance(k, Response):
            return k
        try:
            items = decode_body(await request.body(), BulkRequest).Jobs
            changes = [(item.ID, item.NextState, item.IncrementalTimeout) for item in items]
        except ValueError as exc:
            return text(400, str(exc))
        jobs_view = service.jobs(k)
        results = []
        for jid, state, timeout in changes:
            seq = job_of(api, k, jid)
            if isinstance(seq, Response):
                results.append(
                    {"ID": jid, "Status": seq.status_code, "Error": bytes(seq.body).decode()}
                )
                continue
            try:
                jobs_view.transition(seq, state, timeout)
                results.append({"ID": jid, "Status": 202, "Error": ""})
            except JobError as exc:
                results.append({"ID": jid, "Status": 400, "Error": str(exc)})
        return await stored(k) or json({"Results": results})

    base = "/channel/{channelId}/consumer/{consumerId}"
    return [
        Route(f"{base}/queued-jobs", queued_jobs, methods=["GET"]),
        Route(f"{base}/job/{{jobId}}", job, methods=["GET", "POST", "DELETE"]),
        Route(f"{base}/job/{{jobId}}/requeue-dead-job", requeue_dead_job, methods=["POST"]),
        Route(f"{base}/job/{{jobId}}/touch", touch, methods=["POST"]),
        Route(f"{base}/dlq", dlq, methods=["GET", "POST", "DELETE"]),
        Route(f"{base}/claim", claim, methods=["POST"]),
        Route(f"{base}/jobs", bulk, methods=["POST"]),
    ]
