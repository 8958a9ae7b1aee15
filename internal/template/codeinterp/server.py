#!/usr/bin/python3
"""fence code-interpreter server: E2B's code-interpreter protocol on port 49999.

Started by the fence agent with the sandbox (see /etc/fence/services.json), as
the sandbox's user; it listens once its default Python kernel is ready. Each context is one IPython kernel (ipykernel, started and
driven with jupyter_client); POST /execute runs code in one and streams the
kernel's output as newline-delimited JSON:

  {"type": "stdout"|"stderr", "text", "timestamp"}
  {"type": "result", "is_main_result", "text"?, "html"?, "png"?, ...}
  {"type": "error", "name", "value", "traceback"}
  {"type": "number_of_executions", "execution_count"}
  {"type": "end_of_execution"}

A client that goes away mid-execution (its timeout) interrupts the kernel:
the execution ends, the kernel and its state live on.
"""

import datetime
import json
import os
import queue
import select
import socket
import sys
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from jupyter_client import KernelManager

PORT = 49999
HOME = os.path.expanduser("~")
HERE = os.path.dirname(os.path.abspath(__file__))
MAX_BODY = 16 << 20
MAX_CONTEXTS = 16
KERNEL_START_TIMEOUT = 60
INTERRUPT_GRACE = 10
CHART_MIME = "application/vnd.fence.chart+json"

# Jupyter MIME type -> field of the result message.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "text/javascript": "javascript",
    CHART_MIME: "chart",
}

# Run silently in every new kernel: load fence_kernel (chart formatter,
# env helpers) and import the heavy modules ahead of the first execution.
SETUP = (
    "__import__('sys').path.append(%r); __import__('fence_kernel').load(get_ipython())" % HERE
)


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


class HTTPError(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


class Disconnected(Exception):
    pass


class Context:
    """One kernel. Executions in it are serialized by lock."""

    def __init__(self, language, cwd):
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()
        self.km = None
        self.kc = None

    def json(self):
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def start(self):
        env = dict(os.environ)
        env.pop("JPY_PARENT_PID", None)
        km = KernelManager(kernel_name="python3")
        km.start_kernel(cwd=self.cwd, env=env)
        kc = km.blocking_client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=KERNEL_START_TIMEOUT)
        except Exception:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            raise
        self.km, self.kc = km, kc
        self.run_silent(SETUP)

    def run_silent(self, code, timeout=60):
        """Runs code without output or history and waits for its reply."""
        msg_id = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("kernel did not answer")
            reply = self.kc.get_shell_msg(timeout=left)
            if reply["parent_header"].get("msg_id") == msg_id:
                c = reply["content"]
                if c.get("status") != "ok":
                    raise RuntimeError("%s: %s" % (c.get("ename"), c.get("evalue")))
                return

    def restart(self):
        self.km.restart_kernel(now=True)
        self.kc.wait_for_ready(timeout=KERNEL_START_TIMEOUT)
        self.drain_shell()
        self.run_silent(SETUP)

    def drain_shell(self):
        while True:
            try:
                self.kc.get_shell_msg(timeout=0)
            except queue.Empty:
                return

    def shutdown(self):
        kc, km = self.kc, self.km
        self.kc = self.km = None
        try:
            kc.stop_channels()
        finally:
            km.shutdown_kernel(now=True)

    def execute(self, code, env_vars, emit, gone):
        """Runs code, calling emit(obj) per output message. gone() says
        whether the client left; then the kernel is interrupted."""
        self.drain_shell()
        if env_vars:
            self.run_silent("__import__('fence_kernel').set_env(%r)" % json.dumps(env_vars))
        try:
            self._execute(code, emit, gone)
        finally:
            if env_vars:
                self.run_silent("__import__('fence_kernel').restore_env()")

    def _execute(self, code, emit, gone):
        # Every execution stands alone. With the protocol's default
        # (stop_on_error), a cell that raises makes the kernel abort the
        # execute requests that reach it before it has finished with the
        # error: on a busy machine the next execution is then skipped,
        # with no output and no error.
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=False)
        interrupted_at = None
        while True:
            if interrupted_at is None and gone():
                self.km.interrupt_kernel()
                interrupted_at = time.monotonic()
            if interrupted_at is not None and time.monotonic() - interrupted_at > INTERRUPT_GRACE:
                # The interrupt did not take (code that ignores SIGINT):
                # a fresh kernel is better than one that never answers.
                self.restart()
                raise Disconnected()
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                if not self.km.is_alive():
                    emit({"type": "error", "name": "KernelDied", "value": "the kernel died; it is restarted",
                          "traceback": ""})
                    self.restart()
                    return
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            t, c = msg["msg_type"], msg["content"]
            if t == "status" and c.get("execution_state") == "idle":
                return
            if interrupted_at is not None:
                continue
            try:
                if t == "stream":
                    emit({"type": "stdout" if c.get("name") == "stdout" else "stderr", "text": c.get("text", ""),
                          "timestamp": now()})
                elif t == "execute_input":
                    emit({"type": "number_of_executions", "execution_count": c.get("execution_count")})
                elif t in ("execute_result", "display_data"):
                    emit(result(c.get("data", {}), t == "execute_result"))
                elif t == "error":
                    emit({"type": "error", "name": c.get("ename", ""), "value": c.get("evalue", ""),
                          "traceback": "\n".join(c.get("traceback", []))})
            except Disconnected:
                self.km.interrupt_kernel()
                interrupted_at = time.monotonic()


def result(data, is_main):
    r = {"type": "result", "is_main_result": is_main}
    extra = {}
    for mime, value in data.items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
        elif field not in r:
            r[field] = value
    if extra:
        r["extra"] = extra
    return r


class Server:
    def __init__(self):
        self.mu = threading.Lock()
        self.contexts = {}
        self.default = {}  # language -> Context
        self.default_mu = threading.Lock()

    def create(self, language, cwd):
        language = (language or "python").lower()
        if language not in ("python", "python3"):
            raise HTTPError(400, "language %r is not supported by this template (python only)" % language)
        cwd = cwd or HOME
        if not os.path.isdir(cwd):
            raise HTTPError(400, "cwd %r is not a directory" % cwd)
        with self.mu:
            if len(self.contexts) >= MAX_CONTEXTS:
                raise HTTPError(429, "at most %d contexts" % MAX_CONTEXTS)
            ctx = Context("python", cwd)
            self.contexts[ctx.id] = None  # reserved
        try:
            ctx.start()
        except Exception as e:
            with self.mu:
                del self.contexts[ctx.id]
            raise HTTPError(500, "starting kernel: %s" % e)
        with self.mu:
            self.contexts[ctx.id] = ctx
        return ctx

    def get(self, cid):
        with self.mu:
            ctx = self.contexts.get(cid)
        if ctx is None:
            raise HTTPError(404, "context %s not found" % cid)
        return ctx

    def default_context(self, language):
        language = (language or "python").lower()
        if language == "python3":
            language = "python"
        with self.default_mu:
            ctx = self.default.get(language)
            with self.mu:
                alive = ctx is not None and self.contexts.get(ctx.id) is ctx
            if not alive:
                ctx = self.create(language, HOME)
                self.default[language] = ctx
            return ctx

    def delete(self, cid):
        ctx = self.get(cid)
        with self.mu:
            self.contexts.pop(cid, None)
        with ctx.lock:
            ctx.shutdown()

    def list(self):
        with self.mu:
            return [c.json() for c in self.contexts.values() if c is not None]


SERVER = Server()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fence-code-interpreter"

    def log_message(self, fmt, *args):
        pass

    def send_json(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_error_json(self, status, message):
        self.send_json(status, {"error": message})

    def read_json(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            raise HTTPError(413, "request body larger than %d bytes" % MAX_BODY)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return {}
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise HTTPError(400, "invalid JSON: %s" % e)
        if not isinstance(body, dict):
            raise HTTPError(400, "request body must be a JSON object")
        return body

    def route(self, method):
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        parts = path.strip("/").split("/")
        try:
            if method == "GET" and path == "/health":
                return self.send_json(200, "OK")
            if method == "POST" and path == "/execute":
                return self.execute()
            if parts[0] == "contexts":
                if method == "POST" and len(parts) == 1:
                    body = self.read_json()
                    ctx = SERVER.create(body.get("language"), body.get("cwd"))
                    return self.send_json(200, ctx.json())
                if method == "GET" and len(parts) == 1:
                    return self.send_json(200, SERVER.list())
                if method == "DELETE" and len(parts) == 2:
                    SERVER.delete(parts[1])
                    return self.send_json(200, None)
                if method == "POST" and len(parts) == 3 and parts[2] == "restart":
                    ctx = SERVER.get(parts[1])
                    with ctx.lock:
                        ctx.restart()
                    return self.send_json(200, None)
            raise HTTPError(404, "no route for %s %s" % (method, path))
        except HTTPError as e:
            self.send_error_json(e.status, e.message)
        except (BrokenPipeError, ConnectionResetError, Disconnected):
            self.close_connection = True
        except Exception as e:
            traceback.print_exc()
            self.send_error_json(500, str(e))

    def do_GET(self):
        self.route("GET")

    def do_POST(self):
        self.route("POST")

    def do_DELETE(self):
        self.route("DELETE")

    def execute(self):
        body = self.read_json()
        code = body.get("code")
        if not isinstance(code, str):
            raise HTTPError(400, "code must be a string")
        env_vars = body.get("env_vars") or {}
        if not isinstance(env_vars, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()):
            raise HTTPError(400, "env_vars must map strings to strings")
        if body.get("context_id") and body.get("language"):
            raise HTTPError(400, "context_id and language are mutually exclusive")
        if body.get("context_id"):
            ctx = SERVER.get(body["context_id"])
        else:
            ctx = SERVER.default_context(body.get("language"))

        sock = self.connection
        state = {"gone": False}

        def gone():
            if state["gone"]:
                return True
            try:
                r, _, _ = select.select([sock], [], [], 0)
                if r and sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    state["gone"] = True
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                state["gone"] = True
            return state["gone"]

        def write_chunk(data):
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            except OSError:
                state["gone"] = True
                raise Disconnected()

        def emit(obj):
            if state["gone"]:
                raise Disconnected()
            write_chunk(json.dumps(obj).encode() + b"\n")

        with ctx.lock:
            if ctx.kc is None:
                raise HTTPError(404, "context %s was removed" % ctx.id)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            try:
                ctx.execute(code, env_vars, emit, gone)
            except Disconnected:
                raise
            except Exception as e:
                # The response has begun: report in the stream.
                traceback.print_exc()
                emit({"type": "error", "name": type(e).__name__, "value": str(e), "traceback": traceback.format_exc()})
        emit({"type": "end_of_execution"})
        write_chunk(b"")


def main():
    # The default Python kernel starts before the port opens: the daemon
    # holds a create until the port accepts connections, so the first
    # execution does not wait for a kernel.
    try:
        SERVER.default_context("python")
    except Exception:
        traceback.print_exc()
    httpd = ThreadingHTTPServer(("0.0.0.0", PORT), Handler)
    httpd.daemon_threads = True
    httpd.serve_forever()


if __name__ == "__main__":
    main()
