"""Hosts for Horovod Elastic from the Kubernetes API: the ready pods a label selector matches.

On Kubernetes the machines of an elastic job are pods. With Kubeflow's MPI
Operator (``kubeflow.org/v2beta1`` ``MPIJob``) every worker pod carries the
labels ``training.kubeflow.org/job-name=<job>`` and
``training.kubeflow.org/job-role=worker``, the host name ``<job>-worker-<i>``
(``spec.hostname``) and the subdomain ``<job>`` (``spec.subdomain``, the
job's headless service), so the launcher reaches it as
``<job>-worker-<i>.<job>.<namespace>.svc``, the name the operator writes
into its own hostfile. :class:`KubernetesPods` lists the pods that match a
selector in one namespace (one ``GET /api/v1/namespaces/NS/pods``), keeps
those that are ``Running``, ``Ready`` (the condition ``Ready`` is
``"True"``) and not being deleted (no ``metadata.deletionTimestamp``), and
names each by :data:`DEFAULT_HOST_FORMAT` or another format of the pod's
fields (:func:`pod_host`). ``keras-adapt discover --kubernetes-selector``
(:mod:`keras_adapt.discover`) prints them with their slots, capped by the
target file and minus the exclusion file.

Inside a pod the API server, the namespace and the credentials come from
the environment Kubernetes gives every container:
``KUBERNETES_SERVICE_HOST``/``KUBERNETES_SERVICE_PORT`` and the service
account's ``token``, ``ca.crt`` and ``namespace`` under
:data:`SERVICE_ACCOUNT_DIR`. The token is read at every request (the
kubelet rotates it). The service account needs ``get``/``list`` on pods in
its namespace (a Role and a RoleBinding, see examples/kubernetes/).

The request is plain ``urllib`` rather than the official ``kubernetes``
client: Horovod runs the discovery command about once a second, and the
client's import alone (every model of the API) costs more than the whole
answer; one authenticated GET needs nothing else.

Errors (the API unreachable, an HTTP error such as 401 or 403, an answer
that is not a PodList) raise :class:`KubernetesAPIError`, so ``keras-adapt
discover`` prints the error and the last good answer.

Example:

>>> from keras_adapt.kubernetes_pods import KubernetesPods, pod_host, pod_is_ready
>>> pod = {"metadata": {"name": "train-worker-0", "namespace": "ml"},
...        "spec": {"hostname": "train-worker-0", "subdomain": "train"},
...        "status": {"phase": "Running", "podIP": "10.4.0.7",
...                   "conditions": [{"type": "Ready", "status": "True"}]}}
>>> pod_is_ready(pod), pod_host(pod), pod_host(pod, "{ip}")
(True, 'train-worker-0.train.ml.svc', '10.4.0.7')
>>> pods = KubernetesPods("training.kubeflow.org/job-name=train,training.kubeflow.org/job-role=worker",
...                       namespace="ml", api="https://10.96.0.1:443", slots_per_pod=4)
>>> pods.hosts_of({"kind": "PodList", "items": [pod]})
[('train-worker-0.train.ml.svc', 4)]
"""

import hashlib
import json
import os
import re
import ssl
import string
import urllib.error
import urllib.parse
import urllib.request

from keras_adapt.checks import check_float, check_int

__all__ = ["DEFAULT_HOST_FORMAT", "HOST_FIELDS", "KubernetesAPIError", "KubernetesPods",
           "SERVICE_ACCOUNT_DIR", "cache_name", "check_selector", "pod_host", "pod_is_ready"]

#: Where Kubernetes mounts a pod's service account: ``token``, ``ca.crt``, ``namespace``.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: How a pod is named by default: the DNS name the MPI Operator's hostfile uses
#: (the pod's host name in the job's headless service).
DEFAULT_HOST_FORMAT = "{hostname}.{subdomain}.{namespace}.svc"
#: The fields a host format may use, each a pod field.
HOST_FIELDS = {
    "name": "metadata.name",
    "namespace": "metadata.namespace",
    "hostname": "spec.hostname (metadata.name when unset, as Kubernetes does)",
    "subdomain": "spec.subdomain",
    "ip": "status.podIP",
}

# One requirement of an equality- or set-based selector: key, !key, key=v,
# key==v, key!=v, key in (a,b), key notin (a,b). Keys may have a DNS prefix.
_KEY = r"(?:[A-Za-z0-9.\-]+/)?[A-Za-z0-9]([A-Za-z0-9_.\-]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([A-Za-z0-9_.\-]*[A-Za-z0-9])?)?"
_REQUIREMENT = re.compile(
    rf"^\s*(!?\s*{_KEY}|{_KEY}\s*(==|=|!=)\s*{_VALUE}|"
    rf"{_KEY}\s+(in|notin)\s+\(\s*{_VALUE}(\s*,\s*{_VALUE})*\s*\))\s*$")
_NAMESPACE = re.compile(r"^[a-z0-9]([a-z0-9\-]{0,61}[a-z0-9])?$")


class KubernetesAPIError(OSError):
    """The Kubernetes API could not answer the pod list: unreachable, an HTTP
    error (the message names the status and, for 401 and 403, the fix), or
    an answer that is not a PodList.

    Example:

    >>> from keras_adapt.kubernetes_pods import KubernetesAPIError
    >>> isinstance(KubernetesAPIError("HTTP 503"), OSError)
    True
    """


def check_selector(selector):
    """``selector`` if it is a label selector the API accepts (comma-separated
    ``key=value``, ``key!=value``, ``key``, ``!key``, ``key in (a,b)``,
    ``key notin (a,b)``); else ``ValueError`` naming the bad part and the fix.

    Example:

    >>> from keras_adapt.kubernetes_pods import check_selector
    >>> check_selector("training.kubeflow.org/job-name=train,training.kubeflow.org/job-role=worker")
    'training.kubeflow.org/job-name=train,training.kubeflow.org/job-role=worker'
    >>> check_selector("job-name: train")
    Traceback (most recent call last):
    ...
    ValueError: label selector 'job-name: train': 'job-name: train' is not a requirement; write comma-separated key=value (or key!=value, key, !key, key in (a,b)), e.g. training.kubeflow.org/job-name=train,training.kubeflow.org/job-role=worker
    """
    if not isinstance(selector, str) or not selector.strip():
        raise ValueError(f"label selector {selector!r} is empty; pass the worker pods' labels, "
                         "e.g. training.kubeflow.org/job-name=train,"
                         "training.kubeflow.org/job-role=worker")
    # Commas inside "in (a,b)" do not split requirements.
    for part in re.split(r",(?![^()]*\))", selector):
        if not _REQUIREMENT.match(part):
            raise ValueError(
                f"label selector {selector!r}: {part.strip()!r} is not a requirement; write "
                "comma-separated key=value (or key!=value, key, !key, key in (a,b)), e.g. "
                "training.kubeflow.org/job-name=train,training.kubeflow.org/job-role=worker")
    return selector


def pod_is_ready(pod):
    """Whether ``pod`` (a pod as the API returns it, a dict) can run a worker:
    phase ``Running``, condition ``Ready`` ``"True"``, not being deleted.

    Example:

    >>> from keras_adapt.kubernetes_pods import pod_is_ready
    >>> pod_is_ready({"status": {"phase": "Pending", "conditions": []}})
    False
    """
    metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
    if metadata.get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in status.get("conditions") or [])


def pod_host(pod, host_format=DEFAULT_HOST_FORMAT):
    """The host name of ``pod`` in ``host_format`` (fields :data:`HOST_FIELDS`);
    ``ValueError`` naming the pod, the field and the fix when the pod lacks one.

    Example:

    >>> from keras_adapt.kubernetes_pods import pod_host
    >>> pod_host({"metadata": {"name": "w-1", "namespace": "ml"}, "spec": {}}, "{hostname}")
    'w-1'
    """
    metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    fields = {"name": metadata.get("name"), "namespace": metadata.get("namespace"),
              "hostname": spec.get("hostname") or metadata.get("name"),
              "subdomain": spec.get("subdomain"), "ip": (pod.get("status") or {}).get("podIP")}
    for _, field, _, _ in string.Formatter().parse(host_format):
        if field is not None and not fields.get(field):
            raise ValueError(
                f"pod {fields['name']!r} has no {HOST_FIELDS.get(field, field)} for the host "
                f"format {host_format!r}; use a format of fields it has (e.g. '{{ip}}'), or give "
                "the pod template that field (the MPI Operator sets spec.hostname and "
                "spec.subdomain on its workers)")
    return host_format.format(**fields)


def cache_name(selector):
    """A file name part that identifies the pods of ``selector`` (for the
    last good answer when no target or exclusion file gives it a place;
    one launcher serves one job, whose selector names it).

    Example:

    >>> from keras_adapt.kubernetes_pods import cache_name
    >>> cache_name("app=x") == cache_name("app=x"), cache_name("app=x") == cache_name("app=y")
    (True, False)
    """
    return "kubernetes-" + hashlib.sha256(str(selector).encode()).hexdigest()[:16]


def _natural(name):
    """Sort key: digit runs compare as numbers (worker-2 before worker-10)."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


class KubernetesPods:
    """The ready pods matching a label selector in a namespace, as Horovod hosts.

    Args:
        selector: the label selector (:func:`check_selector`), e.g.
            ``training.kubeflow.org/job-name=train,training.kubeflow.org/job-role=worker``.
        namespace: the pods' namespace; default the service account's
            (``SERVICE_ACCOUNT_DIR/namespace``).
        api: the API server's URL (``https://host:port``); default from
            ``KUBERNETES_SERVICE_HOST`` and ``KUBERNETES_SERVICE_PORT``.
        slots_per_pod: workers per pod (one per GPU: the MPIJob's
            ``slotsPerWorker``).
        host_format: how a pod is named (:func:`pod_host`).
        token_file: the bearer token's file; default the service account's
            when it exists (else no token).
        ca_file: the CA bundle that signs an ``https`` server; default the
            service account's ``ca.crt`` when it exists.
        timeout: seconds one request may take.
        service_account_dir: where the service account's files are.

    Raises ``ValueError`` for a bad argument, or a namespace or server that
    is neither given nor found in the pod's environment.

    Example:

    >>> from keras_adapt.kubernetes_pods import KubernetesPods
    >>> pods = KubernetesPods("app=train", namespace="ml", api="http://127.0.0.1:8001")
    >>> pods.url
    'http://127.0.0.1:8001/api/v1/namespaces/ml/pods?labelSelector=app%3Dtrain'
    """

    def __init__(self, selector, namespace=None, api=None, slots_per_pod=1,
                 host_format=DEFAULT_HOST_FORMAT, token_file=None, ca_file=None, timeout=10.0,
                 service_account_dir=SERVICE_ACCOUNT_DIR):
        self.selector = check_selector(selector)
        self.slots_per_pod = check_int("slots_per_pod", slots_per_pod,
                                       fix="use an int >= 1: the workers per pod (its GPUs)")
        self.timeout = check_float("timeout", timeout, low_open=True)
        if not isinstance(host_format, str):
            raise TypeError(f"host_format={host_format!r} must be a str such as "
                            f"{DEFAULT_HOST_FORMAT!r}")
        try:
            used = [f for _, f, _, _ in string.Formatter().parse(host_format) if f is not None]
        except ValueError:
            used = None
        if not used or any(f not in HOST_FIELDS for f in used):
            raise ValueError(f"host_format={host_format!r} is not valid; use a format of the "
                             f"fields {', '.join('{' + f + '}' for f in HOST_FIELDS)}, e.g. "
                             f"{DEFAULT_HOST_FORMAT!r} or '{{ip}}'")
        self.host_format = host_format
        sa = os.fspath(service_account_dir)
        if namespace is None:
            try:
                with open(os.path.join(sa, "namespace"), encoding="utf-8") as f:
                    namespace = f.read().strip()
            except OSError:
                raise ValueError(
                    f"no namespace given and no service account namespace in {sa}/namespace "
                    "(not in a pod?); pass namespace= (--kubernetes-namespace NS)") from None
        if not isinstance(namespace, str) or not _NAMESPACE.match(namespace):
            raise ValueError(f"namespace={namespace!r} is not a Kubernetes namespace name; use "
                             "lower-case letters, digits and '-', e.g. 'default'")
        self.namespace = namespace
        if api is None:
            host = os.environ.get("KUBERNETES_SERVICE_HOST")
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise ValueError(
                    "no API server given and KUBERNETES_SERVICE_HOST is not set (not in a "
                    "pod?); pass api='https://HOST:PORT' (--kubernetes-api URL)")
            api = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        parsed = urllib.parse.urlsplit(api) if isinstance(api, str) else None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"api={api!r} is not the URL of an API server; use "
                             "'https://HOST:PORT' (or http:// for a local proxy)")
        self.api = api.rstrip("/")
        default_token = os.path.join(sa, "token")
        if token_file is None and os.path.exists(default_token):
            token_file = default_token
        self.token_file = None if token_file is None else os.fspath(token_file)
        if self.token_file is not None and not os.path.isfile(self.token_file):
            raise ValueError(f"token_file={self.token_file!r} does not exist; pass the file "
                             "holding the bearer token (in a pod: the service account's "
                             f"{default_token})")
        default_ca = os.path.join(sa, "ca.crt")
        if ca_file is None and os.path.exists(default_ca):
            ca_file = default_ca
        self.ca_file = None if ca_file is None else os.fspath(ca_file)
        if self.ca_file is not None and not os.path.isfile(self.ca_file):
            raise ValueError(f"ca_file={self.ca_file!r} does not exist; pass the CA bundle that "
                             f"signs the API server's certificate (in a pod: {default_ca})")

    @property
    def url(self):
        """The URL of the pod list request.

        Example:

        >>> from keras_adapt.kubernetes_pods import KubernetesPods
        >>> KubernetesPods("app", namespace="a", api="http://h:1").url
        'http://h:1/api/v1/namespaces/a/pods?labelSelector=app'
        """
        query = urllib.parse.urlencode({"labelSelector": self.selector})
        return f"{self.api}/api/v1/namespaces/{self.namespace}/pods?{query}"

    def list_pods(self):
        """The PodList the API returns for the selector (a dict).

        Raises :class:`KubernetesAPIError` when the API is unreachable, answers
        an HTTP error, or answers something that is not a PodList.

        Example:

        >>> from keras_adapt.kubernetes_pods import KubernetesPods, KubernetesAPIError
        >>> try:
        ...     KubernetesPods("app=x", namespace="a", api="http://127.0.0.1:9", timeout=2).list_pods()
        ... except KubernetesAPIError as exc:
        ...     print(str(exc).split(":")[0])
        cannot reach the Kubernetes API at http
        """
        headers = {"Accept": "application/json"}
        if self.token_file is not None:
            try:
                with open(self.token_file, encoding="utf-8") as f:
                    headers["Authorization"] = "Bearer " + f.read().strip()
            except OSError as exc:
                raise KubernetesAPIError(f"cannot read the token file {self.token_file}: "
                                         f"{exc}") from None
        context = None
        if self.api.startswith("https:"):
            context = ssl.create_default_context(cafile=self.ca_file)
        request = urllib.request.Request(self.url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=context) as answer:
                body = answer.read()
        except urllib.error.HTTPError as exc:
            raise KubernetesAPIError(self._http_error(exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise KubernetesAPIError(f"cannot reach the Kubernetes API at {self.api} ({reason}); "
                                     "check --kubernetes-api, or the pod's "
                                     "KUBERNETES_SERVICE_HOST/PORT") from None
        try:
            pods = json.loads(body)
        except ValueError:
            pods = None
        if (not isinstance(pods, dict) or pods.get("kind") != "PodList"
                or not isinstance(pods.get("items"), list)):
            raise KubernetesAPIError(f"GET {self.url} did not answer a PodList (got "
                                     f"{body[:80]!r}); is {self.api} a Kubernetes API server?")
        return pods

    def _http_error(self, exc):
        try:
            message = json.loads(exc.read()).get("message", "")
        except (ValueError, AttributeError, OSError):
            message = ""
        text = f"GET {self.url}: HTTP {exc.code} {exc.reason}" + (f" ({message})" if message
                                                                  else "")
        if exc.code == 401:
            return (f"{text}; the API refused the token "
                    f"({self.token_file or 'none sent'}): mount the service account's token "
                    "or pass --kubernetes-token-file")
        if exc.code == 403:
            return (f"{text}; the service account may not list pods in namespace "
                    f"{self.namespace}: bind it a Role allowing get and list on pods "
                    "(examples/kubernetes/mpijob-elastic.yaml)")
        return text

    def hosts_of(self, pods):
        """``[(host, slots), ...]`` for the ready pods of the PodList ``pods``,
        in the natural order of their names (``w-2`` before ``w-10``).

        ``ValueError`` when none is ready: the message counts the pods that
        matched and why each is left out.

        Example:

        >>> from keras_adapt.kubernetes_pods import KubernetesPods
        >>> pods = KubernetesPods("app=x", namespace="a", api="http://h:1")
        >>> pods.hosts_of({"kind": "PodList", "items": []})
        Traceback (most recent call last):
        ...
        ValueError: no pod matching app=x in namespace a is Running and Ready (0 matched); Horovod gets the last good answer until one is
        """
        ready, waiting = [], []
        for pod in pods.get("items") or []:
            name = (pod.get("metadata") or {}).get("name", "?")
            if pod_is_ready(pod):
                ready.append((_natural(name), pod_host(pod, self.host_format)))
            else:
                deleting = (pod.get("metadata") or {}).get("deletionTimestamp")
                phase = (pod.get("status") or {}).get("phase", "no phase")
                waiting.append(f"{name}: {'terminating' if deleting else phase}"
                               f"{', not Ready' if phase == 'Running' and not deleting else ''}")
        if not ready:
            raise ValueError(
                f"no pod matching {self.selector} in namespace {self.namespace} is Running and "
                f"Ready ({len(waiting)} matched{': ' if waiting else ''}{'; '.join(waiting)}); "
                "Horovod gets the last good answer until one is")
        return [(host, self.slots_per_pod) for _, host in sorted(ready)]

    def hosts(self):
        """``[(host, slots), ...]`` of the ready pods now (:meth:`list_pods`,
        then :meth:`hosts_of`).

        Example:

        >>> from keras_adapt.kubernetes_pods import KubernetesPods, KubernetesAPIError
        >>> pods = KubernetesPods("app=x", namespace="a", api="http://127.0.0.1:9", timeout=2)
        >>> try:
        ...     pods.hosts()
        ... except KubernetesAPIError:
        ...     print("unreachable")
        unreachable
        """
        return self.hosts_of(self.list_pods())

    @property
    def cache_name(self):
        """This source's :func:`cache_name`.

        Example:

        >>> from keras_adapt.kubernetes_pods import KubernetesPods, cache_name
        >>> KubernetesPods("app=x", namespace="a", api="http://h:1").cache_name == cache_name("app=x")
        True
        """
        return cache_name(self.selector)
