"""RevocationNotices: a cloud VM's revocation notice, from its metadata service, becomes a stop request.

A preemptible (GCE) or spot (AWS, Azure) VM learns from its provider's
instance metadata service that it will be taken away, some seconds ahead:
GCE's ``instance/preempted`` turns ``TRUE`` about 30 s before the shutdown,
AWS's ``spot/instance-action`` answers (instead of 404) with the action and
its time two minutes ahead, Azure's Scheduled Events list a ``Preempt``
event with its ``NotBefore`` time at least 30 s ahead. A provider class
here turns one answer into a :class:`Notice` (the source and the deadline)
or None; :class:`RevocationNotices` polls one provider from a daemon thread
and hands the first notice to a callback: the
:meth:`SignalAgreement.request <keras_adapt.coordination.SignalAgreement.request>`
that a SIGTERM would set, so the workers stop at the same agreed step.

Example:

>>> from keras_adapt.coordination.revocation_notices import PROVIDERS, GceNotices
>>> sorted(PROVIDERS)
['aws', 'azure', 'gce']
>>> GceNotices().parse(200, "TRUE", now=1000.0)
Notice(source='gce', deadline=1030.0, detail='instance/preempted is TRUE')
"""

import collections
import datetime
import email.utils
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

from keras_adapt.checks import check_float, invalid

#: Environment variable that overrides every provider's metadata endpoint
#: (a base URL such as ``http://127.0.0.1:8808``): tests, proxies.
ENDPOINT_ENV = "KERAS_ADAPT_METADATA_ENDPOINT"


class MetadataError(ValueError):
    """An answer of a metadata service that is not in its documented format.

    Example:

    >>> from keras_adapt.coordination.revocation_notices import AwsNotices, MetadataError
    >>> try:
    ...     AwsNotices().parse(200, "not json", now=0.0)
    ... except MetadataError as error:
    ...     print(str(error)[:34])
    aws spot/instance-action: not JSON
    """


class Notice(collections.namedtuple("Notice", "source deadline detail")):
    """A revocation notice: ``source`` (the provider, ``"gce"``),
    ``deadline`` (``time.time()`` by which the VM goes) and ``detail`` (what
    the service said).

    Example:

    >>> from keras_adapt.coordination.revocation_notices import Notice
    >>> Notice("aws", 1120.0, "terminate").time_left(now=1000.0)
    120.0
    """

    __slots__ = ()

    def time_left(self, now=None):
        """Seconds from ``now`` (default: the current time) to the deadline."""
        return self.deadline - (time.time() if now is None else now)


class GceNotices:
    """Google Compute Engine: ``GET /computeMetadata/v1/instance/preempted``
    with ``Metadata-Flavor: Google`` answers ``TRUE`` once the VM is
    preempted, else ``FALSE``. The answer holds no time: the shutdown comes
    about :attr:`lead_s` (30 s) after it turns ``TRUE``.

    Example:

    >>> from keras_adapt.coordination.revocation_notices import GceNotices
    >>> GceNotices().parse(200, "FALSE", now=0.0) is None
    True
    """

    name = "gce"
    default_endpoint = "http://metadata.google.internal"
    path = "/computeMetadata/v1/instance/preempted"
    headers = {"Metadata-Flavor": "Google"}
    #: Seconds from the notice to the shutdown (the documented lead).
    lead_s = 30.0

    def poll(self, fetch, now):
        """One look: ``fetch(method, path, headers)`` returns ``(status,
        body)``; returns a :class:`Notice` or None."""
        return self.parse(*fetch("GET", self.path, self.headers), now=now)

    def parse(self, status, body, now):
        """The notice in one answer, None without one; :class:`MetadataError`
        for an answer in no documented form."""
        value = body.strip().upper() if status == 200 else None
        if value == "TRUE":
            return Notice(self.name, now + self.lead_s, "instance/preempted is TRUE")
        if value == "FALSE":
            return None
        raise MetadataError(f"gce instance/preempted: HTTP {status} {body[:80]!r}; expected "
                            "200 with TRUE or FALSE")


def _utc_seconds(text, parse):
    value = parse(text)
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.timezone.utc)
    return value.timestamp()


class AwsNotices:
    """AWS EC2 spot, IMDSv2: ``PUT /latest/api/token`` (header
    ``X-aws-ec2-metadata-token-ttl-seconds``) gives a session token, then
    ``GET /latest/meta-data/spot/instance-action`` with
    ``X-aws-ec2-metadata-token`` answers 404 until a notice, then
    ``{"action": "terminate"|"stop"|"hibernate", "time": "...Z"}`` (two
    minutes ahead). An expired token (401) is renewed at the next poll.

    Example:

    >>> from keras_adapt.coordination.revocation_notices import AwsNotices
    >>> body = '{"action": "terminate", "time": "2026-12-07T14:02:00Z"}'
    >>> notice = AwsNotices().parse(200, body, now=0.0)
    >>> notice.source, notice.deadline, notice.detail
    ('aws', 1796652120.0, 'terminate at 2026-12-07T14:02:00Z')
    >>> AwsNotices().parse(404, "", now=0.0) is None
    True
    """

    name = "aws"
    default_endpoint = "http://169.254.169.254"
    path = "/latest/meta-data/spot/instance-action"
    token_path = "/latest/api/token"
    token_ttl_s = 21600
    lead_s = 120.0

    def __init__(self):
        self._token = None

    def poll(self, fetch, now):
        """One look (a token first when none is held); a :class:`Notice` or None."""
        if self._token is None:
            status, body = fetch("PUT", self.token_path,
                                 {"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)})
            if status != 200 or not body.strip():
                raise MetadataError(f"aws api/token: HTTP {status} {body[:80]!r}; expected 200 "
                                    "with a token")
            self._token = body.strip()
        status, body = fetch("GET", self.path, {"X-aws-ec2-metadata-token": self._token})
        if status == 401:
            self._token = None
        return self.parse(status, body, now)

    def parse(self, status, body, now):
        """The notice in one answer (404: none); :class:`MetadataError` otherwise."""
        if status == 404:
            return None
        if status != 200:
            raise MetadataError(f"aws spot/instance-action: HTTP {status} {body[:80]!r}")
        try:
            answer = json.loads(body)
            action, when = answer["action"], answer["time"]
            deadline = _utc_seconds(when.replace("Z", "+00:00"),
                                    datetime.datetime.fromisoformat)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise MetadataError(f"aws spot/instance-action: not JSON with action and time: "
                                f"{body[:80]!r} ({error})") from None
        return Notice(self.name, deadline, f"{action} at {when}")


class AzureNotices:
    """Azure Scheduled Events: ``GET /metadata/scheduledevents?api-version=
    2020-07-01`` with ``Metadata: true`` lists the upcoming events; a
    ``Preempt`` event (``EventStatus`` ``Scheduled`` or ``Started``) whose
    ``Resources`` name this VM is the notice, due at ``NotBefore`` (at least
    30 s ahead; empty once started: now). Events of other VMs of the same
    availability set or scale set are ignored when the VM's name is known:
    ``vm_name``, else asked once from ``/metadata/instance/compute/name``;
    if that fails, every ``Preempt`` event counts.

    Example:

    >>> from keras_adapt.coordination.revocation_notices import AzureNotices
    >>> body = ('{"DocumentIncarnation": 2, "Events": [{"EventId": "e1", "EventType": '
    ...         '"Preempt", "ResourceType": "VirtualMachine", "Resources": ["vm1"], '
    ...         '"EventStatus": "Scheduled", "NotBefore": "Mon, 07 Dec 2026 14:02:00 GMT", '
    ...         '"DurationInMins": -1, "EventSource": "Platform"}]}')
    >>> AzureNotices("vm1").parse(200, body, now=0.0).deadline
    1796652120.0
    >>> AzureNotices("vm2").parse(200, body, now=0.0) is None
    True
    """

    name = "azure"
    default_endpoint = "http://169.254.169.254"
    path = "/metadata/scheduledevents?api-version=2020-07-01"
    name_path = "/metadata/instance/compute/name?api-version=2021-02-01&format=text"
    headers = {"Metadata": "true"}
    lead_s = 30.0

    def __init__(self, vm_name=None):
        if vm_name is not None and (not isinstance(vm_name, str) or not vm_name):
            raise invalid("vm_name", vm_name, "use the VM's name (a non-empty string) or None "
                          "to ask the metadata service")
        self.vm_name = vm_name
        self._asked = vm_name is not None

    def poll(self, fetch, now):
        """One look (the VM's name first, once); a :class:`Notice` or None."""
        if not self._asked:
            self._asked = True
            status, body = fetch("GET", self.name_path, self.headers)
            if status == 200 and body.strip():
                self.vm_name = body.strip()
        return self.parse(*fetch("GET", self.path, self.headers), now=now)

    def parse(self, status, body, now):
        """The first ``Preempt`` event of this VM in one answer, or None."""
        if status != 200:
            raise MetadataError(f"azure scheduledevents: HTTP {status} {body[:80]!r}")
        try:
            events = json.loads(body)["Events"]
            for event in events:
                if event["EventType"] != "Preempt" or event.get("EventStatus") not in (
                        "Scheduled", "Started"):
                    continue
                if self.vm_name is not None and self.vm_name not in event.get("Resources", ()):
                    continue
                before = event.get("NotBefore") or ""
                deadline = _utc_seconds(before, email.utils.parsedate_to_datetime) \
                    if before else now
                return Notice(self.name, deadline,
                              f"Preempt {event['EventId']} not before {before or 'now'}")
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise MetadataError(f"azure scheduledevents: not the documented JSON: "
                                f"{body[:80]!r} ({error!r})") from None
        return None


#: The providers by name.
PROVIDERS = {p.name: p for p in (GceNotices, AwsNotices, AzureNotices)}


class RevocationNotices:
    """Watches one provider's metadata service for a revocation notice, from
    a daemon thread of this process.

    :meth:`start` polls every ``poll_s`` seconds (each request bounded by
    ``timeout_s``) until the first notice, which it hands to ``on_notice(source,
    deadline)``, then stops polling. A service that cannot be reached or
    answers in no documented form is reported once on stderr and polled on
    (a VM whose service is slow to come up still gets its notice); nothing
    it answers ends the training. :meth:`stop` ends the thread.
    :class:`~keras_adapt.callbacks.PreemptionCheckpoint` (``notices=``)
    starts it at the beginning of ``fit`` and stops it at the end.

    Args:
        provider: ``"gce"``, ``"aws"`` or ``"azure"``.
        endpoint: the metadata service's base URL (``http://host[:port]``);
            default: the environment variable ``KERAS_ADAPT_METADATA_ENDPOINT``,
            else the provider's (``http://metadata.google.internal``,
            ``http://169.254.169.254``).
        poll_s: seconds between two looks (AWS advises at most 5).
        timeout_s: the bound on one request.
        vm_name: Azure only: this VM's name, to skip events of other VMs
            (None: asked from the metadata service).

    Attributes:
        notice: the :class:`Notice` seen, or None.
        lead_s: the provider's documented shortest time from notice to
            shutdown (30 s, AWS 120 s).

    Example (a service that cannot be reached: no notice, one line on stderr):

    >>> from keras_adapt.coordination import RevocationNotices
    >>> notices = RevocationNotices("gce", endpoint="http://127.0.0.1:9", timeout_s=0.5)
    >>> notices.check() is None, notices.endpoint, notices.lead_s
    (True, 'http://127.0.0.1:9', 30.0)
    """

    def __init__(self, provider, endpoint=None, poll_s=1.0, timeout_s=2.0, vm_name=None):
        if provider not in PROVIDERS:
            raise invalid("provider", provider, f"use one of {sorted(PROVIDERS)}")
        if vm_name is not None and provider != "azure":
            raise invalid("vm_name", vm_name, "leave it None: only Azure's events name VMs")
        endpoint = endpoint or os.environ.get(ENDPOINT_ENV) or PROVIDERS[provider].default_endpoint
        if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
            raise invalid("endpoint", endpoint, "use a base URL such as http://127.0.0.1:8808 "
                          f"(or set {ENDPOINT_ENV})")
        self.provider = provider
        self.endpoint = endpoint.rstrip("/")
        self.poll_s = check_float("poll_s", poll_s, low_open=True)
        self.timeout_s = check_float("timeout_s", timeout_s, low_open=True)
        self._source = AzureNotices(vm_name) if provider == "azure" else PROVIDERS[provider]()
        self.lead_s = self._source.lead_s
        self.notice = None
        self._reported = False
        self._stopped = threading.Event()
        self._thread = None

    def __repr__(self):
        return f"RevocationNotices({self.provider!r}, endpoint={self.endpoint!r})"

    def _fetch(self, method, path, headers):
        request = urllib.request.Request(self.endpoint + path, method=method, headers=headers,
                                         data=b"" if method == "PUT" else None)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                return answer.status, answer.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode("utf-8", "replace")

    def check(self):
        """One look now: the :class:`Notice`, or None (none yet, or the
        service failed: reported once on stderr)."""
        try:
            notice = self._source.poll(self._fetch, time.time())
        except (OSError, MetadataError) as error:  # URLError, timeouts, refused: OSErrors
            if not self._reported:
                self._reported = True
                sys.stderr.write(f"[keras-adapt] {self!r}: no answer in the documented form "
                                 f"({error}); polling on, no preemption notice until it "
                                 "answers\n")
                sys.stderr.flush()
            return None
        if notice is not None:
            self.notice = notice
        return notice

    def start(self, on_notice):
        """Polls from a daemon thread until the first notice, then calls
        ``on_notice(source, deadline)`` once (again while running: no effect)."""
        if not callable(on_notice):
            raise TypeError(f"on_notice must be callable, got {on_notice!r}")
        if self._thread is not None and self._thread.is_alive():
            return
        self._stopped.clear()
        self._thread = threading.Thread(target=self._watch, args=(on_notice,), daemon=True,
                                        name=f"keras-adapt-{self.provider}-notices")
        self._thread.start()

    def _watch(self, on_notice):
        while not self._stopped.is_set():
            notice = self.check()
            if notice is not None:
                on_notice(notice.source, notice.deadline)
                return
            self._stopped.wait(self.poll_s)

    def stop(self):
        """Ends the polling thread (waits for a request in flight: at most ``timeout_s``)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def as_notices(notices):
    """A callback's ``notices=`` argument as a :class:`RevocationNotices` or
    None: a provider name makes a watcher with the defaults; anything else
    but None or a watcher is a TypeError that names it.

    Example:

    >>> from keras_adapt.coordination.revocation_notices import as_notices
    >>> as_notices("aws"), as_notices(None)
    (RevocationNotices('aws', endpoint='http://169.254.169.254'), None)
    """
    if isinstance(notices, str):
        return RevocationNotices(notices)
    if notices is not None and not isinstance(notices, RevocationNotices):
        raise TypeError(f"notices must be None, a provider name ('gce', 'aws', 'azure') or a "
                        f"keras_adapt.coordination.RevocationNotices, got {notices!r}")
    return notices
