"""The ``keras-adapt`` command (also ``python -m keras_adapt``).

``keras-adapt report LOGDIR -o report.png`` (or ``.html``) draws the Adapt
tab's charts for every run under LOGDIR without TensorBoard.
``keras-adapt plan LOGDIR --samples S`` predicts, from a run's step times and
noise scale, the time and cost of training S samples at each worker count and
batch size (:mod:`keras_adapt.plan`).
``keras-adapt discover --hosts-file F --target-file T --exclude-file X`` prints
``host:slots`` lines for ``horovodrun --host-discovery-script``: the hosts
(or, with ``--kubernetes-selector``, the ready pods from the Kubernetes API)
not excluded (``StragglerPolicy(action="exclude")`` writes X), capped by the
target worker count a resize policy writes (:mod:`keras_adapt.discover`).
``keras-adapt build-horovod`` builds Horovod 0.28.1, patched for current
TensorFlow, into the active environment (:mod:`keras_adapt.horovod_build`).
``keras-adapt slurm-hosts`` prints, inside a Slurm allocation, its nodes and
tasks as ``horovodrun -H`` hosts, ``-np``, or a hosts file for ``discover``
(:mod:`keras_adapt.slurm`).
``keras-adapt --version`` prints the version.

Exit codes, the same in every command:

- **0**: done (``discover`` also when it printed its last good answer).
- **1**: the command line is right but the work failed: logs or files that
  exist but do not hold what is needed (no run with adapt data, no run of
  that name, too few step times), an output that cannot be written, a
  build that fails, no Slurm allocation, ``discover`` with bad input and no
  last good answer, an optional dependency that is not installed (the
  message is the ``pip install 'keras-adapt[extra]'`` hint).
- **2**: the command line is wrong: no command, an unknown option, a
  missing or malformed value, options that exclude each other, an option's
  value out of range, a path argument that does not exist.

Every message goes to stderr, names the bad value and says what to pass
instead; expected errors never show a traceback (an unexpected exception
still does: that is a bug to report). Output files are checked before any
work, so a bad ``-o`` costs nothing.

Bare ``keras-adapt`` is a usage error (exit 2, the usage line and the
commands on stderr), as argparse does for a missing required argument,
and not ``pip``'s or ``docker``'s help on stdout with exit 0: a caller that
runs it by mistake (a discovery script with its arguments lost, a batch
script) must see a failure, and must not read the help text as its answer
(Horovod would take each help line for a host). ``keras-adapt --help``
prints the help with exit 0.

Example:

>>> from keras_adapt import cli
>>> cli.main(["report", "/nonexistent", "-o", "r.png"])
2
"""

import argparse
import os
import re
import sys

__all__ = ["main"]


def _parser():
    parser = argparse.ArgumentParser(
        prog="keras-adapt",
        description="Tools for keras-adapt runs (adaptive distributed training for Keras).",
    )
    from keras_adapt.version import __version__

    parser.add_argument("--version", action="version", version=f"keras-adapt {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    rep = sub.add_parser(
        "report",
        help="draw the Adapt tab's charts into a PNG or HTML file",
        description="Draws noise scale and global batch size, learning rate, workers, "
        "throughput, per-worker step times and every adaptation event for each run "
        "under LOGDIR into a PNG, or an HTML page with the picture and an events table.",
    )
    rep.add_argument("logdir", metavar="LOGDIR", help="TensorBoard log directory (runs below it)")
    rep.add_argument("-o", "--output", default="adapt_report.png",
                     help="output file ending in .png or .html (default: %(default)s)")
    _add_run_option(rep)
    rep.add_argument("--max-points", type=_at_least(2), default=2000,
                     help="points per series after downsampling (default: %(default)s)")
    plan = sub.add_parser(
        "plan",
        help="predict time and cost per worker count and batch size from a run's logs",
        description="Fits the throughput model to a run's recorded step times, reads its "
        "noise scale, and predicts for each worker count and global batch the step time, "
        "throughput, the samples needed to match S samples at the run's base batch, the "
        "time and (with prices per worker-hour) the cost, on on-demand and preemptible "
        "machines. Predictions outside what the run observed are marked with *.",
    )
    plan.add_argument("logdir", metavar="LOGDIR", help="TensorBoard log directory (runs below it)")
    _add_run_option(plan, " (plan uses one; needed when several runs recorded step times)")
    plan.add_argument("--samples", type=float, required=True, metavar="S",
                      help="samples to train, counted at the run's base batch")
    plan.add_argument("--workers", type=_int_list, default=None, metavar="N,N,...",
                      help="worker counts (default: 1,2,4,8)")
    plan.add_argument("--batch-sizes", type=_int_list, default=None, metavar="B,B,...",
                      help="global batch sizes (default: the run's and the base batch x 1..16)")
    plan.add_argument("--price-on-demand", type=float, metavar="P",
                      help="price per worker-hour of on-demand machines")
    plan.add_argument("--price-preemptible", type=float, metavar="P",
                      help="price per worker-hour of preemptible machines")
    plan.add_argument("--revocations-per-hour", type=float, metavar="R",
                      help="revocations per worker-hour of preemptible machines")
    plan.add_argument("--checkpoint-seconds", type=float, metavar="C",
                      help="seconds one checkpoint takes")
    plan.add_argument("--restart-seconds", type=float, metavar="X",
                      help="seconds a restart after a revocation takes (relaunch, restore)")
    plan.add_argument("--noise-scale", type=float, metavar="PHI",
                      help="noise scale to use instead of the run's late median")
    plan.add_argument("--base-batch", type=int, metavar="B0",
                      help="the batch S refers to (default: the run's first global batch)")
    plan.add_argument("--max-micro-batch", type=int, metavar="b",
                      help="largest per-worker micro-batch (default: the largest the run used)")
    plan.add_argument("--json", action="store_true", help="print one JSON document")
    disc = sub.add_parser(
        "discover",
        help="print host:slots lines for horovodrun --host-discovery-script",
        description="Prints one host:slots line per host, from a hosts file, a fixed list, or "
        "the Running and Ready pods of a label selector in the Kubernetes API, "
        "leaving out the hosts named in the exclusion file (written by StragglerPolicy("
        "action='exclude'); remove a line to bring a host back), with the total slots capped "
        "by the target worker count in the target file (written by keras-adapt's resize "
        "policies; 0 or no file: no cap). On missing or malformed input it prints the error "
        "on stderr and the last good answer, and exits 0 (1 when it has none). Without "
        "options it reads "
        "KERAS_ADAPT_HOSTS_FILE (or KERAS_ADAPT_HOSTS), KERAS_ADAPT_TARGET_FILE and "
        "KERAS_ADAPT_EXCLUDE_FILE from the environment.",
    )
    source = disc.add_mutually_exclusive_group()
    source.add_argument("--hosts-file", metavar="F",
                        help="file with one host[:slots] per line (# comments allowed); "
                        "default $KERAS_ADAPT_HOSTS_FILE")
    source.add_argument("--hosts", metavar="H:S,H:S",
                        help="fixed host list instead of a file, e.g. node-1:2,node-2:2; "
                        "default $KERAS_ADAPT_HOSTS")
    source.add_argument("--kubernetes-selector", metavar="LABELS",
                        help="the hosts are the Running and Ready pods with these labels, "
                        "read from the Kubernetes API, e.g. training.kubeflow.org/job-name=train,"
                        "training.kubeflow.org/job-role=worker (an MPIJob's workers)")
    disc.add_argument("--target-file", metavar="T",
                      help="file holding the target worker count; default "
                      "$KERAS_ADAPT_TARGET_FILE")
    disc.add_argument("--exclude-file", metavar="X",
                      help="file with one host name per line to leave out (# comments "
                      "allowed); default $KERAS_ADAPT_EXCLUDE_FILE")
    kube = disc.add_argument_group(
        "Kubernetes", "with --kubernetes-selector; in a pod the defaults come from its service "
        "account and environment")
    kube.add_argument("--kubernetes-namespace", metavar="NS",
                      help="the pods' namespace (default: the service account's)")
    kube.add_argument("--kubernetes-api", metavar="URL",
                      help="the API server (default: https://$KUBERNETES_SERVICE_HOST:"
                      "$KUBERNETES_SERVICE_PORT)")
    kube.add_argument("--kubernetes-token-file", metavar="F",
                      help="bearer token file (default: the service account's token)")
    kube.add_argument("--kubernetes-ca-file", metavar="F",
                      help="CA bundle of an https API server (default: the service "
                      "account's ca.crt)")
    kube.add_argument("--kubernetes-host-format", metavar="FMT",
                      help="how a pod is named for Horovod, from {name} {namespace} {hostname} "
                      "{subdomain} {ip} (default: {hostname}.{subdomain}.{namespace}.svc, the "
                      "MPI Operator's worker names)")
    kube.add_argument("--slots-per-pod", type=int, default=1, metavar="N",
                      help="workers per pod, one per GPU (default: %(default)s)")
    hb = sub.add_parser(
        "build-horovod",
        help="build Horovod 0.28.1 into this environment, against its TensorFlow",
        description="Builds Horovod 0.28.1 from its source distribution, with the patches "
        "keras-adapt ships so that it compiles against current TensorFlow, into the "
        "environment of this Python: Gloo always, MPI when mpicc is found, TensorFlow as the "
        "framework, and NCCL's GPU operations when TensorFlow is a GPU build and a CUDA "
        "toolkit of its CUDA version and NCCL are found (the system's, or NVIDIA's pip "
        "wheels). Checks TensorFlow's headers and C++ ABI first, verifies the result with "
        "horovodrun --check-build and a one-process allreduce, and records it; run again, it "
        "does nothing unless TensorFlow, the patches or the options changed.",
    )
    hb.add_argument("--dry-run", action="store_true",
                    help="print what would be built, and every command, without doing it")
    hb.add_argument("--cpu-only", action="store_true",
                    help="leave out the GPU (NCCL) operations even where they could be built")
    hb.add_argument("--cuda-home", metavar="DIR",
                    help="CUDA toolkit to build with (default: $CUDA_HOME, NVIDIA's pip wheels, "
                    "nvcc on PATH, /usr/local/cuda; the first of TensorFlow's CUDA version)")
    hb.add_argument("--nccl-home", metavar="DIR",
                    help="NCCL to build with: DIR/include/nccl.h, DIR/lib/libnccl.so* "
                    "(default: $NCCL_HOME, the nvidia-nccl pip wheel, the system)")
    hb.add_argument("--sdist", metavar="FILE",
                    help="horovod-0.28.1.tar.gz to build instead of downloading it")
    hb.add_argument("--jobs", type=int, metavar="N",
                    help="parallel compile jobs (default: the number of CPUs)")
    hb.add_argument("--force", action="store_true",
                    help="build even when this environment's recorded build is up to date")
    sh = sub.add_parser(
        "slurm-hosts",
        help="print the Slurm allocation's hosts for horovodrun -H, -np or a hosts file",
        description="Inside a Slurm allocation (a batch script, salloc, srun) prints its nodes "
        "(SLURM_JOB_NODELIST, expanded from Slurm's compressed form) with one worker per task "
        "(SLURM_TASKS_PER_NODE, else SLURM_NTASKS_PER_NODE, else SLURM_JOB_CPUS_PER_NODE): "
        "as horovodrun's -H list (h2:1,h3:1), as the worker count for -np, or as one host:slots "
        "line per node for keras-adapt discover --hosts-file. Exits 1 outside an allocation "
        "or on malformed variables, naming the variable.",
    )
    sh.add_argument("--format", choices=("horovodrun", "np", "hostfile"), default="horovodrun",
                    help="horovodrun: host:slots,... for -H; np: the worker count; hostfile: "
                    "one host:slots per line (default: %(default)s)")
    for command, command_parser in sub.choices.items():
        command_parser.set_defaults(command_parser=command_parser, command=command)
    return parser


def _add_run_option(command_parser, note=""):
    command_parser.add_argument(
        "--run", action="append", dest="runs", metavar="RUN",
        help="a run under LOGDIR, named as TensorBoard shows it; repeat for several "
        "(--run a --run b)" + note + "; default: every run with adapt data")


def _at_least(minimum):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not valid; pass an integer >= {minimum}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def _int_list(text):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not valid; pass comma-separated integers, e.g. 1,2,4,8") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not valid; pass comma-separated integers >= 1, e.g. 1,2,4,8")
    return values


def _usage(args, message):
    """A usage error: the command's usage line and the message on stderr; exit code 2."""
    args.command_parser.print_usage(sys.stderr)
    print(f"{args.command_parser.prog}: error: {message}", file=sys.stderr)
    return 2


def _failed(args, message):
    """A runtime error: the message on stderr; exit code 1."""
    print(f"{args.command_parser.prog}: {message}", file=sys.stderr)
    return 1


def _check_logdir(args):
    if os.path.isdir(args.logdir):
        return None
    return _usage(args, f"LOGDIR={args.logdir!r} is not a directory; pass the folder given to "
                  "AdaptTensorBoard's log_dir or its parent (TensorBoard's --logdir)")


def _report(args):
    from keras_adapt import report
    from keras_adapt.extras import ExtraImportError

    try:
        report.check_output(args.output)
    except ValueError as exc:
        return _usage(args, str(exc).replace("output=", "-o ", 1))
    except OSError as exc:
        return _failed(args, exc)
    try:
        path = report.write_report(args.logdir, args.output, runs=args.runs,
                                   max_points=args.max_points)
    except (ValueError, ExtraImportError) as exc:
        return _failed(args, exc)
    except OSError as exc:  # the output became unwritable while it was drawn
        return _failed(args, f"cannot write {args.output!r}: {exc}")
    print(f"keras-adapt report: wrote {path}")
    print(f"Interactive view: tensorboard --logdir {args.logdir}  (the Adapt tab)")
    return 0


def _plan(args):
    from keras_adapt import plan
    from keras_adapt.extras import ExtraImportError

    if args.runs and len(args.runs) > 1:
        return _usage(args, f"{' '.join('--run ' + r for r in args.runs)}: a plan is made from "
                      "one run; pass one --run (run plan once per run to compare them)")
    options = dict(
        workers=args.workers or plan.DEFAULT_WORKERS, batch_sizes=args.batch_sizes,
        price_on_demand=args.price_on_demand, price_preemptible=args.price_preemptible,
        revocations_per_hour=args.revocations_per_hour,
        checkpoint_seconds=args.checkpoint_seconds, restart_seconds=args.restart_seconds,
        noise_scale_value=args.noise_scale, base_batch=args.base_batch,
        max_micro_batch=args.max_micro_batch)
    try:
        plan.check_options(args.samples, **options)
    except plan.PlanError as exc:
        return _usage(args, _option_names(str(exc)))
    try:
        result = plan.make_plan(args.logdir, args.samples,
                                run=args.runs[0] if args.runs else None, **options)
    except (plan.PlanError, ExtraImportError) as exc:
        return _failed(args, _option_names(str(exc)))
    print(result.to_json() if args.json else plan.format_table(result))
    return 0


def _option_names(message):
    """The library's argument names in a message, spelled as the command's options."""
    for name in ("cuda_home", "nccl_home", "cpu_only", "sdist", "jobs", "slots_per_pod",
                 "price_on_demand", "price_preemptible", "revocations_per_hour",
                 "checkpoint_seconds", "restart_seconds", "noise_scale", "base_batch",
                 "max_micro_batch", "batch_sizes"):
        message = re.sub(rf"\b{name}\b", "--" + name.replace("_", "-"), message)
    return re.sub(r"\b(samples|workers)([=:])", r"--\1\2", message)


def _build_horovod(args):
    from keras_adapt import horovod_build

    try:
        plan = horovod_build.plan_build(sys.executable, cpu_only=args.cpu_only,
                                        cuda_home=args.cuda_home, nccl_home=args.nccl_home,
                                        sdist=args.sdist, jobs=args.jobs)
    except ValueError as exc:
        return _usage(args, _option_names(str(exc)))
    except (horovod_build.BuildError, RuntimeError) as exc:
        return _failed(args, exc)
    if args.dry_run:
        print(plan.describe())
        return 0
    try:
        record = horovod_build.run_build(plan, force=args.force,
                                         log=lambda line: print(line, flush=True))
    except horovod_build.BuildError as exc:
        return _failed(args, exc)
    if record["up_to_date"]:
        print(f"keras-adapt build-horovod: up to date: {record['summary']} "
              f"(recorded in {plan.env.prefix}; --force builds again)")
    else:
        print(f"keras-adapt build-horovod: built {record['summary']} in {record['seconds']} s; "
              f"verified: check-build, one-process allreduce under "
              f"{' and '.join(record['controllers'])}")
    return 0


def _discover(args):
    from keras_adapt import discover

    env = os.environ
    hosts_file = args.hosts_file
    hosts = args.hosts
    if hosts_file is None and hosts is None:
        hosts_file = env.get(discover.ENV_HOSTS_FILE) or None
        hosts = None if hosts_file else env.get(discover.ENV_HOSTS) or None
    target_file = args.target_file or env.get(discover.ENV_TARGET_FILE) or None
    exclude_file = args.exclude_file or env.get(discover.ENV_EXCLUDE_FILE) or None
    kube = {"namespace": args.kubernetes_namespace, "api": args.kubernetes_api,
            "token_file": args.kubernetes_token_file, "ca_file": args.kubernetes_ca_file,
            "host_format": args.kubernetes_host_format}
    selector, source_name = args.kubernetes_selector, None
    if selector is None and (any(v is not None for v in kube.values())
                             or args.slots_per_pod != 1):
        return _usage(args, "the --kubernetes-* options and --slots-per-pod need "
                      "--kubernetes-selector LABELS (the worker pods' labels)")
    pods = None
    if selector is not None:
        from keras_adapt import kubernetes_pods

        hosts_file = hosts = None  # the pods, not the environment's hosts
        source_name = kubernetes_pods.cache_name(selector)
        try:  # the options are checked here, before any request
            pods = kubernetes_pods.KubernetesPods(
                selector, slots_per_pod=args.slots_per_pod,
                **{k: v for k, v in kube.items() if v is not None})
        except (ValueError, OSError) as exc:
            return _usage(args, _option_names(str(exc)))
    try:
        answer = discover.discover(hosts_file=hosts_file, hosts=hosts, target_file=target_file,
                                   exclude_file=exclude_file, pods=pods)
    except (ValueError, OSError) as exc:
        if hosts_file is None and hosts is None and pods is None:
            return _usage(args, str(exc))  # no source given at all
        print(f"keras-adapt discover: {_option_names(str(exc))}", file=sys.stderr)
        path = discover.last_good_path(hosts_file, target_file, exclude_file, source_name)
        last = discover.read_last_good(path)
        if last is None:
            # Nothing to fall back on: at start-up Horovod stops the job, which
            # is right for a configuration that never worked.
            return _failed(args, "no last good answer to print"
                           + (f" ({path} holds none)" if path else ""))
        print(f"keras-adapt discover: printing the last good answer from {path}",
              file=sys.stderr)
        answer = last
    print(answer, flush=True)
    return 0


def _slurm_hosts(args):
    from keras_adapt import slurm

    try:
        hosts = slurm.allocation_hosts()
    except (slurm.NotInAllocation, ValueError) as exc:
        return _failed(args, exc)
    if args.format == "np":
        print(slurm.worker_count(hosts))
    elif args.format == "hostfile":
        print(slurm.format_hostfile(hosts), end="")
    else:
        print(slurm.format_horovodrun(hosts))
    return 0


def main(argv=None):
    """Runs the command line; returns the exit code: 0 done, 1 the work failed, 2 bad usage.

    The codes are the module's (:mod:`keras_adapt.cli`); argparse's own
    exits (``--help``, ``--version``, a malformed option) are returned too,
    not raised.

    Example:

    >>> from keras_adapt import cli
    >>> cli.main(["report", "/nonexistent", "-o", "r.txt"])
    2
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code
    if args.command is None:
        parser.print_usage(sys.stderr)
        print("keras-adapt: error: name a command: report, plan, discover, build-horovod or "
              "slurm-hosts (keras-adapt --help says what each does)", file=sys.stderr)
        return 2
    if args.command == "discover":
        return _discover(args)  # polled every second: no TensorFlow import
    if args.command == "build-horovod":
        return _build_horovod(args)
    if args.command == "slurm-hosts":
        return _slurm_hosts(args)  # in batch scripts: no TensorFlow import
    bad = _check_logdir(args)
    if bad is not None:
        return bad
    # TensorFlow (loaded with TensorBoard's reader) prints start-up lines at
    # INFO level; a command-line tool shows only warnings and errors.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return _plan(args) if args.command == "plan" else _report(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
