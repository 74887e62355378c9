"""Kubernetes: the MPI Operator manifests (examples/kubernetes/) and ``keras-adapt
discover --kubernetes-selector`` against an emulated API server (tests/kube_api.py).

No cluster runs here. The manifests are checked with the ``kubernetes``
client's models (every pod template deserialises into a
``V1PodTemplateSpec`` and back without losing a field) and against the
``MPIJob`` fields of the operator's ``kubeflow.org/v2beta1`` types. The
discovery runs through the real command against the emulated API on
loopback, and drives a real elastic job on three emulated hosts 2 -> 3 -> 2
workers as their pods become ready and then terminate.
"""

import inspect
import json
import os
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml

from conftest import WORKERS, horovodrun_elastic
from kube_api import KubeAPI, selector_matches
from keras_adapt import discover, kubernetes_pods

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFESTS = os.path.join(ROOT, "examples", "kubernetes")
#: The labels the MPI Operator puts on an MPIJob's pods
#: (pkg/apis/kubeflow/v2beta1/constants.go, pkg/controller defaultLabels).
OPERATOR_NAME = "training.kubeflow.org/operator-name"
JOB_NAME = "training.kubeflow.org/job-name"
JOB_ROLE = "training.kubeflow.org/job-role"
REPLICA_INDEX = "training.kubeflow.org/replica-index"
#: The v2beta1 fields (pkg/apis/kubeflow/v2beta1/types.go: MPIJobSpec,
#: RunPolicy, ReplicaSpec, their enums): a manifest may use no other.
MPIJOB_SPEC = {"slotsPerWorker", "runLauncherAsWorker", "runPolicy", "mpiReplicaSpecs",
               "sshAuthMountPath", "launcherCreationPolicy", "mpiImplementation"}
RUN_POLICY = {"cleanPodPolicy", "ttlSecondsAfterFinished", "activeDeadlineSeconds",
              "backoffLimit", "schedulingPolicy", "suspend", "managedBy"}
REPLICA_SPEC = {"replicas", "template", "restartPolicy"}
CLEAN_POD_POLICIES = {"All", "Running", "None"}
MPI_IMPLEMENTATIONS = {"OpenMPI", "Intel", "MPICH"}
SELECTOR = "training.kubeflow.org/job-name=kajob,training.kubeflow.org/job-role=worker"


def _labels(job, role, index=0):
    labels = {OPERATOR_NAME: "mpi-operator", JOB_NAME: job, JOB_ROLE: role}
    return {**labels, REPLICA_INDEX: str(index)} if role == "worker" else labels


# -- the manifests ---------------------------------------------------------------

def _documents(name):
    with open(os.path.join(MANIFESTS, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def _by_kind(docs, kind):
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _strings(value):
    """Every scalar as text: the client reads quantities (``2``) as strings."""
    if isinstance(value, dict):
        return {k: _strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strings(v) for v in value]
    return str(value)


def _model(obj, kind):
    """``obj`` as the client's model ``kind`` through ApiClient's public
    ``deserialize``: the JSON text and its content type (client >= 32), or a
    response whose ``.data`` is the text (older clients)."""
    from kubernetes import client

    api = client.ApiClient()
    if "content_type" in inspect.signature(api.deserialize).parameters:
        return api, api.deserialize(json.dumps(obj), kind, "application/json")

    class Response:
        data = json.dumps(obj)

    return api, api.deserialize(Response, kind)


def _pod_template(template):
    """The template as the client's V1PodTemplateSpec, checking that
    serialising it back loses no field (a misspelt or unknown field would
    be dropped)."""
    from kubernetes import client

    api, model = _model(template, "V1PodTemplateSpec")
    assert isinstance(model, client.V1PodTemplateSpec)
    assert _strings(api.sanitize_for_serialization(model)) == _strings(template)
    return model


def _mpijob(name):
    """The MPIJob of ``name`` (checked field by field) and its launcher and
    worker templates as client models."""
    pytest.importorskip("kubernetes", reason="the kubernetes client (PyPI kubernetes, in "
                        "requirements/) has the pod models the manifests are checked with")
    (job,) = _by_kind(_documents(name), "MPIJob").values()
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v2beta1", "MPIJob")
    spec = job["spec"]
    assert set(spec) <= MPIJOB_SPEC, set(spec) - MPIJOB_SPEC
    assert set(spec["runPolicy"]) <= RUN_POLICY
    assert spec["runPolicy"]["cleanPodPolicy"] in CLEAN_POD_POLICIES
    assert spec["mpiImplementation"] in MPI_IMPLEMENTATIONS
    replicas = spec["mpiReplicaSpecs"]
    assert set(replicas) == {"Launcher", "Worker"}
    for replica in replicas.values():
        assert set(replica) <= REPLICA_SPEC
    assert replicas["Launcher"]["replicas"] == 1 and replicas["Worker"]["replicas"] >= 1
    launcher = _pod_template(replicas["Launcher"]["template"])
    worker = _pod_template(replicas["Worker"]["template"])
    # One process per GPU: the hostfile's slots are the worker's GPUs.
    (container,) = worker.spec.containers
    assert int(container.resources.limits["nvidia.com/gpu"]) == spec["slotsPerWorker"]
    # The operator starts sshd in a worker whose container has no command.
    assert container.command is None and container.args is None
    (pvc,) = _by_kind(_documents("pvc.yaml"), "PersistentVolumeClaim").values()
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]  # pods on several nodes
    for pod in (launcher, worker):
        volumes = {v.name: v for v in pod.spec.volumes}
        for c in pod.spec.containers:
            for mount in c.volume_mounts:
                assert mount.name in volumes, (name, mount.name)
        shared = volumes["shared"].persistent_volume_claim.claim_name
        assert shared == pvc["metadata"]["name"]
        assert {m.mount_path for m in pod.spec.containers[0].volume_mounts
                if m.name == "shared"} == {"/shared"}
    (main,) = launcher.spec.containers
    assert main.command == ["horovodrun"]
    args = main.args
    script = args[args.index("python") + 1]
    assert script.startswith("/app/examples/")
    assert os.path.exists(os.path.join(ROOT, "examples", script[len("/app/examples/"):]))
    return job, launcher, worker, args


def _option(args, name):
    return args[args.index(name) + 1]


def test_the_fixed_mpijob_has_the_fields_we_use():
    job, _, _, args = _mpijob("mpijob.yaml")
    spec = job["spec"]
    processes = spec["mpiReplicaSpecs"]["Worker"]["replicas"] * spec["slotsPerWorker"]
    assert int(_option(args, "-np")) == processes
    assert _option(args, "--hostfile") == "/etc/mpi/hostfile"  # the operator writes it
    assert _option(args, "--logdir").startswith("/shared/")


def test_the_elastic_mpijob_discovers_its_worker_pods_with_its_rbac():
    job, launcher, worker, args = _mpijob("mpijob-elastic.yaml")
    docs = _documents("mpijob-elastic.yaml")
    name, spec = job["metadata"]["name"], job["spec"]
    slots, workers = spec["slotsPerWorker"], spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    assert 1 <= int(_option(args, "--min-np")) <= int(_option(args, "-np"))
    assert int(_option(args, "-np")) <= int(_option(args, "--max-np")) == workers * slots
    # RBAC: the launcher's service account may list pods, and nothing else.
    (account,) = _by_kind(docs, "ServiceAccount")
    assert launcher.spec.service_account_name == account
    (role_name, role), = _by_kind(docs, "Role").items()
    (rule,) = role["rules"]
    assert rule == {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    (binding,) = _by_kind(docs, "RoleBinding").values()
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role_name}
    # The discovery script is the ConfigMap mounted where horovodrun runs it.
    mounts = {m.name: m.mount_path for m in launcher.spec.containers[0].volume_mounts}
    config = next(v for v in launcher.spec.volumes if v.config_map is not None)
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"
                     and d["metadata"]["name"] == config.config_map.name]
    (key, script), = config_map["data"].items()
    assert _option(args, "--host-discovery-script") == os.path.join(mounts[config.name], key)
    assert config.config_map.default_mode & 0o111 and script.startswith("#!/bin/sh\n")
    words = shlex.split(script.replace("\\\n", " "), comments=True)
    assert words[:3] == ["exec", "keras-adapt", "discover"]
    # Its selector matches the labels the operator gives this job's workers,
    # not its launcher's nor another job's workers.
    selector = _option(words, "--kubernetes-selector")
    worker_labels = {**(worker.metadata.labels if worker.metadata else {}),
                     **_labels(name, "worker")}
    assert selector_matches(selector, worker_labels)
    assert not selector_matches(selector, _labels(name, "launcher"))
    assert not selector_matches(selector, _labels("other-job", "worker"))
    assert int(_option(words, "--slots-per-pod")) == slots
    env = {e.name: e.value for e in launcher.spec.containers[0].env}
    assert _option(words, "--target-file") == env["KERAS_ADAPT_TARGET_FILE"]
    assert env["KERAS_ADAPT_TARGET_FILE"].startswith("/shared/")
    # A worker is Ready once its sshd accepts (horovodrun starts processes over ssh).
    assert worker.spec.containers[0].readiness_probe.tcp_socket.port == 22
    # The default host name is the one the operator's hostfile gives a worker
    # (spec.hostname = the pod's name, spec.subdomain = the job's service).
    pod = {"metadata": {"name": f"{name}-worker-0", "namespace": "ml"},
           "spec": {"hostname": f"{name}-worker-0", "subdomain": name},
           "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
    pods = kubernetes_pods.KubernetesPods(selector, namespace="ml", api="https://k:443",
                                          slots_per_pod=slots)
    assert pods.hosts_of({"kind": "PodList", "items": [pod]}) == [
        (f"{name}-worker-0.{name}.ml.svc", slots)]


def test_the_emulated_api_answers_what_the_client_reads_as_a_pod_list():
    client = pytest.importorskip("kubernetes", reason="the kubernetes client has the models").client
    with KubeAPI() as api:
        api.add_pod("w-0", _labels("kajob", "worker"), "ready", ip="10.0.0.2",
                    hostname="w-0", subdomain="kajob")
        api.add_pod("w-1", _labels("kajob", "worker", 1), "terminating", ip="10.0.0.3")
        _, model = _model(api.pod_list(SELECTOR), "V1PodList")
    assert isinstance(model, client.V1PodList)
    ready = {c.type: c.status for c in model.items[0].status.conditions}
    assert (model.kind, len(model.items), ready["Ready"]) == ("PodList", 2, "True")
    assert model.items[1].metadata.deletion_timestamp is not None
    assert model.items[0].spec.subdomain == "kajob" and model.items[0].status.pod_ip == "10.0.0.2"


# -- the discovery against the emulated API --------------------------------------

def _env(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("KERAS_ADAPT_", "KUBERNETES_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    env["TMPDIR"] = str(tmp_path)  # the last good answer of a source without files
    return env


@pytest.fixture
def api(tmp_path):
    """The emulated API (namespace ml) with the workers of job kajob in
    every state, its launcher, and another job's ready worker."""
    with KubeAPI(namespace="ml", token="s3cret") as server:
        states = {0: "ready", 1: "pending", 2: "ready", 3: "terminating", 4: "not-ready",
                  10: "ready", 5: "failed"}
        for i, state in states.items():
            server.add_pod(f"kajob-worker-{i}", _labels("kajob", "worker", i), state,
                           ip=f"10.8.0.{i + 10}", hostname=f"kajob-worker-{i}",
                           subdomain="kajob")
        server.add_pod("kajob-launcher", _labels("kajob", "launcher"), "ready", ip="10.8.0.2")
        server.add_pod("other-worker-0", _labels("other", "worker"), "ready", ip="10.8.0.3")
        (tmp_path / "token").write_text("s3cret\n")
        yield server


def _run(tmp_path, api, *args, selector=SELECTOR, token="token"):
    cmd = [sys.executable, "-m", "keras_adapt", "discover"]
    if selector is not None:
        cmd += ["--kubernetes-selector", selector, "--kubernetes-namespace", "ml",
                "--kubernetes-api", api.url, "--kubernetes-token-file", str(tmp_path / token)]
    return subprocess.run([*cmd, *map(str, args)], env=_env(tmp_path), capture_output=True,
                          text=True, timeout=60)


def test_only_running_ready_pods_not_being_deleted_are_hosts(tmp_path, api):
    done = _run(tmp_path, api, "--slots-per-pod", 2)
    assert (done.returncode, done.stderr) == (0, "")
    # kajob's workers 0, 2 and 10 (in that order); not the pending, terminating,
    # not ready or failed ones, nor the launcher, nor another job's worker.
    assert done.stdout == ("kajob-worker-0.kajob.ml.svc:2\nkajob-worker-2.kajob.ml.svc:2\n"
                           "kajob-worker-10.kajob.ml.svc:2\n")
    path, auth = api.requests[-1]
    assert path == ("/api/v1/namespaces/ml/pods?labelSelector=training.kubeflow.org%2Fjob-name"
                    "%3Dkajob%2Ctraining.kubeflow.org%2Fjob-role%3Dworker")
    assert auth == "Bearer s3cret"
    for fmt, first in [("{ip}", "10.8.0.10"), ("{name}", "kajob-worker-0"),
                       ("{hostname}.{subdomain}", "kajob-worker-0.kajob")]:
        done = _run(tmp_path, api, "--kubernetes-host-format", fmt)
        assert done.stdout.splitlines()[0] == f"{first}:1", (fmt, done.stderr)
    api.set_pod("kajob-worker-1", "ready")   # the pending one starts
    api.set_pod("kajob-worker-0", "gone")    # the first one is deleted
    assert _run(tmp_path, api, "--kubernetes-host-format", "{name}").stdout == (
        "kajob-worker-1:1\nkajob-worker-2:1\nkajob-worker-10:1\n")


def test_the_target_caps_and_the_exclusion_file_leaves_out(tmp_path, api):
    target, excluded = tmp_path / "target", tmp_path / "excluded"
    fmt = ["--kubernetes-host-format", "{name}", "--slots-per-pod", 2]
    discover.write_target(str(target), 3)
    done = _run(tmp_path, api, *fmt, "--target-file", target)
    assert done.stdout == "kajob-worker-0:2\nkajob-worker-2:1\n"
    discover.exclude_host(str(excluded), "kajob-worker-0")
    done = _run(tmp_path, api, *fmt, "--target-file", target, "--exclude-file", excluded)
    assert done.stdout == "kajob-worker-2:2\nkajob-worker-10:1\n"
    assert (tmp_path / "target.last").read_text() == "kajob-worker-2:2\nkajob-worker-10:1\n"


@pytest.mark.parametrize("breakage, message", [
    ("down", "cannot reach the Kubernetes API at http://127.0.0.1:"),
    ("500", "HTTP 500 Internal Server Error (etcdserver: request timed out)"),
    ("not json", "did not answer a PodList (got b'<html>"),
    ("token", "HTTP 401 Unauthorized (Unauthorized); the API refused the token"),
    ("403", "HTTP 403 Forbidden"),
    ("no pod ready", "no pod matching training.kubeflow.org/job-name=kajob,"
     "training.kubeflow.org/job-role=worker in namespace ml is Running and Ready (4 matched: "
     "kajob-worker-1: Pending; kajob-worker-3: terminating; kajob-worker-4: Running, not Ready; "
     "kajob-worker-5: Failed)"),
])
def test_an_api_error_prints_it_and_the_last_good_answer(tmp_path, api, breakage, message):
    good = _run(tmp_path, api)
    assert good.returncode == 0 and len(good.stdout.splitlines()) == 3
    (cached,) = [p for p in os.listdir(tmp_path) if p.endswith(".last")]
    assert cached == f"keras-adapt-discover-{kubernetes_pods.cache_name(SELECTOR)}.last"
    token = "token"
    if breakage == "down":
        api.__exit__(None, None, None)
    elif breakage == "500":
        api.fail(500)
    elif breakage == "403":
        api.fail(403)
    elif breakage == "not json":
        api.fail(body="<html>gateway</html>")
    elif breakage == "token":
        (tmp_path / "wrong").write_text("guess\n")
        token = "wrong"
    else:
        for i in (0, 2, 10):
            api.set_pod(f"kajob-worker-{i}", "gone")
    done = _run(tmp_path, api, token=token)
    assert (done.returncode, done.stdout) == (0, good.stdout)
    assert message in done.stderr, done.stderr
    assert f"printing the last good answer from {tmp_path / cached}" in done.stderr
    if breakage == "down":
        api.__enter__()  # the fixture's exit shuts it down again


def test_a_selector_matching_nothing_without_a_last_good_answer_fails_loudly(tmp_path, api):
    done = _run(tmp_path, api, selector="training.kubeflow.org/job-name=nosuchjob")
    assert (done.returncode, done.stdout) == (1, "")
    assert "no pod matching training.kubeflow.org/job-name=nosuchjob in namespace ml" in (
        done.stderr)
    assert "no last good answer to print" in done.stderr


@pytest.mark.parametrize("args, message", [
    (["--hosts", "a:1", "--kubernetes-selector", "app=x"],
     "argument --kubernetes-selector: not allowed with argument --hosts"),
    (["--hosts", "a:1", "--slots-per-pod", "2"],
     "the --kubernetes-* options and --slots-per-pod need --kubernetes-selector"),
    (["--kubernetes-selector", "job: x", "--kubernetes-namespace", "ml",
      "--kubernetes-api", "http://127.0.0.1:9"], "'job: x' is not a requirement"),
    (["--kubernetes-selector", "app=x", "--kubernetes-namespace", "ML",
      "--kubernetes-api", "http://127.0.0.1:9"], "namespace='ML' is not a Kubernetes namespace"),
    (["--kubernetes-selector", "app=x", "--kubernetes-namespace", "ml",
      "--kubernetes-api", "http://127.0.0.1:9", "--slots-per-pod", "0"],
     "--slots-per-pod=0 is not valid; use an int >= 1"),
    (["--kubernetes-selector", "app=x", "--kubernetes-namespace", "ml",
      "--kubernetes-api", "http://127.0.0.1:9", "--kubernetes-host-format", "{pod}"],
     "host_format='{pod}' is not valid"),
    (["--kubernetes-selector", "app=x", "--kubernetes-namespace", "ml"],
     "no API server given and KUBERNETES_SERVICE_HOST is not set"),
    (["--kubernetes-selector", "app=x", "--kubernetes-namespace", "ml",
      "--kubernetes-api", "https://127.0.0.1:9", "--kubernetes-ca-file", "/nonexistent/ca.crt"],
     "ca_file='/nonexistent/ca.crt' does not exist"),
])
def test_bad_options_name_the_value_and_the_fix(tmp_path, api, args, message):
    done = _run(tmp_path, api, *args, selector=None)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_https_is_verified_with_the_ca_file(tmp_path):
    """The in-cluster way: https, the server's certificate checked against
    the CA bundle (here a self-signed certificate for 127.0.0.1)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed (Debian openssl): it makes the test certificate")
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    made = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)], capture_output=True, text=True, timeout=60)
    if made.returncode != 0:
        pytest.skip(f"openssl cannot make a test certificate: {made.stderr.strip()[-200:]}")
    with KubeAPI(namespace="ml", token="s3cret", tls=(str(cert), str(key))) as api:
        api.add_pod("kajob-worker-0", _labels("kajob", "worker"), "ready", hostname="h",
                    subdomain="kajob")
        (tmp_path / "token").write_text("s3cret\n")
        assert api.url.startswith("https://")
        done = _run(tmp_path, api, "--kubernetes-ca-file", cert)
        assert (done.returncode, done.stdout, done.stderr) == (0, "h.kajob.ml.svc:1\n", "")
        # Without the CA the certificate cannot be verified: error, last good answer.
        done = _run(tmp_path, api)
        assert (done.returncode, done.stdout) == (0, "h.kajob.ml.svc:1\n")
        assert "CERTIFICATE_VERIFY_FAILED" in done.stderr, done.stderr


def test_in_a_pod_the_service_account_and_environment_give_the_defaults(tmp_path, monkeypatch):
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "namespace").write_text("team-a\n")
    (account / "token").write_text("t\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    pods = kubernetes_pods.KubernetesPods("app=x", service_account_dir=account)
    assert (pods.namespace, pods.api) == ("team-a", "https://10.96.0.1:6443")
    assert (pods.token_file, pods.ca_file) == (str(account / "token"), None)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    assert kubernetes_pods.KubernetesPods(
        "app=x", service_account_dir=account).api == "https://[fd00::1]:6443"
    with pytest.raises(ValueError, match="no namespace given and no service account namespace"):
        kubernetes_pods.KubernetesPods("app=x", service_account_dir=tmp_path / "none")


# -- a real elastic job: 2 -> 3 -> 2 workers as pods come and go -----------------

EPOCHS, STEPS, LR, GLOBAL_BATCH = 3, 30, 0.02, 48   # 48: splits over 2 and 3 workers
TOTAL = EPOCHS * STEPS


def _reference(tmp_path):
    """The one-process run of the same global batches (no elastic machinery)."""
    out = tmp_path / "reference"
    out.mkdir()
    env = {**_env(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "2"}
    subprocess.run([sys.executable, os.path.join(WORKERS, "elastic_train.py"), "--out", out,
                    "--reference", "--epochs", str(EPOCHS), "--steps", str(STEPS), "--lr", str(LR),
                    "--global-batch", str(GLOBAL_BATCH)],
                   env=env, check=True, capture_output=True, timeout=300)
    with open(out / "reference.json") as f:
        return json.load(f)


def _runs(steps):
    """The worker counts of consecutive steps, each run once: [2, 3, 2]."""
    counts = [s["workers"] for s in steps]
    return [n for i, n in enumerate(counts) if i == 0 or counts[i - 1] != n]


@pytest.mark.primary_only  # the driver and the discovery do not depend on the stack
def test_pods_becoming_ready_then_terminating_resize_an_elastic_job(tmp_path, emulated_hosts3):
    """Worker pods of job kajob for the emulated hosts h2, h3 (ready) and h4
    (pending); the discovery script is ``keras-adapt discover
    --kubernetes-selector`` against the emulated API. After step 10 rank 0
    makes h4's pod ready (through a file the API follows) and holds until
    the driver announces the added host; after step 45 on three workers it
    marks the pod as being deleted and holds until the removal is announced.
    The job runs 2, then 3, then 2 workers, each step once, with the
    one-process weights, and records two resize events with their pauses."""
    from keras_adapt.record.events import read_events

    out, log, changes = tmp_path / "out", tmp_path / "log", tmp_path / "pods.json"
    out.mkdir()
    with KubeAPI(namespace="ml", token="s3cret") as api:
        for i, (host, state) in enumerate(zip(emulated_hosts3.names,
                                              ["ready", "ready", "pending"])):
            api.add_pod(f"kajob-worker-{i}", _labels("kajob", "worker", i), state,
                        ip=emulated_hosts3.addresses[i], hostname=host, subdomain="kajob")
        api.add_pod("kajob-launcher", _labels("kajob", "launcher"), "ready")
        api.follow(changes)
        (tmp_path / "token").write_text("s3cret\n")
        script = tmp_path / "discover.sh"
        script.write_text(
            f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m keras_adapt discover "
            f"--kubernetes-selector {SELECTOR} --kubernetes-namespace ml "
            f"--kubernetes-api {api.url} --kubernetes-token-file {tmp_path / 'token'} "
            f"--kubernetes-host-format '{{hostname}}' --target-file {tmp_path / 'target'}\n")
        script.chmod(0o755)
        actions = [
            {"step": 10, "do": "hosts", "hosts": json.dumps({"kajob-worker-2": "ready"}),
             "await_join": True},
            {"step": 45, "do": "hosts", "hosts": json.dumps({"kajob-worker-2": "terminating"}),
             "when_workers": 3, "await_removal": True}]
        args = ["--out", out, "--log-dir", log, "--hosts", changes, "--rule", "keep",
                "--global-batch", GLOBAL_BATCH, "--epochs", EPOCHS, "--steps", STEPS,
                "--commit", 4, "--lr", LR, "--actions", json.dumps(actions)]
        done = horovodrun_elastic("elastic_train.py", args, str(script), np=2, min_np=2,
                                  max_np=3, timeout=400, hosts=emulated_hosts3)
        assert done.leftover == 0
        assert {auth for _, auth in api.requests} == {"Bearer s3cret"}
    # The pod that went away took its worker: the two on h2 and h3 finished.
    finals = sorted((json.load(open(out / n)) for n in os.listdir(out)
                     if n.startswith("final_")), key=lambda f: f["rank"])
    # (Horovod may give the two survivors either rank after the re-form.)
    assert sorted((f["host"], f["workers"]) for f in finals) == [("h2", 2), ("h3", 2)]
    assert [f["rank"] for f in finals] == [0, 1]
    final = finals[0]
    assert [s["id"] for s in final["steps"]] == list(range(TOTAL))  # each step once
    assert (final["epoch"], final["batch"], final["iterations"]) == (EPOCHS, 0, TOTAL)
    assert _runs(final["steps"]) == [2, 3, 2]
    assert {(s["workers"], s["batch_size"]) for s in final["steps"]} == {(2, 24), (3, 16)}
    for got, want in zip(final["weights"], _reference(tmp_path)["weights"]):
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    grown, shrunk = read_events(str(log))
    for event, (before, after) in [(grown, (2, 3)), (shrunk, (3, 2))]:
        assert event["kind"] == "resize" and event["policy"] == "KerasState"
        assert (event["before"]["workers"], event["after"]["workers"]) == (before, after)
        assert event["before"]["global_batch"] == event["after"]["global_batch"] == GLOBAL_BATCH
        pause = event["after"]
        assert pause["pause_s"] > 0.0
        assert pause["pause_s"] == pytest.approx(pause["reform_s"] + pause["resume_s"], abs=1e-5)
    first_three = next(s for s in final["steps"] if s["workers"] == 3)
    back_to_two = next(s for s in final["steps"] if s["workers"] == 2 and s["id"] > 45)
    assert grown["step"] == first_three["iterations"] and 10 < first_three["id"] <= 10 + 4
    assert shrunk["step"] == back_to_two["iterations"] and 45 < back_to_two["id"] <= 45 + 4
    # What the discovery answered last: h4's pod is being deleted.
    assert (tmp_path / "target.last").read_text() == "h2:1\nh3:1\n"
    print(f"pods 2 -> 3 -> 2: pauses {grown['after']['pause_s']:.2f} s and "
          f"{shrunk['after']['pause_s']:.2f} s")
