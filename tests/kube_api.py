"""An emulated Kubernetes API server for tests: the pod list of one namespace, on loopback.

It answers ``GET /api/v1/namespaces/{ns}/pods?labelSelector=...`` as the real
API server does: a ``PodList`` (``apiVersion``, ``kind``, ``metadata`` with
a ``resourceVersion``, ``items`` without their own ``kind``), each pod with
metadata (name, namespace, labels, uid, creationTimestamp and, while it is
being deleted, deletionTimestamp), spec (containers, hostname, subdomain)
and status (phase, podIP, the four standard conditions). Label selectors
are matched here, independently of keras-adapt's code: equality
(``k=v``, ``k==v``), inequality (``k!=v``), existence (``k``, ``!k``) and
sets (``k in (a,b)``, ``k notin (a,b)``). A bearer token is required;
without it or with another one the answer is the API's 401 ``Status``.
Errors on demand (:meth:`KubeAPI.fail`): an HTTP status or a body that is
not JSON. With ``tls=(certificate, key)`` it serves https, as the real
API server does.

A test changes a pod with :meth:`KubeAPI.set_pod`, or lets a process change
them through a file (:meth:`KubeAPI.follow`): before each answer the server
applies the file's ``{"pod": "state", ...}`` whenever its content changed.

Nothing listens beyond 127.0.0.1.
"""

import http.server
import json
import re
import ssl
import threading
import urllib.parse
import uuid

#: The pod states a test sets: (phase, Ready, being deleted).
STATES = {
    "pending": ("Pending", False, False),
    "ready": ("Running", True, False),
    "not-ready": ("Running", False, False),
    "terminating": ("Running", True, True),
    "failed": ("Failed", False, False),
}

_STAMP = "2026-01-01T00:00:00Z"


def _requirement(text):
    """A predicate on a label dict for one selector requirement."""
    text = text.strip()
    m = re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", text)
    if m:
        key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    m = re.fullmatch(r"([^=!\s]+)\s*(==|=|!=)\s*(\S*)", text)
    if m:
        key, op, value = m.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if text.startswith("!"):
        key = text[1:].strip()
        return lambda labels: key not in labels
    return lambda labels: text in labels


def selector_matches(selector, labels):
    """Whether ``labels`` satisfy every requirement of ``selector`` (empty: all)."""
    parts = [p for p in re.split(r",(?![^()]*\))", selector or "") if p.strip()]
    return all(_requirement(p)(labels) for p in parts)


class KubeAPI:
    """The emulated API server: ``with KubeAPI(token="t") as api: api.url``."""

    def __init__(self, namespace="default", token="test-token", tls=None):
        self.namespace, self.token = namespace, token
        self.tls = tls  # (certificate file, key file): serve https
        self.pods = {}  # name -> pod dict, in insertion order
        self.requests = []  # (path, authorization header) of every GET
        self._lock = threading.Lock()
        self._failure = None
        self._follow, self._followed = None, None
        self._version = 1
        self._server = None

    # -- the test's side --------------------------------------------------------

    def add_pod(self, name, labels, state="pending", ip=None, hostname=None, subdomain=None):
        """Adds a pod (``state`` one of :data:`STATES`)."""
        spec = {"containers": [{"name": "worker", "image": "keras-adapt:test"}],
                "restartPolicy": "Never"}
        if hostname is not None:
            spec["hostname"] = hostname
        if subdomain is not None:
            spec["subdomain"] = subdomain
        pod = {"metadata": {"name": name, "namespace": self.namespace, "labels": dict(labels),
                            "uid": str(uuid.uuid4()), "resourceVersion": "1",
                            "creationTimestamp": _STAMP},
               "spec": spec, "status": {"phase": "Pending", "conditions": []}}
        if ip is not None:
            pod["status"]["podIP"] = ip
            pod["status"]["podIPs"] = [{"ip": ip}]
        with self._lock:
            self.pods[name] = pod
            self._set(name, state)

    def set_pod(self, name, state):
        """Moves pod ``name`` to ``state`` (:data:`STATES`), or removes it (``"gone"``)."""
        with self._lock:
            self._set(name, state)

    def _set(self, name, state):
        self._version += 1
        if state == "gone":
            del self.pods[name]
            return
        phase, ready, deleting = STATES[state]
        pod = self.pods[name]
        pod["metadata"]["resourceVersion"] = str(self._version)
        pod["metadata"].pop("deletionTimestamp", None)
        if deleting:
            pod["metadata"]["deletionTimestamp"] = _STAMP
            pod["metadata"]["deletionGracePeriodSeconds"] = 30
        status = "True" if ready else "False"
        pod["status"]["phase"] = phase
        pod["status"]["conditions"] = [
            {"type": "Initialized", "status": "True", "lastTransitionTime": _STAMP},
            {"type": "Ready", "status": status, "lastTransitionTime": _STAMP},
            {"type": "ContainersReady", "status": status, "lastTransitionTime": _STAMP},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": _STAMP}]
        if phase == "Pending":
            pod["status"]["conditions"] = pod["status"]["conditions"][-1:]

    def follow(self, path):
        """Before each answer, applies the pod states in the file ``path``
        (JSON ``{"pod": "state"}``) whenever its content changed."""
        self._follow = str(path)

    def fail(self, status=None, body=None):
        """From now on answers HTTP ``status`` (with a Status body), or 200
        with ``body`` (e.g. not JSON); ``fail()`` heals it."""
        self._failure = None if status is None and body is None else (status or 200, body)

    def pod_list(self, selector=""):
        """The PodList the API returns for ``selector`` (a dict)."""
        with self._lock:
            self._apply_followed()
            items = [json.loads(json.dumps(p)) for p in self.pods.values()
                     if selector_matches(selector, p["metadata"]["labels"])]
            return {"apiVersion": "v1", "kind": "PodList",
                    "metadata": {"resourceVersion": str(self._version)}, "items": items}

    def _apply_followed(self):
        if self._follow is None:
            return
        try:
            with open(self._follow) as f:
                text = f.read()
        except FileNotFoundError:
            return
        if text != self._followed and text.strip():
            for name, state in json.loads(text).items():
                self._set(name, state)
            self._followed = text

    # -- the server -------------------------------------------------------------

    @property
    def url(self):
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self):
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code, payload, raw=None):
                body = raw if raw is not None else json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _status(self, code, reason, message):
                self._send(code, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                  "status": "Failure", "message": message, "reason": reason,
                                  "code": code})

            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                auth = self.headers.get("Authorization")
                api.requests.append((self.path, auth))
                if auth != f"Bearer {api.token}":
                    return self._status(401, "Unauthorized", "Unauthorized")
                if api._failure is not None:
                    code, body = api._failure
                    if body is not None:
                        return self._send(code, None, raw=body.encode())
                    return self._status(code, "InternalError", "etcdserver: request timed out")
                m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods", url.path)
                if not m:
                    return self._status(404, "NotFound", "the server could not find the "
                                        "requested resource")
                if m.group(1) != api.namespace:
                    return self._send(200, {"apiVersion": "v1", "kind": "PodList",
                                            "metadata": {"resourceVersion": "1"}, "items": []})
                query = urllib.parse.parse_qs(url.query)
                self._send(200, api.pod_list(query.get("labelSelector", [""])[0]))

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()
