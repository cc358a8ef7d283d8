#!/usr/bin/env python3
"""A scripted OpenAI-compatible model server for the sam-node tests and bench (issue 6).

    model_server.py [--host 127.0.0.1] [--port 0] [--script JSON_OR_@FILE] [--api-key KEY]

Prints `ready <port>` on stdout once it listens. Endpoints (OpenAI's shapes, under any path
prefix ending in /v1, so that one server stands in for several services: /alt/v1/models):

- `GET  .../v1/models`: one model, `scripted`.
- `POST .../v1/chat/completions`, with or without `"stream": true` (SSE `chat.completion.chunk`
  events ending in `data: [DONE]`, sent as they are produced, like OpenAI's).
  Scripted: when no message after the last user message is a tool result, the answer asks for
  the tool calls named in the script (`{"tool_calls": [{"name": "add", "arguments": {...}}]}`);
  once tool results follow the last user message, the answer is a final message whose content
  is `FINAL ` + JSON of the tool results the model saw (`[{"name", "content"}]`), so a test can
  assert exactly what reached the model. Without script tool calls, the first turn is final;
  its content is the script's `"reply"` if it has one (the demo's readable answer).
  `"x_bench": {"chunks": N, "bytes": B}` in the body answers N content chunks of B bytes each
  (bench/sam_node_bench.py's streaming throughput); `"delay_ms": D` waits D ms before each.
- `GET  /_records`: every chat request received so far, for assertions: `path`, `headers` (a
  list of [name, value] pairs, repeats kept), `body` (parsed JSON), and `done` (false until
  the answer's last byte was sent).
- `POST /_hold`: from now on a streamed answer sends its first event, then waits (30 s at most)
  for `POST /_release`, so a test can see a chunk arrive while the upstream still answers.
- `POST /_release`: lets held streams go on, and ends the hold.

A scripted tool name is matched against the request's `tools`: the exact name, else a
function whose name ends with `_<name>`, `.<name>`, `/<name>` or `-<name>` (the node may
qualify aggregated tool names with their service); else it is sent as written (a model may
call a tool it was not offered, which is how the refused-tool test asks for one).
Loopback only; the standard library only.
"""

import argparse
import http.server
import json
import sys
import threading
import time

SEPARATORS = ("_", ".", "/", "-")


def _tool_name(wanted, offered):
    if wanted in offered:
        return wanted
    for name in offered:
        if any(name.endswith(sep + wanted) for sep in SEPARATORS):
            return name
    return wanted


def _after_last_user(messages):
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    return messages[last_user + 1:]


def _text(content):
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else json.dumps(content)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Head and body go out in separate writes; with Nagle on, the body waits for the
    # client's delayed ACK of the head (about 40 ms per answer on Linux).
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def _json(self, status, obj):
        out = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _authorized(self):
        key = self.server.api_key
        if key is None:
            return True
        if self.headers.get("Authorization") == f"Bearer {key}":
            return True
        self._json(401, {"error": {"message": "bad api key", "type": "invalid_request_error",
                                   "code": "invalid_api_key"}})
        return False

    def do_GET(self):
        if self.path == "/_records":
            with self.server.lock:
                self._json(200, self.server.records)
        elif self.path.rstrip("/").endswith("/v1/models"):
            if self._authorized():
                self._json(200, {"object": "list", "data": [
                    {"id": "scripted", "object": "model", "created": 0, "owned_by": "test"}]})
        else:
            self._json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self):
        raw = self._body()
        if self.path in ("/_hold", "/_release"):
            self.server.hold = self.path == "/_hold"
            (self.server.released.clear if self.server.hold else self.server.released.set)()
            self._json(200, {})
            return
        if not self.path.rstrip("/").endswith("/v1/chat/completions"):
            self._json(404, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            req = json.loads(raw or b"{}")
        except ValueError as e:
            self._json(400, {"error": {"message": f"body is not JSON: {e}"}})
            return
        record = {"path": self.path, "headers": list(self.headers.items()), "body": req,
                  "done": False}
        with self.server.lock:
            self.server.records.append(record)
        self._answer_chat(req)
        with self.server.lock:
            record["done"] = True

    def _answer_chat(self, req):
        if not self._authorized():
            return
        bench = req.get("x_bench")
        if bench:
            self._bench(req, int(bench.get("chunks", 1)), int(bench.get("bytes", 1)))
            return
        message, finish = self._answer(req)
        if req.get("stream"):
            self._stream(req, message, finish)
        else:
            self._json(200, {
                "id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
                "model": req.get("model", "scripted"),
                "choices": [{"index": 0, "message": message, "finish_reason": finish,
                             "logprobs": None}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    def _answer(self, req):
        messages = req.get("messages") or []
        seen = [{"name": m.get("name") or self._call_name(messages, m.get("tool_call_id")),
                 "content": _text(m.get("content"))}
                for m in _after_last_user(messages) if m.get("role") == "tool"]
        calls = self.server.script.get("tool_calls") or []
        if seen or not calls:
            reply = self.server.script.get("reply")
            if reply and not seen:
                return {"role": "assistant", "content": str(reply)}, "stop"
            return {"role": "assistant", "content": "FINAL " + json.dumps(seen)}, "stop"
        offered = [t.get("function", {}).get("name") for t in req.get("tools") or []]
        tool_calls = [{"id": f"call_{i}", "type": "function",
                       "function": {"name": _tool_name(c["name"], offered),
                                    "arguments": json.dumps(c.get("arguments", {}))}}
                      for i, c in enumerate(calls)]
        return {"role": "assistant", "content": None, "tool_calls": tool_calls}, "tool_calls"

    @staticmethod
    def _call_name(messages, call_id):
        for m in messages:
            for c in m.get("tool_calls") or []:
                if c.get("id") == call_id:
                    return c.get("function", {}).get("name")
        return None

    # --- streaming ---

    def _start_stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _event(self, data):
        payload = b"data: " + data + b"\n\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        self.wfile.flush()

    def _chunk(self, req, delta, finish=None):
        self._event(json.dumps({
            "id": "chatcmpl-scripted", "object": "chat.completion.chunk",
            "created": int(time.time()), "model": req.get("model", "scripted"),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                         "logprobs": None}]}).encode())

    def _end_stream(self):
        self._event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _stream(self, req, message, finish):
        self._start_stream()
        self._chunk(req, {"role": "assistant", "content": ""})
        if self.server.hold:
            self.server.released.wait(timeout=30)
        if message.get("tool_calls"):
            for i, c in enumerate(message["tool_calls"]):
                self._chunk(req, {"tool_calls": [{"index": i, "id": c["id"], "type": "function",
                                                  "function": {"name": c["function"]["name"],
                                                               "arguments": ""}}]})
                args = c["function"]["arguments"]
                half = len(args) // 2  # arguments arrive in pieces, as OpenAI sends them
                for piece in (args[:half], args[half:]):
                    self._chunk(req, {"tool_calls": [{"index": i,
                                                      "function": {"arguments": piece}}]})
        else:
            text = message["content"]
            for i in range(0, len(text), 16):
                self._chunk(req, {"content": text[i:i + 16]})
        self._chunk(req, {}, finish)
        self._end_stream()

    def _bench(self, req, chunks, size):
        piece = "x" * size
        if not req.get("stream"):
            self._json(200, {"id": "chatcmpl-bench", "object": "chat.completion",
                             "created": 0, "model": req.get("model", "scripted"),
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant",
                                                      "content": piece * chunks}}]})
            return
        self._start_stream()
        delay = float(req.get("x_bench", {}).get("delay_ms", 0)) / 1000
        for _ in range(chunks):
            if delay:
                time.sleep(delay)
            self._chunk(req, {"content": piece})
        self._chunk(req, {}, "stop")
        self._end_stream()


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--script", default="{}", help="JSON, or @FILE holding JSON")
    p.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY")
    a = p.parse_args()
    text = open(a.script[1:]).read() if a.script.startswith("@") else a.script
    srv = Server((a.host, a.port), Handler)
    srv.script = json.loads(text)
    srv.api_key = a.api_key
    srv.records = []
    srv.lock = threading.Lock()
    srv.hold = False
    srv.released = threading.Event()
    print(f"ready {srv.server_address[1]}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
