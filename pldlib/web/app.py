"""The calculator's web application (Tornado): one page and a small JSON API.

* ``GET /`` -- the page (:mod:`pldlib.web.page`);
* ``POST /api/atlas`` -- form fields in, ``{"query", "atlas"}`` out at once (the shipped atlas's
  certified sigma), or ``400 {"field", "error"}`` with the command line's message;
* ``POST /api/jobs`` -- starts the exact answer (:func:`pldlib.web.compute.exact_answer`) in a
  child process: ``{"id", "state", ...}``; ``GET /api/jobs/ID`` -- its stages so far and, once
  done, its result; ``DELETE /api/jobs/ID`` -- cancels it.

Tornado is the web framework already installed with Dask's distributed (its dashboard).
"""
from __future__ import annotations

import json
import threading

import tornado.ioloop
import tornado.web

from .compute import QueryError, atlas_answer, parse_query
from .jobs import Jobs
from .page import page_html

DEFAULT_PORT = 8050


class _Base(tornado.web.RequestHandler):
    def initialize(self, state):
        self.state = state

    def send(self, obj, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(obj, allow_nan=False, default=str))

    def form(self) -> dict:
        try:
            data = json.loads(self.request.body or b"{}")
        except ValueError:
            raise QueryError("form", "the request body must be JSON") from None
        if not isinstance(data, dict):
            raise QueryError("form", "the request body must be a JSON object of form fields")
        return data


class PageHandler(_Base):
    def get(self):
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(page_html(mode="server"))


class AtlasHandler(_Base):
    def post(self):
        try:
            query = parse_query(self.form())
        except QueryError as e:
            return self.send({"field": e.field, "error": str(e)}, 400)
        self.send({"query": query.as_dict(), "atlas": atlas_answer(query, self.state["atlas"]())})


class JobsHandler(_Base):
    def post(self):
        try:
            query = parse_query(self.form())
        except QueryError as e:
            return self.send({"field": e.field, "error": str(e)}, 400)
        self.send(self.state["jobs"].submit(query).as_dict(), 201)


class JobHandler(_Base):
    def get(self, job_id):
        job = self.state["jobs"].get(job_id)
        if job is None:
            return self.send({"error": f"no job {job_id!r}"}, 404)
        self.send(job.as_dict())

    def delete(self, job_id):
        job = self.state["jobs"].cancel(job_id)
        if job is None:
            return self.send({"error": f"no job {job_id!r}"}, 404)
        self.send(job.as_dict())


def make_app(atlas=None) -> tornado.web.Application:
    """The application; ``atlas``: an opened :class:`pldlib.atlas.Atlas` (default: the shipped one,
    opened on first use)."""
    lock = threading.Lock()
    cache = {"atlas": atlas}

    def get_atlas():
        with lock:
            if cache["atlas"] is None:
                from ..atlas import default_atlas_path, open_atlas

                path = default_atlas_path()
                cache["atlas"] = open_atlas(path) if path else False
            return cache["atlas"] or None

    state = {"jobs": Jobs(), "atlas": get_atlas}
    app = tornado.web.Application([
        (r"/", PageHandler, {"state": state}),
        (r"/api/atlas", AtlasHandler, {"state": state}),
        (r"/api/jobs", JobsHandler, {"state": state}),
        (r"/api/jobs/([0-9]+)", JobHandler, {"state": state}),
    ])
    app.pldlib_state = state
    return app


class BackgroundServer:
    """The application on a free port of 127.0.0.1, in a thread of this process (tests and
    benchmarks): ``url``, ``request(method, path, body)`` -> (status, JSON), ``close()``."""

    def __init__(self, atlas=None):
        import asyncio

        import tornado.httpserver
        import tornado.netutil

        self.app = make_app(atlas)
        ready = threading.Event()

        def run():
            asyncio.set_event_loop(asyncio.new_event_loop())
            socks = tornado.netutil.bind_sockets(0, address="127.0.0.1")
            self.port = socks[0].getsockname()[1]
            self.server = tornado.httpserver.HTTPServer(self.app)
            self.server.add_sockets(socks)
            self.loop = tornado.ioloop.IOLoop.current()
            self.loop.add_callback(ready.set)
            self.loop.start()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        if not ready.wait(30):
            raise RuntimeError("the calculator's server did not start")
        self.url = f"http://127.0.0.1:{self.port}/"

    def request(self, method: str, path: str, body=None):
        import urllib.error
        import urllib.request

        req = urllib.request.Request(self.url + path.lstrip("/"), method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def wait_job(self, job_id: str, timeout: float = 120.0) -> dict:
        import time

        t0 = time.time()
        while time.time() - t0 < timeout:
            _, j = self.request("GET", f"/api/jobs/{job_id}")
            if j["state"] not in ("queued", "running"):
                return j
            time.sleep(0.05)
        raise TimeoutError(f"job {job_id} still running after {timeout} s")

    def close(self) -> None:
        self.app.pldlib_state["jobs"].shutdown()
        self.loop.add_callback(self.loop.stop)
        self.thread.join(10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def serve(host: str = "127.0.0.1", port: int = DEFAULT_PORT, ready=None) -> None:
    """Run the calculator until interrupted (``ready(url)`` is called once it listens)."""
    import tornado.httpserver
    import tornado.netutil

    app = make_app()
    sockets = tornado.netutil.bind_sockets(port, address=host)
    server = tornado.httpserver.HTTPServer(app)
    server.add_sockets(sockets)
    url = f"http://{host}:{sockets[0].getsockname()[1]}/"
    loop = tornado.ioloop.IOLoop.current()
    # open the atlas before the first request (its first look-up then answers at once)
    loop.run_in_executor(None, app.pldlib_state["atlas"])
    if ready is not None:
        loop.add_callback(ready, url)
    try:
        loop.start()
    finally:
        server.stop()
        app.pldlib_state["jobs"].shutdown()
