"""Writes one results page per benchmark from its stored JSON lines.

    python benchmarks/results_pages.py          # writes docs/results/*.md
    python benchmarks/results_pages.py --check  # exit 1 and list the pages that differ

Each benchmark prints a table and one JSON line per configuration. The lines
of its latest measured run are kept in ``benchmarks/results/<bench>.jsonl``,
each with a ``run`` object added by hand: ``command`` (what reproduces it),
``machine``, ``date``, ``commit`` and, where it applies, ``stack``,
``condition``, ``fields`` (what was left out of the line) or ``source``
(where the figures come from when the JSON line was not kept). This script
turns each file into ``docs/results/<bench>.md`` (a table of the columns a
reader needs, how it was run, and the raw lines) and writes
``docs/results/index.md``. It needs only the standard library.

To record a new run: run the command, copy the JSON line(s) it prints into
the ``.jsonl`` file (replacing the old ones), add the ``run`` object, then
run this script and commit both.
"""

import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "benchmarks", "results")
PAGES = os.path.join(ROOT, "docs", "results")


def fmt(value, digits=3):
    """A number as a table shows it: ``None`` as a dash, floats rounded."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def spread(values, digits=3):
    """``[lo, hi]`` as ``lo–hi``, or a dash when absent."""
    if not values:
        return "–"
    return f"{fmt(values[0], digits)}–{fmt(values[1], digits)}"


def stack_of(line):
    """The stack a line was measured on: the benchmark's own field, else the run's."""
    return line.get("stack") or line["run"].get("stack") or "–"


def ratio_cell(line, key):
    """A median ratio with its spread over rounds, e.g. ``1.012 (0.90–1.10)``."""
    if key not in line:
        return "–"
    spread_key = key.replace("ratio", "spread", 1)
    return f"{fmt(line[key])} ({spread(line.get(spread_key), 2)})"


def monitor_overhead_table(lines):
    head = ["stack", "rounds", "wrapper, statistics off", "statistics on (default)",
            "on, skip_nonfinite", "on, every step", "A/A (baseline again)", "on, CPU clock",
            "on, wall clock"]
    rows = [[stack_of(x), fmt(x["rounds"]), ratio_cell(x, "ratio_off"), ratio_cell(x, "ratio_on"),
             ratio_cell(x, "ratio_on_skip"), ratio_cell(x, "ratio_on_every"),
             ratio_cell(x, "ratio_aa"), ratio_cell(x, "cpu_ratio_on"),
             ratio_cell(x, "wall_ratio_on")] for x in lines]
    return head, rows


def policy_overhead_table(lines):
    head = ["rounds × steps", "host ms per update, GNS policy", "host ms per update, goodput policy",
            "step without a policy (ms)"]
    rows = [[f"{x['rounds']} × {x['steps']}", fmt(x["host_ms_gns"]), fmt(x["host_ms_goodput"]),
             fmt(x["baseline_ms"], 1)] for x in lines]
    return head, rows


def points(value):
    """Accuracy points with their sign, e.g. ``+0.09``."""
    return "–" if value is None else f"{value:+.2f}"


def times(value):
    """A ratio as ``1.17×``; a dash when the run missed the target."""
    return "miss" if value is None else f"{value:.2f}×"


def time_to_accuracy_table(lines):
    head = ["task", "protocol", "target", "best fixed batch (batch @ LR, updates)",
            "GNS: updates saved", "GNS: accuracy (points)", "goodput: updates saved",
            "goodput: accuracy (points)", "GNS: wall time saved"]
    rows = []
    for x in lines:
        best = x["best_fixed"]
        rows.append([x["task"], f"({x['protocol']})", fmt(x["target"], 4),
                     f"{best['batch']} @ {best['lr']:g}, {best['updates_to_target']}",
                     times(x["update_ratio_vs_best_fixed"]), points(x["acc_delta_vs_best_fixed"]),
                     times(x["goodput_update_ratio_vs_best_fixed"]),
                     points(x["goodput_acc_delta_vs_best_fixed"]),
                     times(x["speedup_vs_best_fixed"])])
    return head, rows


def resize_latency_table(lines):
    head = ["stack", "scale-down (s)", "scale-down, each job", "scale-up (s)", "scale-up, each job",
            "commit cost (step-time ratio)", "commit interval (updates)"]
    rows = [[stack_of(x), fmt(x["down_s"]), ", ".join(map(fmt, x["downs"])), fmt(x["up_s"]),
             ", ".join(map(fmt, x["ups"])), fmt(x["commit_ratio"], 4),
             fmt(x.get("commit_interval"))] for x in lines]
    return head, rows


def perf_model_table(lines):
    head = ["run", "MAPE (%)", "max error (%)", "leave-one-config-out MAPE (%)", "target (%)", "met"]
    rows = [[x["run"].get("note", str(i)), fmt(x["mape"]), fmt(x["max_error"]),
             fmt(x.get("loco_mape")), fmt(x["target"], 1), fmt(x["met"])]
            for i, x in enumerate(lines, 1)]
    return head, rows


def straggler_table(lines):
    head = ["machine state", "steps to detect", "false alarms", "rebalance gain",
            "gain over rounds", "targets met"]
    rows = []
    for x in lines:
        met = x["met"]
        met_cell = fmt(met) if isinstance(met, bool) else ", ".join(
            f"{k}: {fmt(v)}" for k, v in met.items())
        rows.append([x["run"].get("condition", "–"), fmt(x["detect_steps"]), fmt(x["false_alarms"]),
                     fmt(x["rebalance_gain"]), spread(x.get("rebalance_gain_spread")), met_cell])
    return head, rows


def task_of(line):
    """The task a line was measured on: the benchmark's own field, else the run's."""
    return line.get("task") or line["run"].get("task") or "–"


def sync_strategies_table(lines):
    head = ["stack", "task", "rounds", "adaptive: accuracy gap to the best run",
            "adaptive: speed-up over S-SGD under the delay", "delay (ms)", "met"]
    rows = [[stack_of(x), task_of(x), fmt(x["rounds"]), fmt(x["adaptive_acc_gap_vs_best"], 4),
             times(x["adaptive_speedup_vs_ssgd_delay"]), fmt(x["delay_ms"], 0), fmt(x["met"])]
            for x in lines]
    return head, rows


def seconds(config):
    """A median wall time to the target with its spread, e.g. ``5.7 s [5.3, 6.1]``."""
    wall = config.get("wall_to_target")
    if wall is None:
        return "–"
    low_high = config.get("wall_to_target_spread")
    return f"{wall:.1f} s" + (f" [{low_high[0]:.1f}, {low_high[1]:.1f}]" if low_high else "")


def sync_strategies_configs(line):
    """Per configuration of one line that kept them: final accuracy, updates and
    time to the target without and with the delay, collectives per sample."""
    configs = line["configs"]
    names = [key[:-2] for key in configs if key.endswith("@0")]
    head = ["configuration", "final", "to target (updates)", "to target, no delay",
            f"to target, {fmt(line['delay_ms'], 0)} ms", "collectives / sample"]
    rows = []
    for name in names:
        plain, delayed = configs[f"{name}@0"], configs[f"{name}@delay"]
        updates = plain["updates_to_target"]
        rows.append([f"`{name}`", fmt(plain["final"], 4), "never" if updates is None else str(updates),
                     seconds(plain), seconds(delayed), fmt(plain["collectives_per_sample"], 4)])
    return head, rows


def preemption_table(lines):
    head = ["stack", "signal to checkpoint on disk (s)", "steps lost", "steps after the signal",
            "agreement / step (ms)", "interval (steps)", "agreements' share of a step",
            "checkpoint (MB)"]
    rows = [[stack_of(x), fmt(x["to_disk_s"], 2), fmt(x["steps_lost"]), fmt(x["steps_after_signal"]),
             f"{fmt(x['check_ms'], 1)} / {fmt(x['step_ms'], 1)}", fmt(x["check_interval"]),
             f"{100 * x['check_overhead']:.1f}%", fmt(x["checkpoint_mb"], 1)]
            for x in lines]
    return head, rows


def async_training_table(lines):
    head = ["stack", "configuration", "updates (rank 0 / 1, median)", "rank 0 to target", "final",
            "speed-up over S-SGD", "accuracy vs S-SGD (points)", "staleness (mean / p95 / max)"]
    rows = []
    for x in lines:
        for name, c in x["configs"].items():
            e = c.get("exchange")
            stale = "–" if not e else (f"{fmt(e['staleness_mean'], 2)} / "
                                       f"{fmt(e['staleness_p95'], 2)} / {fmt(e['staleness_max'], 2)}")
            updates = (f"{statistics.median(c['updates']):.0f} / "
                       f"{statistics.median(c['peer_updates']):.0f}")
            rows.append([stack_of(x), f"`{name}`", updates, seconds(c), fmt(c["final"], 4),
                         times(c["speedup_vs_ssgd"]), fmt(c["acc_delta_vs_ssgd"], 2), stale])
    return head, rows


def communication_table(lines):
    head = ["stack", "configuration", "samples/s before", "samples/s after [min, max]",
            "wait share before / after", "recovery over `none`", "final",
            "accuracy vs `none` (points)"]
    rows = []
    for x in lines:
        for name, c in x["configs"].items():
            lo, hi = c["after_spread"]
            rows.append([stack_of(x), f"`{name}`", fmt(c["before"], 0),
                         f"{fmt(c['after'], 0)} [{fmt(lo, 0)}, {fmt(hi, 0)}]",
                         f"{fmt(c['wait_share_before'], 2)} / {fmt(c['wait_share_after'], 2)}",
                         times(c["recovery"]), fmt(c["final"], 4), fmt(c["acc_delta"], 2)])
    return head, rows


#: Per benchmark: title, what it measures, the fields every stored line has, its table.
BENCHES = {
    "monitor_overhead": (
        "Monitoring overhead",
        "The step time of keras-adapt's `DistributedOptimizer` against plain Horovod (on "
        "tf.keras 2 Horovod's own `hvd.DistributedOptimizer`; on Keras 3, where that cannot "
        "run, a Keras optimizer that averages with `hvd.grouped_allreduce`): the median ratio "
        "over rounds (the spread over rounds in brackets; compute clock unless said), an MLP "
        "and a CNN on 2 pinned workers, statistics every 10 updates unless said. The A/A "
        "column times the baseline a second time: differences inside it are noise.",
        ("stack", "rounds", "ratio_off", "ratio_on"), monitor_overhead_table),
    "policy_overhead": (
        "Policy overhead",
        "The host time a batch-size policy adds per update: the time inside its own Keras hooks, "
        "the digits MLP at a global batch of 32 on 2 pinned workers, each policy at its "
        "defaults but with `min_batch = max_batch = 32` (all its host work, the same steps as "
        "the run without a policy); median of the rounds; one row per run.",
        ("rounds", "steps", "host_ms_gns", "host_ms_goodput"), policy_overhead_table),
    "time_to_accuracy": (
        "Time to accuracy",
        "The batch-size policies at their defaults against the best fixed batch in hindsight "
        "(the tuned batch and learning rate a user would have picked), means over seeds 0, 1 "
        "and 2. Protocol (b): everyone gets the same sample budget; (c): twice the samples and "
        "a high target. \"Updates saved\" is the best fixed batch's updates to the target over "
        "the policy's (above 1× is better); accuracy is the final accuracy's difference in "
        "points. Wall times shared the machine with other work: read them as indicative. "
        "See [the method](time_to_accuracy_notes.md).",
        ("task", "protocol", "target", "best_fixed", "update_ratio_vs_best_fixed",
         "acc_delta_vs_best_fixed"), time_to_accuracy_table),
    "resize_latency": (
        "Resize latency",
        "Elastic training on one machine (two local hosts, Gloo): the training time lost per "
        "scale-down and per scale-up (the pause from the last step before the change to the end "
        "of the first step after it, median of the jobs; the scale-up includes starting the new "
        "worker's process), and the cost of the state commits at `batches_per_commit=\"auto\"` "
        "(training wall time over the same time without the commits). Targets: down ≤ 1 s, "
        "up ≤ 10 s, commits ≤ 1.01.",
        ("down_s", "up_s", "commit_ratio"), resize_latency_table),
    "perf_model": (
        "Throughput model accuracy",
        "How well the throughput model predicts the update time of configurations it did not "
        "see: fitted on per-worker batches 16, 64 and 256, it predicts 32 and 128 at 1 and 2 "
        "workers and every accumulation; mean absolute percentage error (MAPE) and its worst "
        "case, and the leave-one-configuration-out MAPE. Target: CM-DARE's 3.4%.",
        ("mape", "max_error", "met", "target"), perf_model_table),
    "straggler": (
        "Straggler detection and rebalancing",
        "Rank 1 of 2 workers slowed (1.3× to be detected, 1.5× to be rebalanced; a "
        "compute-bound convolutional model): the steps the straggler policy needs to detect it, "
        "its false alarms on a run without a slow-down, and the throughput gain of the "
        "rebalanced split over the even one (median of 3 rounds, spread over rounds).",
        ("detect_steps", "false_alarms", "rebalance_gain", "met"), straggler_table),
    "sync_strategies": (
        "Synchronisation strategies",
        "The adaptive synchronisation policy against fixed strategies (S-SGD at a small and a "
        "large batch, SMA, local SGD, post-local SGD, block momentum) on the same sample "
        "budget, with and without a delay added to every collective: its gap in final accuracy "
        "to the most accurate run, and how much sooner than S-SGD under the delay it reaches "
        "the target.",
        ("adaptive_acc_gap_vs_best", "adaptive_speedup_vs_ssgd_delay", "met", "delay_ms"),
        sync_strategies_table),
    "preemption": (
        "Preemption",
        "SIGTERM to one of 2 workers training with `PreemptionCheckpoint`: the time from the "
        "signal to the checkpoint on disk, the steps lost (the step the workers exited at less "
        "the newest checkpoint's), the steps run after the signal, and what the agreement on "
        "the flag costs per step at its interval.",
        ("to_disk_s", "steps_lost", "check_overhead", "check_interval"), preemption_table),
    "async_training": (
        "Asynchronous training with a slow worker",
        "Rank 1 of 2 workers made 1.5× slower (it sleeps half of each step's own time): "
        "S-SGD, local SGD (H = 8) and `PairAveraging` on the same sample budget over both "
        "workers, rank 0's model evaluated on its own (median of the rounds, spread in "
        "brackets), with the staleness of the models rank 0 averaged with. Target of the "
        "issue: PairAveraging reaches the target at least 1.3× sooner than S-SGD at most "
        "0.5 point lower.",
        ("pair_speedup_vs_ssgd", "pair_acc_delta_vs_ssgd", "met", "configs"),
        async_training_table),
    "communication": (
        "Gradient compression after a bandwidth drop",
        "Two emulated hosts (network namespaces on one machine, Gloo over their link): after "
        "update 80 of 240 each host's link is limited by a token bucket; rank 0's throughput "
        "before and after (the last 100 updates), with float32 throughout (`none`), with "
        "`CommunicationPolicy` at its defaults, and with Horovod's autotuner; the wait share "
        "of a step from `WorkerTimingMonitor`. Target of the issue: the policy recovers at "
        "least 1.3× the throughput of doing nothing at most 0.5 point lower, after a drop "
        "that makes communication at least 40% of a step.",
        ("policy_recovery", "policy_acc_delta", "none_wait_share_after", "met", "configs"),
        communication_table),
}


def read_lines(bench, data_dir=DATA):
    """The stored JSON lines of one benchmark, as dicts."""
    with open(os.path.join(data_dir, f"{bench}.jsonl")) as f:
        return [json.loads(text) for text in f if text.strip()]


def markdown_table(head, rows):
    """A Markdown table from a header and rows of cells."""
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def how_it_ran(lines):
    """One bullet per distinct run: command, stack, machine, date, commit."""
    out, seen = [], []
    for x in lines:
        run = {k: v for k, v in x["run"].items() if k not in ("note", "condition")}
        if run in seen:
            continue
        seen.append(run)
        parts = [f"`{run['command']}`"]
        if run.get("stack"):
            parts.append(f"stack {run['stack']}")
        parts.append(f"on {run['machine']}")
        if run.get("date"):
            parts.append(f"on {run['date']}")
        if run.get("commit"):
            parts.append(f"at commit `{run['commit']}`")
        text = "- " + ", ".join(parts) + "."
        if run.get("fields"):
            text += f" Stored: {run['fields']}."
        if run.get("source"):
            text += (f" These figures come from a {run['source']}; the next run of the command "
                     "replaces them with its JSON lines.")
        out.append(text)
    return "\n".join(out)


def page(bench, lines):
    """The Markdown of one results page."""
    title, about, _, table = BENCHES[bench]
    head, rows = table(lines)
    raw = "\n".join(json.dumps(x) for x in lines)
    details = ""
    if bench == "sync_strategies":
        for x in lines:
            if "configs" in x:
                what = f"{task_of(x)}, stack {stack_of(x)}, {x['rounds']} round(s)"
                details += (f"### Per configuration: {what}\n\n"
                            f"{markdown_table(*sync_strategies_configs(x))}\n\n")
    return (f"<!-- Generated by benchmarks/results_pages.py from benchmarks/results/{bench}.jsonl;"
            " edit those, not this page. -->\n"
            f"# {title}\n\n{about}\n\n{markdown_table(head, rows)}\n\n{details}"
            f"## How it was run\n\n{how_it_ran(lines)}\n\n"
            f"To reproduce it, run the command from the repository's root. To record a new run, "
            f"put the JSON lines it prints into `benchmarks/results/{bench}.jsonl` with their "
            f"`run` object and run `python benchmarks/results_pages.py`.\n\n"
            f"## The stored JSON lines\n\n<!-- not run: results data -->\n```json\n{raw}\n```\n")


def index(data_dir=DATA):
    """The Markdown of docs/results/index.md."""
    out = ["<!-- Generated by benchmarks/results_pages.py; edit it, not this page. -->",
           "# Benchmark results", "",
           "One page per benchmark in `benchmarks/`, generated from the JSON lines of its latest "
           "measured run (`benchmarks/results/`): a table, the command that reproduces it, the "
           "machine and the date and commit. The guides quote these pages.", "",
           "| results | script | measured |", "|---|---|---|"]
    for bench, (title, _, _, _) in BENCHES.items():
        dates = sorted({x["run"].get("date", "") for x in read_lines(bench, data_dir)} - {""})
        when = ", ".join(dates) if dates else "from a table in the docs"
        out.append(f"| [{title}]({bench}.md) | `benchmarks/{bench}.py` | {when} |")
    out += ["", "How the time-to-accuracy benchmark chooses its baseline and its protocols: "
            "[the method](time_to_accuracy_notes.md)."]
    return "\n".join(out) + "\n"


def render(data_dir=DATA):
    """Every generated page, as {file name: Markdown}."""
    pages = {f"{bench}.md": page(bench, read_lines(bench, data_dir)) for bench in BENCHES}
    pages["index.md"] = index(data_dir)
    return pages


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 listing the pages that differ")
    args = parser.parse_args()
    differ = []
    for name, text in render().items():
        path = os.path.join(PAGES, name)
        old = open(path).read() if os.path.exists(path) else None
        if old == text:
            continue
        differ.append(os.path.relpath(path, ROOT))
        if not args.check:
            os.makedirs(PAGES, exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
    if args.check and differ:
        print("differ from benchmarks/results/ (run python benchmarks/results_pages.py):\n  "
              + "\n  ".join(differ))
        return 1
    if not args.check:
        print(f"wrote {len(differ)} page(s)" + (": " + ", ".join(differ) if differ else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
