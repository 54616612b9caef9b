# SPDX-License-Identifier: Apache-2.0
"""POST /v1/responses through the gateway: routed like chat (prefix-aware, salted), its type
errors answered 400 with the field path, and a conversation moving between /v1/responses and
/v1/chat/completions kept on the worker that holds its prefix (docs/canonical.md, RESPONSES).
Requests that need a stored response (previous_response_id, GET/DELETE /v1/responses/{id},
POST /v1/responses/{id}/cancel) go to the worker whose answer (JSON or SSE) named it.

kvgate-simworker does not serve /v1/responses, so the workers here are fake_upstream scripts
that answer every request and record what they received."""
import json

from gwhelpers import CHAT, assert_openai_error, forwarded, http, json_response, worker_cfg

RESPONSES = "/v1/responses"
QUIET_HEALTH = {"interval_ms": 600000, "fall": 100, "rise": 1}


def answer(req, sock):
    json_response(sock, {"id": "resp_0123", "object": "response", "status": "completed",
                         "output": [], "usage": {"input_tokens": 1, "output_tokens": 1}})
    return True


def start(kvgate, fake_upstream, n):
    ups = [fake_upstream(answer, name=f"w{i}") for i in range(n)]
    gw = kvgate(config={"health": QUIET_HEALTH, "workers": [worker_cfg(u) for u in ups]})
    return gw, ups


def conversation(k):
    """The same conversation (k picks its text) for /v1/responses and /v1/chat/completions."""
    system = f"conversation {k}: you answer questions about the weather. " * 40
    question = f"what is the weather in city {k}?"
    # The tools section opens the stream: k in it, so conversations differ from the first block.
    tools = [{"type": "function", "name": f"get_weather_{k}", "parameters": {"type": "object"}}]
    resp = {"model": "m", "instructions": system, "tools": tools, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": question}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": "{\"city\":1}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}]}
    chat = {"model": "m", "tools": tools, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": [{"type": "text", "text": question}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\":1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]}
    return resp, chat


def test_responses_forwarded_salted(kvgate, fake_upstream):
    gw, ups = start(kvgate, fake_upstream, 1)
    body = json.dumps({"model": "m", "input": "hello", "instructions": "be brief"}).encode()
    r = http.post(gw.url + RESPONSES, content=body,
                  headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["id"] == "resp_0123"
    req = ups[0].requests[-1]
    assert req["method"] == "POST" and req["path"] == RESPONSES
    assert req["body"] == forwarded(body)
    # A client's own cache_salt is replaced by the scope's.
    r = http.post(gw.url + RESPONSES, json={"input": "x", "cache_salt": "mine"}, timeout=10)
    assert r.status_code == 200
    assert b'"mine"' not in ups[0].requests[-1]["body"]


def test_responses_type_errors_name_the_field(kvgate, fake_upstream):
    gw, ups = start(kvgate, fake_upstream, 1)
    cases = [({"input": 5}, "input: "),
             ({"input": [{"role": "user", "content": 1}]}, "input[0].content: "),
             ({"input": [{"role": "user"}, {"role": "user", "content": [{"type": "x"}]}]},
              "input[1].content[0].type: "),
             ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
              "input[0].call_id: "),
             ({"instructions": [], "input": "x"}, "instructions: ")]
    for body, path in cases:
        r = http.post(gw.url + RESPONSES, json=body, timeout=10)
        assert r.status_code == 400, (body, r.text)
        err = assert_openai_error(r.content, 400, "invalid_request_error")
        assert err["message"].startswith(path), (path, err["message"])
    assert not ups[0].requests  # a worker never sees a body the gateway refused
    # GET is not a route of this path.
    assert http.get(gw.url + RESPONSES, timeout=10).status_code == 405


def test_conversation_keeps_its_worker_across_apis(kvgate, fake_upstream):
    gw, ups = start(kvgate, fake_upstream, 4)
    placed = []
    for k in range(8):
        resp, chat = conversation(k)
        a = http.post(gw.url + RESPONSES, json=resp, timeout=10)
        b = http.post(gw.url + CHAT, json=chat, timeout=10)
        assert a.status_code == 200 and b.status_code == 200
        placed.append((a.headers["x-kvgate-worker"], b.headers["x-kvgate-worker"]))
    assert all(x == y for x, y in placed), placed
    # Not just the first blocks: every block key of the chat form is one the /v1/responses
    # request recorded on its worker (route/explain reads the chat body as the front does).
    for k in range(8, 12):
        resp, chat = conversation(k)
        a = http.post(gw.url + RESPONSES, json=resp, timeout=10)
        assert a.status_code == 200
        e = gw.admin.post("/admin/v1/route/explain", json={"request": chat}).json()
        assert e["api"] == "chat" and e["prefix"]["blocks"] > 8, e
        best = e["candidates"][0]
        assert best["worker"] == a.headers["x-kvgate-worker"], e
        assert best["matched_blocks"] == e["prefix"]["blocks"], e
    # Routing follows the prefix: the conversations do not all land on one worker.
    assert len({x for x, _ in placed}) > 1, placed


# ---- responses and their worker (docs/api.md) ------------------------------------------------


def stateful(name, stream=False):
    """A worker that names its responses after itself, as JSON or as SSE."""
    counter = [0]

    def handler(req, sock):
        counter[0] += 1
        rid = f"resp_{name}_{counter[0]}"
        if req["method"] == "POST" and req["path"] == RESPONSES and stream:
            first = {"type": "response.created", "sequence_number": 0,
                     "response": {"id": rid, "object": "response", "status": "in_progress"}}
            body = (b"event: response.created\ndata: " + json.dumps(first).encode() + b"\n\n"
                    b"event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n")
            sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"content-length: %d\r\n\r\n" % len(body) + body)
            return True
        json_response(sock, {"object": "response", "id": rid, "worker": name,
                             "path": req["path"], "method": req["method"]})
        return True
    return handler


def test_previous_response_id_goes_to_its_worker(kvgate, fake_upstream):
    ups = [fake_upstream(stateful(f"w{i}", stream=i % 2 == 1), name=f"w{i}") for i in range(4)]
    gw = kvgate(config={"health": QUIET_HEALTH, "workers": [worker_cfg(u) for u in ups]})
    made = {}
    for k in range(12):  # different openings: the prefix rule spreads them over the workers
        r = http.post(gw.url + RESPONSES, json={"model": "m", "input": f"{k} " * 300},
                      timeout=10)
        assert r.status_code == 200, r.text
        worker = r.headers["x-kvgate-worker"]
        if "text/event-stream" in r.headers["content-type"]:
            rid = json.loads(r.text.split("data: ", 2)[1].split("\n", 1)[0])["response"]["id"]
        else:
            rid = r.json()["id"]
        assert rid.startswith(f"resp_{worker}_")
        made[rid] = worker
    assert len(set(made.values())) > 1, made
    assert {"w0", "w2"} & set(made.values()) and {"w1", "w3"} & set(made.values()), made
    for rid, worker in made.items():
        # A follow-up whose own prefix would go anywhere goes to the worker holding rid.
        body = {"model": "m", "previous_response_id": rid, "input": f"next after {rid} " * 300}
        r = http.post(gw.url + RESPONSES, json=body, timeout=10)
        assert r.status_code == 200 and r.headers["x-kvgate-worker"] == worker, (rid, r.headers)
        for method, path in (("GET", f"{RESPONSES}/{rid}"), ("POST", f"{RESPONSES}/{rid}/cancel"),
                             ("DELETE", f"{RESPONSES}/{rid}")):
            r = http._call(method, gw.url + path, timeout=10)
            assert r.status_code == 200, (method, path, r.text)
            assert r.headers["x-kvgate-worker"] == worker, (method, path)
            got = [q for q in ups if q.name == worker][0].requests[-1]
            assert (got["method"], got["path"]) == (method, path)
    # An unknown id goes by the normal rule; a bad method or sub-path is refused.
    r = http.get(gw.url + f"{RESPONSES}/resp_unknown", timeout=10)
    assert r.status_code == 200
    r = http.post(gw.url + RESPONSES, json={"previous_response_id": "resp_unknown", "input": "x"},
                  timeout=10)
    assert r.status_code == 200
    assert http.post(gw.url + f"{RESPONSES}/resp_x", json={}, timeout=10).status_code == 405
    assert http.get(gw.url + f"{RESPONSES}/resp_x/cancel", timeout=10).status_code == 405
    assert http.get(gw.url + f"{RESPONSES}/resp_x/other", timeout=10).status_code == 404
    r = http.post(gw.url + RESPONSES, json={"previous_response_id": 5, "input": "x"}, timeout=10)
    assert r.status_code == 400
    assert_openai_error(r.content, 400)["message"].startswith("previous_response_id: ")


def test_previous_response_id_when_its_worker_is_gone(kvgate, fake_upstream):
    ups = [fake_upstream(stateful(f"w{i}"), name=f"w{i}") for i in range(2)]
    gw = kvgate(config={"health": QUIET_HEALTH, "workers": [worker_cfg(u) for u in ups]})
    r = http.post(gw.url + RESPONSES, json={"input": "hello"}, timeout=10)
    rid, worker = r.json()["id"], r.headers["x-kvgate-worker"]
    other = [u.name for u in ups if u.name != worker][0]
    assert gw.admin.delete(f"/admin/v1/workers/{worker}").status_code in (200, 204)
    # Not eligible any more: the normal rule, the other worker.
    r = http.get(gw.url + f"{RESPONSES}/{rid}", timeout=10)
    assert r.status_code == 200 and r.headers["x-kvgate-worker"] == other


def test_response_affinity_is_per_scope(kvgate, fake_upstream):
    ups = [fake_upstream(stateful(f"w{i}"), name=f"w{i}") for i in range(4)]
    gw = kvgate(auth="keys", config={"health": QUIET_HEALTH,
                                     "workers": [worker_cfg(u) for u in ups]})
    keys = {}
    for tid in ("a", "b"):
        r = gw.admin.put(f"/admin/v1/tenants/{tid}", json={"sharing": "isolated"})
        assert r.status_code in (200, 201), r.text
        keys[tid] = {"authorization": "Bearer " + gw.admin.post(
            f"/admin/v1/tenants/{tid}/keys").json()["key"]}
    made = {}
    for k in range(8):
        r = http.post(gw.url + RESPONSES, json={"input": f"{k} " * 300}, headers=keys["a"],
                      timeout=10)
        assert r.status_code == 200, r.text
        made[r.json()["id"]] = r.headers["x-kvgate-worker"]
    same_a = same_b = 0
    for rid, worker in made.items():
        ra = http.get(gw.url + f"{RESPONSES}/{rid}", headers=keys["a"], timeout=10)
        rb = http.get(gw.url + f"{RESPONSES}/{rid}", headers=keys["b"], timeout=10)
        assert ra.status_code == 200 and rb.status_code == 200
        same_a += ra.headers["x-kvgate-worker"] == worker
        same_b += rb.headers["x-kvgate-worker"] == worker
    # The owner's scope follows its responses; another tenant's requests are not steered to
    # the engine that holds them (they go by load, and land there only by chance).
    assert same_a == len(made)
    assert same_b < len(made), (same_b, made)


def test_affinity_beyond_the_ranked_candidates(kvgate, fake_upstream):
    # More workers than the gateway ranks for its attempts (16): the pinned one is found
    # wherever the normal rule would rank it.
    ups = [fake_upstream(stateful(f"w{i}"), name=f"w{i}") for i in range(20)]
    gw = kvgate(config={"health": QUIET_HEALTH, "workers": [worker_cfg(u) for u in ups]})
    for k in range(10):
        r = http.post(gw.url + RESPONSES, json={"input": f"{k} " * 300}, timeout=10)
        rid, worker = r.json()["id"], r.headers["x-kvgate-worker"]
        body = {"previous_response_id": rid, "input": f"other {k} " * 300}
        r = http.post(gw.url + RESPONSES, json=body, timeout=10)
        assert r.headers["x-kvgate-worker"] == worker
        assert http.get(gw.url + f"{RESPONSES}/{rid}").headers["x-kvgate-worker"] == worker


def streaming_answer(req, sock):
    """A Responses stream: created, two text deltas 80 ms apart after a 100 ms wait, the done
    event repeating the text, completed with usage (OpenAI's event names, as vLLM sends them)."""
    import time
    events = [
        ("response.created", {"type": "response.created",
                              "response": {"id": "resp_s1", "status": "in_progress"}}),
        None,
        ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "Hel"}),
        None,
        ("response.output_text.delta", {"type": "response.output_text.delta", "delta": "lo"}),
        ("response.output_text.done", {"type": "response.output_text.done", "text": "Hello"}),
        ("response.completed", {"type": "response.completed", "response": {
            "id": "resp_s1", "output": [{"type": "message", "content": [
                {"type": "output_text", "text": "Hello"}]}],
            "usage": {"input_tokens": 64, "input_tokens_details": {"cached_tokens": 48},
                      "output_tokens": 2, "total_tokens": 66}}}),
    ]
    sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                 b"transfer-encoding: chunked\r\n\r\n")
    for ev in events:
        if ev is None:
            time.sleep(0.1)
            continue
        data = f"event: {ev[0]}\ndata: {json.dumps(ev[1])}\n\n".encode()
        sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))
    sock.sendall(b"0\r\n\r\n")
    return True


def test_responses_stream_timed_and_counted(kvgate, fake_upstream):
    """TTFT at the first text delta (not the created event, not the done event that repeats the
    text), two output events, and the Responses usage numbers read for the worker's series."""
    up = fake_upstream(streaming_answer, name="s")
    gw = kvgate(config={"health": QUIET_HEALTH, "workers": [worker_cfg(up)]})
    r = http.post(gw.url + RESPONSES, json={"model": "m", "input": "hi", "stream": True},
                  timeout=10)
    assert r.status_code == 200 and "response.completed" in r.text
    e = [x for x in gw.access_entries() if x["path"] == RESPONSES][-1]
    assert e["output_events"] == 2 and e["output_tokens"] == 2, e
    assert 90 <= e["ttft_ms"] < e["duration_ms"] - 50, e  # the first delta, ~100 ms in
    assert e["itl_ms"] >= 90, e
    m = gw.scrape()
    assert gw.metric("kvgate_prefix_prompt_tokens_total", m, worker="s") == 64
    assert gw.metric("kvgate_prefix_cached_tokens_total", m, worker="s") == 48
    assert gw.metric("kvgate_worker_output_tokens_total", m, worker="s") == 2
