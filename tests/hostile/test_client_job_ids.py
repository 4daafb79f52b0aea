"""A server-chosen job id never steers ``RewardClient`` to another URL, and a malformed job answer is a
``ServiceError`` (issue 43, item 20): the id is checked against the format ``nvrm serve`` issues (32 hex
digits) and quoted into the poll path; a list body, a missing or non-string id, or a poll answer that is
not a job's status object end in one line, never a raw ``TypeError`` / ``KeyError``."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from nvrm import Clip
from nvrm.client import RewardClient, ServiceError

CLIP = Clip(np.zeros((5, 32, 32, 3), np.uint8), fps=1)
GOOD = "0123456789abcdef0123456789abcdef"


def client_for(submit_answer, poll_answer=None):
    """A client whose server answers the submit with ``submit_answer`` and every other request with
    ``poll_answer`` (a JSON value), and the paths it was asked for."""
    seen: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.raw_path.decode())
        if request.method == "POST":
            return httpx.Response(200, json=submit_answer)
        return httpx.Response(200, json=poll_answer if poll_answer is not None else {"status": "done", "results": []})

    c = RewardClient("http://testserver", presample=False, context_refs=False, retries=0,
                     http=httpx.Client(transport=httpx.MockTransport(handle)), ahttp=httpx.AsyncClient(transport=httpx.MockTransport(handle)))
    return c, seen


@pytest.mark.parametrize("job_id", ["../../metrics?x=", "../contexts/abc", "a/b", "0123456789abcdef0123456789abcdef/../../metrics", "", "x" * 32])
def test_a_job_id_not_of_the_servers_format_is_refused_before_any_poll(job_id):
    client, seen = client_for({"id": job_id, "status": "pending"})
    with pytest.raises(ServiceError, match="job id"):
        client.submit([("p", CLIP, CLIP)]).result(timeout=2)
    assert seen == ["/v1/jobs/score"]  # nothing else was asked for, with or without the bearer key


@pytest.mark.parametrize("answer", [[1, 2], ["id"], {"status": "pending"}, {"id": 7}, {"id": None}, "0123", None])
def test_a_malformed_submit_answer_is_a_service_error(answer):
    client, _ = client_for(answer)
    with pytest.raises(ServiceError):
        client.submit([("p", CLIP, CLIP)])
    with pytest.raises(ServiceError):
        client.submit_group("p", CLIP, [CLIP])

    async def go():
        await client.asubmit([("p", CLIP, CLIP)])

    with pytest.raises(ServiceError):
        asyncio.run(go())


@pytest.mark.parametrize("poll", [[1, 2], "done", {"status": ["done"]}, {"status": "weird"}])
def test_a_malformed_poll_answer_is_a_service_error(poll):
    client, seen = client_for({"id": GOOD, "status": "pending"}, poll)
    job = client.submit([("p", CLIP, CLIP)])
    with pytest.raises(ServiceError):
        job.result(timeout=2)
    assert seen[-1] == f"/v1/jobs/{GOOD}"

    async def go():
        await client.asubmit([("p", CLIP, CLIP)])
        return await (await client.asubmit([("p", CLIP, CLIP)])).aresult(timeout=2)

    with pytest.raises(ServiceError):
        asyncio.run(go())


def test_a_well_formed_id_is_polled_at_its_own_path():
    client, seen = client_for({"id": GOOD, "status": "pending"}, {"id": GOOD, "status": "pending"})
    job = client.submit([("p", CLIP, CLIP)])
    assert job.id == GOOD and not job.done()
    assert seen == ["/v1/jobs/score", f"/v1/jobs/{GOOD}"]
