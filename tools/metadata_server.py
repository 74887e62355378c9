"""An emulated cloud metadata service (GCE, AWS IMDSv2, Azure Scheduled Events) for tests.

It answers the revocation-notice requests of one provider in that provider's
documented format: "no notice" until it is triggered, then the notice, due
``--lead-s`` seconds after the first answer that carried it. It insists on
each provider's request headers (GCE ``Metadata-Flavor: Google``, AWS's
session token from ``PUT /latest/api/token``, Azure ``Metadata: true``) as
the real services do. Only ever bind it to a loopback address, on the
machine or inside an emulated host's network namespace (so only that "VM"
sees its notice); the real services' link-local address is never used.

Triggered by ``trigger()`` (from Python), or with ``--progress-file F
--at-step N`` once the integer in ``F`` (a training step a worker writes)
reaches ``N``. ``--record R`` writes ``{"served_at", "deadline"}`` (wall
clock) when the notice is first answered.

Command line::

    ip netns exec ka-h3 python tools/metadata_server.py --provider gce \\
        --port 8808 --progress-file out/progress --at-step 37 --record out/notice.json

From Python::

    with MetadataServer("aws") as server:   # on 127.0.0.1, a free port
        ...  # RevocationNotices("aws", endpoint=server.url)
        server.trigger()
"""

import argparse
import contextlib
import email.utils
import http.server
import json
import os
import sys
import threading
import time
import uuid

PROVIDERS = ("gce", "aws", "azure")
#: The documented shortest time from notice to shutdown.
LEAD_S = {"gce": 30.0, "aws": 120.0, "azure": 30.0}


class MetadataServer:
    """One provider's emulated metadata service on ``host:port`` (port 0: a
    free one); ``url`` is its base URL once started. ``mode`` may be set to
    ``"malformed"`` (a 200 answer in no documented form) to test clients."""

    def __init__(self, provider, host="127.0.0.1", port=0, lead_s=None, vm_name="vm0",
                 progress_file=None, at_step=None, record=None):
        if provider not in PROVIDERS:
            raise ValueError(f"provider={provider!r}; use one of {PROVIDERS}")
        self.provider, self.host, self.port = provider, host, port
        self.lead_s = LEAD_S[provider] if lead_s is None else float(lead_s)
        self.vm_name, self.record = vm_name, record
        self.progress_file, self.at_step = progress_file, at_step
        self.mode = "normal"
        self.requests = []  # (method, path) of every request answered
        self.served_at = self.deadline = None
        self._triggered = False
        self._tokens = set()
        self._lock = threading.Lock()
        self._httpd = self._thread = None

    # -- state -------------------------------------------------------------
    def trigger(self):
        """From now on, the answers carry the notice."""
        self._triggered = True

    def _noticed(self):
        """Whether to answer with the notice; the first time, fixes its deadline."""
        if not self._triggered and self.progress_file and self.at_step is not None:
            with contextlib.suppress(OSError, ValueError):
                with open(self.progress_file) as f:
                    self._triggered = int(f.read().strip() or 0) >= self.at_step
        if not self._triggered:
            return False
        with self._lock:
            if self.served_at is None:
                self.served_at = time.time()
                self.deadline = self.served_at + self.lead_s
                if self.record:
                    tmp = self.record + ".tmp"
                    with open(tmp, "w") as f:
                        json.dump({"provider": self.provider, "served_at": self.served_at,
                                   "deadline": self.deadline}, f)
                    os.replace(tmp, self.record)
        return True

    # -- answers -------------------------------------------------------------
    def answer(self, method, path, headers):
        """``(status, body)`` for one request."""
        self.requests.append((method, path))
        if self.mode == "malformed":
            return 200, "<html>captive portal</html>"
        return getattr(self, f"_{self.provider}")(method, path, headers)

    def _gce(self, method, path, headers):
        if headers.get("Metadata-Flavor") != "Google":
            return 403, "Missing Metadata-Flavor:Google header."
        if method != "GET" or path.split("?")[0] != "/computeMetadata/v1/instance/preempted":
            return 404, "not found"
        return 200, "TRUE" if self._noticed() else "FALSE"

    def _aws(self, method, path, headers):
        if path == "/latest/api/token":
            if method != "PUT" or not headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return 400, ""
            token = uuid.uuid4().hex
            self._tokens.add(token)
            return 200, token
        if headers.get("X-aws-ec2-metadata-token") not in self._tokens:
            return 401, ""
        if method != "GET" or path != "/latest/meta-data/spot/instance-action":
            return 404, ""
        if not self._noticed():
            return 404, ""
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.deadline))
        return 200, json.dumps({"action": "terminate", "time": when})

    def _azure(self, method, path, headers):
        if headers.get("Metadata") != "true":
            return 400, json.dumps({"error": "Bad request. Required metadata header not specified"})
        if path.startswith("/metadata/instance/compute/name"):
            return 200, self.vm_name
        if method != "GET" or path != "/metadata/scheduledevents?api-version=2020-07-01":
            return 404, ""
        events = []
        if self._noticed():
            events.append({"EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
                           "EventType": "Preempt", "ResourceType": "VirtualMachine",
                           "Resources": [self.vm_name], "EventStatus": "Scheduled",
                           "NotBefore": email.utils.formatdate(self.deadline, usegmt=True),
                           "Description": "", "EventSource": "Platform",
                           "DurationInMins": -1})
        # An event of another VM of the same scale set: never this VM's notice.
        events.append({"EventId": "c3a0d3b2-0000-4000-8000-000000000001",
                       "EventType": "Preempt", "ResourceType": "VirtualMachine",
                       "Resources": [self.vm_name + "-other"], "EventStatus": "Scheduled",
                       "NotBefore": email.utils.formatdate(time.time() + 30, usegmt=True),
                       "Description": "", "EventSource": "Platform", "DurationInMins": -1})
        return 200, json.dumps({"DocumentIncarnation": 1 + len(events), "Events": events})

    # -- serving -------------------------------------------------------------
    def start(self):
        """Serves from a daemon thread; returns self."""
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _reply(self):
                status, body = server.answer(self.command, self.path, self.headers)
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = _reply

            def log_message(self, *args):
                pass

        self._httpd = http.server.ThreadingHTTPServer((self.host, self.port), Handler)
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    @property
    def url(self):
        return f"http://{self.host}:{self.port}"

    def stop(self):
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join()
            self._httpd = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--provider", required=True, choices=PROVIDERS)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8808)
    parser.add_argument("--lead-s", type=float, default=None)
    parser.add_argument("--vm-name", default="vm0")
    parser.add_argument("--progress-file")
    parser.add_argument("--at-step", type=int)
    parser.add_argument("--record")
    parser.add_argument("--ready-file", help="written once the port is bound")
    args = parser.parse_args(argv)
    if not args.host.startswith("127."):
        parser.error(f"--host {args.host}: serve on a loopback address only")
    server = MetadataServer(args.provider, args.host, args.port, args.lead_s, args.vm_name,
                            args.progress_file, args.at_step, args.record).start()
    if args.ready_file:
        with open(args.ready_file, "w") as f:
            f.write(server.url)
    print(server.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
