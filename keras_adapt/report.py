"""A static report of adaptive training: the Adapt tab's charts as a PNG or HTML file.

For people without TensorBoard at hand: ``keras-adapt report LOGDIR -o
report.png`` (or ``report.html``, the picture embedded plus a table of every
event). It draws the runs :func:`keras_adapt.record.runs.load_runs` reads:
the same data as the tab, read the same way. Damaged files and unknown event
kinds are skipped or shown as such, never fatal.

Example:

>>> import os, tempfile
>>> import tensorflow as tf
>>> from keras_adapt import report
>>> from keras_adapt.record import metadata, runs, summary
>>> logdir = tempfile.mkdtemp()
>>> with tf.summary.create_file_writer(os.path.join(logdir, "run1")).as_default():
...     for s in range(1, 20):
...         _ = summary.scalar("gns", 100.0 + s, step=s)
...     _ = summary.events([metadata.make_event("batch_size", 10, 0, "demo", "gns grew",
...                                             {"batch_size": 32}, {"batch_size": 64})])
>>> [(r.name, len(r.series["adapt/gns"]), len(r.events)) for r in runs.load_runs(logdir)]
[('run1', 19, 1)]
>>> path = report.write_report(logdir, os.path.join(logdir, "report.png"))
>>> report.png_size(path)
(1400, 650)
"""

import base64
import html
import io
import math
import os
import struct

from keras_adapt.extras import require
from keras_adapt.record import metadata, reader
from keras_adapt.record.selection import select_runs

__all__ = ["build_figure", "check_output", "format_values", "has_sync_strategy_panel",
           "has_system_series", "has_timing_series", "plot_runs", "png_size", "tick_label",
           "write_report"]

#: Figure geometry: one block of panels per run, fixed pixel size.
WIDTH_IN, RUN_HEIGHT_IN, DPI = 14.0, 6.5, 100
#: Extra height of a run that has host metrics (SystemMonitor): one more row.
SYSTEM_ROW_IN = 3.0
#: Extra height of a run that has worker compute and wait times (WorkerTimingMonitor).
TIMING_ROW_IN = 3.0
#: Colours of the lines of one chart that draws one line per worker or host.
LINE_PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")


def _mpl_text(text):
    # Matplotlib reads $...$ as math; a run called "$x^$" must not break it.
    return str(text).replace("$", r"\$")


def tick_label(value, _pos=None):
    """A y-axis label for people: integers as integers, else up to 4 significant digits.

    Example:

    >>> from keras_adapt.report import tick_label
    >>> tick_label(2.0), tick_label(256.0), tick_label(0.019999999552965164), tick_label(1e-5)
    ('2', '256', '0.02', '1e-05')
    """
    value = float(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def _integer_axis(ax, lines):
    """Integer ticks for a series of whole numbers (workers), at least 1 apart."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    values = [v for _, points, _, _ in lines for _, _, v in points if v is not None]
    if values:
        lo, hi = min(values), max(values)
        if hi - lo < 2:
            ax.set_ylim(max(0.0, lo - 1) if lo >= 0 else lo - 1, hi + 1)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_formatter(FuncFormatter(tick_label))


def _panel(ax, title, lines, events, log=False, integer=False):
    ax.set_title(title, fontsize=10)
    drawn = False
    for label, points, color, step in lines:
        pts = [(s, v) for s, _, v in points if v is not None and (not log or v > 0)]
        if not pts:
            continue
        xs, ys = zip(*pts)
        if step:
            ax.step(xs, ys, where="post", color=color, label=label, linewidth=1.4)
        else:
            ax.plot(xs, ys, color=color, label=label, linewidth=1.2)
        drawn = True
    if log and drawn:
        from matplotlib.ticker import FuncFormatter

        ax.set_yscale("log")
        # Plain numbers (a batch of 256 reads "256", not 2.56 x 10^2).
        ax.yaxis.set_major_formatter(FuncFormatter(tick_label))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, pos: _minor_log_label(ax, v)))
    elif integer and drawn:
        _integer_axis(ax, lines)
    for e in events:
        ax.axvline(e["step"], color=metadata.event_color(e["kind"]),
                   linestyle="--", linewidth=1.0, alpha=0.8)
    if drawn and len(lines) > 1:
        ax.legend(fontsize=8, loc="best")
    if not drawn:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes,
                color="#9e9e9e")
    ax.set_xlabel("step", fontsize=8)
    ax.tick_params(which="both", labelsize=8)
    ax.grid(True, alpha=0.3)


def _minor_log_label(ax, value):
    """Labels some minor ticks of a short log axis: 2, 3, 5 (one decade) or 2, 5 (two)."""
    lo, hi = ax.get_ylim()
    if value <= 0 or not (lo > 0 and hi / lo < 100):
        return ""
    digit = round(value / 10 ** math.floor(math.log10(value)))
    return tick_label(value) if digit in ((2, 3, 5) if hi / lo < 10 else (2, 5)) else ""


def _worker_lines(series, which):
    """``(label, points, colour, step)`` per worker of one of the worker times."""
    found = sorted((metadata.parse_worker_time_tag(t)[1], t) for t in series
                   if (metadata.parse_worker_time_tag(t) or (None,))[0] == which)
    return [(f"rank {rank}", series[t], LINE_PALETTE[i % len(LINE_PALETTE)], False)
            for i, (rank, t) in enumerate(found)]


def _system_lines(series, metrics):
    """``(label, points, colour, step)`` per host and metric of the system series."""
    found = sorted((metadata.parse_system_tag(t), t) for t in series
                   if metadata.parse_system_tag(t) is not None)
    hosts = sorted({host for (host, _), _ in found})
    lines = []
    for (host, metric), t in found:
        if metric in metrics:
            label = f"host {host}" + (f" {metrics[metric]}" if metrics[metric] else "")
            color = LINE_PALETTE[(hosts.index(host) * len(metrics) + list(metrics).index(metric))
                                 % len(LINE_PALETTE)]
            lines.append((label, series[t], color, False))
    return lines


def has_system_series(run):
    """True if ``run`` holds host metrics (``adapt/system/...``, from SystemMonitor).

    Example:

    >>> from keras_adapt.record.runs import RunData
    >>> from keras_adapt.report import has_system_series
    >>> has_system_series(RunData("a", {"adapt/system/host_0/cpu_percent": [(0, 0.0, 5.0)]}, []))
    True
    """
    return any(metadata.parse_system_tag(t) is not None for t in run.series)


def has_timing_series(run):
    """True if ``run`` holds per-worker compute and wait times (``WorkerTimingMonitor``).

    Example:

    >>> from keras_adapt.record.runs import RunData
    >>> from keras_adapt.report import has_timing_series
    >>> has_timing_series(RunData("a", {"adapt/wait_time/rank_0": [(0, 0.0, 0.01)]}, []))
    True
    >>> has_timing_series(RunData("a", {"adapt/step_time/rank_0": [(0, 0.0, 0.01)]}, []))
    False
    """
    return any((metadata.parse_worker_time_tag(t) or (None,))[0] in ("compute_time", "wait_time")
               for t in run.series)


def has_sync_strategy_panel(run):
    """True if ``run`` gets the "sync strategy" panel (``reader.shows_sync_strategy``).

    That is, it has the ``adapt/sync_strategy`` series and used a strategy
    other than AllReduceSGD or recorded a ``sync_strategy`` event.

    Example:

    >>> from keras_adapt.record.runs import RunData
    >>> from keras_adapt.report import has_sync_strategy_panel
    >>> plain = RunData("a", {"adapt/sync_strategy": [(0, 0.0, 0.0), (9, 0.0, 0.0)]}, [])
    >>> local = RunData("b", {"adapt/sync_strategy": [(0, 0.0, 0.0), (9, 0.0, 2.0)]}, [])
    >>> has_sync_strategy_panel(plain), has_sync_strategy_panel(local)
    (False, True)
    """
    return reader.shows_sync_strategy(run.series.get(metadata.SCALAR_TAGS["sync_strategy"], []),
                                      run.events)


def _sync_panel(ax, points, events):
    """The strategy in use over time: a step line on one row per strategy, named."""
    _panel(ax, "sync strategy", [("strategy", points, "#37474f", True)], events)
    indices = sorted({int(round(v)) for _, _, v in points if v is not None})
    ax.set_yticks(indices)
    ax.set_yticklabels([reader.sync_strategy_name(i) for i in indices])
    ax.set_ylim(indices[0] - 0.5, indices[-1] + 0.5)


def _run_height(run):
    return (RUN_HEIGHT_IN + (SYSTEM_ROW_IN if has_system_series(run) else 0.0)
            + (TIMING_ROW_IN if has_timing_series(run) else 0.0))


def build_figure(runs, dpi=DPI):
    """The report's matplotlib ``Figure``: one block of six panels per run.

    Per run: noise scale and global batch size (log scale), learning rate
    and workers (step lines; workers with integer ticks), throughput,
    per-worker step times, and the event kinds' legend; a dashed vertical
    line marks every event. Tick labels are plain numbers (integers as
    integers). A run that qualifies for it (:func:`has_sync_strategy_panel`)
    shows the synchronisation strategy in use over time (a step line, the
    strategies' names as y tick labels) in the sixth panel instead, and
    its events legend moves to the block's top right corner; the size does
    not change. A run with host metrics (``SystemMonitor``) gets a third row:
    CPU and GPU use, memory, network traffic, one line per host; a run with
    worker times (``WorkerTimingMonitor``) one more: compute time and wait
    in collectives per worker, and the communication fraction. The figure
    is ``WIDTH_IN * dpi`` pixels wide and ``RUN_HEIGHT_IN * dpi`` high per
    run, plus ``SYSTEM_ROW_IN * dpi`` per run with host metrics and
    ``TIMING_ROW_IN * dpi`` per run with worker times.

    Example:

    >>> from keras_adapt.record.runs import RunData
    >>> from keras_adapt.report import build_figure
    >>> fig = build_figure([RunData("a", {"adapt/workers": [(0, 0.0, 2.0), (9, 0.0, 2.0)]}, [])])
    >>> [ax.get_title() for ax in fig.axes][:3]
    ['noise scale and global batch size', 'learning rate', 'workers']
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    if not runs:
        raise ValueError("runs is empty; there is nothing to draw")
    heights = [_run_height(run) for run in runs]
    fig = Figure(figsize=(WIDTH_IN, sum(heights)), dpi=dpi)
    FigureCanvasAgg(fig)
    subfigs = fig.subfigures(len(runs), 1, squeeze=False, height_ratios=heights)[:, 0]
    tag = metadata.SCALAR_TAGS
    for sub, run in zip(subfigs, runs):
        s, ev = run.series, run.events
        sub.suptitle(_mpl_text(f"run: {run.name}   ({len(ev)} events)"), fontsize=12)
        system, timing = has_system_series(run), has_timing_series(run)
        ratios = ([1, 1] + [SYSTEM_ROW_IN / (RUN_HEIGHT_IN / 2)] * system
                  + [TIMING_ROW_IN / (RUN_HEIGHT_IN / 2)] * timing)
        axes = sub.subplots(len(ratios), 3, height_ratios=ratios)
        _panel(axes[0, 0], "noise scale and global batch size", [
            ("noise scale (B_simple)", s.get(tag["gns"], []), "#6a1b9a", False),
            ("global batch size", s.get(tag["batch_size"], []), "#00897b", True),
        ], ev, log=True)
        _panel(axes[0, 1], "learning rate", [("lr", s.get(tag["lr"], []), "#ef6c00", True)], ev)
        _panel(axes[0, 2], "workers", [("workers", s.get(tag["workers"], []), "#2e7d32", True)], ev,
               integer=True)
        _panel(axes[1, 0], "throughput (samples/s)",
               [("samples/s", s.get(tag["throughput"], []), "#1565c0", False)], ev)
        _panel(axes[1, 1], "step time per worker (s)", _worker_lines(s, "step_time"), ev)
        kinds = sorted({e["kind"] for e in ev})
        handles = [Line2D([0], [0], color=metadata.event_color(k), linestyle="--",
                          label=_mpl_text(f"{k} ({sum(e['kind'] == k for e in ev)})"))
                   for k in kinds]
        sync = has_sync_strategy_panel(run)
        if sync:
            _sync_panel(axes[1, 2], s[tag["sync_strategy"]], ev)
            # The events legend moves to the block's top right corner.
            if handles:
                sub.legend(handles=handles, loc="upper right", ncol=min(len(handles), 4),
                           fontsize=8, title="events", title_fontsize=8,
                           bbox_to_anchor=(0.99, 1.0), frameon=False)
        else:
            legend_ax = axes[1, 2]
            legend_ax.axis("off")
            if handles:
                legend_ax.legend(handles=handles, title="events", loc="center", fontsize=9)
            else:
                legend_ax.text(0.5, 0.5, "no adaptation events", ha="center", va="center",
                               color="#9e9e9e")
        if system:
            _panel(axes[2, 0], "system: CPU and GPU use (%)",
                   _system_lines(s, {"cpu_percent": "CPU", "gpu_percent": "GPU"}), ev)
            _panel(axes[2, 1], "system: memory use (%)",
                   _system_lines(s, {"memory_percent": "", "gpu_memory_percent": "GPU"}), ev)
            _panel(axes[2, 2], "system: network (MB/s)",
                   _system_lines(s, {"net_in_mb_s": "in", "net_out_mb_s": "out"}), ev)
        if timing:
            row = 3 if system else 2
            _panel(axes[row, 0], "compute time per worker (s)", _worker_lines(s, "compute_time"), ev)
            _panel(axes[row, 1], "wait in collectives per worker (s)",
                   _worker_lines(s, "wait_time"), ev)
            _panel(axes[row, 2], "communication fraction",
                   [("comm_fraction", s.get(tag["comm_fraction"], []), "#5d4037", False)], ev)
        # The strategies' names need a wider gap left of the sixth panel.
        sub.subplots_adjust(left=0.06, right=0.98, top=0.9, bottom=0.09, hspace=0.45,
                            wspace=0.32 if sync else 0.25)
    return fig


def plot_runs(runs, path_or_file, dpi=DPI):
    """Draws the runs (:func:`build_figure`) into a PNG of fixed size.

    Example:

    >>> import io
    >>> from keras_adapt.record.runs import RunData
    >>> from keras_adapt.report import plot_runs, png_size
    >>> buf = io.BytesIO()
    >>> plot_runs([RunData("a", {"adapt/lr": [(0, 0.0, 0.1), (9, 0.0, 0.2)]}, [])], buf)
    >>> png_size(buf.getvalue())
    (1400, 650)
    """
    build_figure(runs, dpi=dpi).savefig(path_or_file, format="png", dpi=dpi)


def png_size(path_or_bytes):
    """(width, height) in pixels, read from a PNG's header.

    Example:

    >>> from keras_adapt.report import png_size
    >>> png_size(b"\\x89PNG\\r\\n\\x1a\\n" + b"\\x00\\x00\\x00\\rIHDR" + (640).to_bytes(4, "big")
    ...          + (480).to_bytes(4, "big"))
    (640, 480)
    """
    if isinstance(path_or_bytes, (bytes, bytearray)):
        head = bytes(path_or_bytes[:24])
    else:
        with open(path_or_bytes, "rb") as f:
            head = f.read(24)
    if len(head) < 24 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise ValueError("not a PNG file")
    return struct.unpack(">II", head[16:24])


def format_values(values):
    """An event's ``before``/``after`` for reading, as the Adapt tab's table shows it.

    Numbers as :func:`tick_label` writes them; a strategy with its
    parameters reads ``local_sgd (period: 8)``.

    Example:

    >>> from keras_adapt.report import format_values
    >>> format_values({"batch_size": 64, "lr": 0.019999999552965164})
    'batch_size: 64, lr: 0.02'
    >>> format_values({"sync_strategy": "local_sgd", "period": 8}), format_values({})
    ('local_sgd (period: 8)', '–')
    """
    import json

    if not isinstance(values, dict):
        return json.dumps(values)
    if isinstance(values.get("sync_strategy"), str):
        params = {k: v for k, v in values.items() if k != "sync_strategy"}
        return values["sync_strategy"] + (f" ({format_values(params)})" if params else "")
    parts = []
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            shown = value if isinstance(value, str) else json.dumps(value)
        else:
            shown = tick_label(value)
        parts.append(f"{key}: {shown}")
    return ", ".join(parts) if parts else "–"


def _html(runs, png_bytes, logdir):
    e = html.escape
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>keras-adapt report</title>",
        "<style>body{font-family:Arial,sans-serif;margin:16px;color:#212121}"
        "table{border-collapse:collapse;font-size:13px;margin-bottom:24px}"
        "td,th{border-bottom:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}"
        "td.mono{font-family:monospace}img{max-width:100%}</style></head><body>",
        f"<h1>keras-adapt report</h1><p>log directory: <code>{e(logdir)}</code>; "
        f"{len(runs)} run(s)</p>",
        f'<img alt="adapt charts" src="data:image/png;base64,{base64.b64encode(png_bytes).decode()}">',
    ]
    for run in runs:
        skipped = f", {run.skipped} unreadable record(s) skipped" if run.skipped else ""
        parts.append(f"<h2>run: {e(run.name)}</h2><p>{len(run.events)} event(s){skipped}</p>")
        if not run.events:
            continue
        parts.append('<table class="events"><thead><tr><th>step</th><th>epoch</th><th>kind</th>'
                     "<th>policy</th><th>reason</th><th>before</th><th>after</th></tr></thead><tbody>")
        import json

        for ev in run.events:
            kind = ev["kind"] + ("" if ev.get("known", True) else " (unknown)")
            parts.append(
                f'<tr class="event"><td>{ev["step"]}</td><td>{ev["epoch"]}</td><td>{e(kind)}</td>'
                f'<td>{e(ev["policy"])}</td><td>{e(ev["reason"])}</td>'
                f'<td class="mono" title="{e(json.dumps(ev["before"]))}">'
                f'{e(format_values(ev["before"]))}</td>'
                f'<td class="mono" title="{e(json.dumps(ev["after"]))}">'
                f'{e(format_values(ev["after"]))}</td></tr>'
            )
        parts.append("</tbody></table>")
    parts.append("</body></html>")
    return "\n".join(parts)


def check_output(output):
    """Checks, before any work, that the report can be written to ``output``.

    Raises ``ValueError`` when ``output`` does not end in ``.png`` or
    ``.html``, and an ``OSError`` naming the path and the fix when it
    cannot be written: it is a directory, its folder is missing, or it is
    not writable (tried by opening it for appending, which keeps an
    existing file; a file created by the try is removed again).

    Example:

    >>> import os, tempfile
    >>> from keras_adapt import report
    >>> report.check_output(os.path.join(tempfile.mkdtemp(), "r.png"))
    >>> report.check_output(os.path.join(tempfile.mkdtemp(), "missing", "r.png"))
    Traceback (most recent call last):
    ...
    FileNotFoundError: cannot write '...r.png': the folder '...missing' does not exist; create it or pass another path
    """
    path = os.path.abspath(output)
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot write {str(output)!r}: it is a directory; pass a file "
                                "name in it, e.g. " + os.path.join(str(output), "report.png"))
    ext = os.path.splitext(str(output))[1].lower()
    if ext not in (".png", ".html", ".htm"):
        raise ValueError(f"output={str(output)!r} is not valid; end it in .png or .html")
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"cannot write {str(output)!r}: the folder {parent!r} does not "
                                "exist; create it or pass another path")
    existed = os.path.exists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        raise PermissionError(f"cannot write {str(output)!r}: {exc.strerror}; pass a path you "
                              "may write, e.g. in your home folder") from exc
    if not existed:
        os.remove(path)


def write_report(logdir, output, runs=None, max_points=2000, dpi=DPI):
    """Writes the report of ``logdir`` to ``output`` (``.png`` or ``.html``); returns its path.

    ``output`` is checked first (:func:`check_output`), so a bad path is
    reported before any log is read. ``runs`` (names) selects runs as
    :func:`keras_adapt.record.selection.select_runs` does: a ``ValueError``
    when no run has adapt data or a name is none of them.

    Example:

    >>> import tempfile
    >>> from keras_adapt import report
    >>> report.write_report(tempfile.mkdtemp(), "out.pdf")
    Traceback (most recent call last):
    ...
    ValueError: output='out.pdf' is not valid; end it in .png or .html
    """
    check_output(output)
    require("matplotlib", "report", "keras-adapt report")
    data = select_runs(logdir, runs, max_points=max_points)
    if str(output).lower().endswith(".png"):
        plot_runs(data, output, dpi=dpi)
    else:
        buf = io.BytesIO()
        plot_runs(data, buf, dpi=dpi)
        with open(output, "w", encoding="utf-8") as f:
            f.write(_html(data, buf.getvalue(), logdir))
    return str(output)
