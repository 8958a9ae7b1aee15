"""Loaded into every code-interpreter kernel by fence's server (silently, so
the user's namespace stays empty): imports the heavy modules ahead of the
first execution, adds a display formatter that describes matplotlib figures
as charts, and sets and restores per-execution environment variables."""

import json
import os

CHART_MIME = "application/vnd.fence.chart+json"
MAX_POINTS = 100_000

_saved = None


def set_env(raw):
    """Sets the variables of the JSON object raw, remembering old values."""
    global _saved
    env = json.loads(raw)
    _saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)


def restore_env():
    global _saved
    for k, v in (_saved or {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    _saved = None


def load(ip):
    from IPython.core.formatters import BaseFormatter
    from traitlets import ObjectName, Unicode

    class ChartFormatter(BaseFormatter):
        """Describes matplotlib figures. It matches figures by class, not
        through the formatter's registry, which IPython's matplotlib
        integration clears of Figure whenever the backend is set up."""

        format_type = Unicode(CHART_MIME)
        print_method = ObjectName("_repr_fence_chart_")
        _return_type = (dict,)

        def __call__(self, obj):
            if not self.enabled:
                return None
            if not any(c.__name__ == "Figure" and c.__module__ == "matplotlib.figure" for c in type(obj).__mro__):
                return None
            try:
                return figure_chart(obj)
            except Exception:
                return None

    df = ip.display_formatter
    f = ChartFormatter(parent=df)
    df.formatters[CHART_MIME] = f
    if CHART_MIME not in df.active_types:
        df.active_types.append(CHART_MIME)
    # Ahead of demand: the first execution should not pay for these.
    for mod in ("numpy", "pandas", "matplotlib.pyplot"):
        try:
            __import__(mod)
        except Exception:
            pass


def _num(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    if f != f or f in (float("inf"), float("-inf")):
        return str(f)
    return int(f) if f.is_integer() and not isinstance(v, float) else f


def _label(artist):
    lab = artist.get_label() or ""
    return "" if lab.startswith("_") else str(lab)


def _axes2d(ax, chart):
    chart["x_label"] = ax.get_xlabel() or None
    chart["y_label"] = ax.get_ylabel() or None
    chart["x_unit"] = None
    chart["y_unit"] = None
    return chart


def _ticks(ax, chart):
    chart["x_ticks"] = [_num(t) for t in ax.get_xticks()]
    chart["x_tick_labels"] = [t.get_text() for t in ax.get_xticklabels()]
    chart["x_scale"] = ax.get_xscale()
    chart["y_ticks"] = [_num(t) for t in ax.get_yticks()]
    chart["y_tick_labels"] = [t.get_text() for t in ax.get_yticklabels()]
    chart["y_scale"] = ax.get_yscale()
    return chart


def axes_chart(ax):
    """The chart of one Axes, or None when it is not a line, scatter, bar
    or pie chart."""
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.patches import Wedge

    title = ax.get_title()
    wedges = [p for p in ax.patches if isinstance(p, Wedge)]
    if wedges and len(wedges) == len(ax.patches) and not ax.get_lines():
        elems = [{"label": _label(w) or t, "angle": _num(w.theta2 - w.theta1), "radius": _num(w.r)}
                 for w, t in zip(wedges, [x.get_text() for x in ax.texts] + [""] * len(wedges))]
        return {"type": "pie", "title": title, "elements": elems}
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    if bars and not ax.get_lines():
        ticks = {round(float(t), 6): l.get_text() for t, l in zip(ax.get_xticks(), ax.get_xticklabels())}
        elems = []
        for c in bars:
            group = _label(c)
            for r in c.patches:
                x = r.get_x() + r.get_width() / 2
                elems.append({"label": ticks.get(round(float(x), 6), str(_num(x))), "group": group,
                              "value": _num(r.get_height())})
        return _axes2d(ax, {"type": "bar", "title": title, "elements": elems})
    lines = [l for l in ax.get_lines() if len(l.get_xdata()) > 0]
    scatters = [c for c in ax.collections if isinstance(c, PathCollection)]
    if lines or scatters:
        elems, n = [], 0
        for l in lines:
            pts = [[_num(x), _num(y)] for x, y in zip(l.get_xdata(), l.get_ydata())]
            n += len(pts)
            elems.append({"label": _label(l), "points": pts})
        for c in scatters:
            pts = [[_num(x), _num(y)] for x, y in c.get_offsets()]
            n += len(pts)
            elems.append({"label": _label(c), "points": pts})
        if n > MAX_POINTS:
            return None
        kind = "line" if lines and not scatters else "scatter" if scatters and not lines else None
        if kind is None:
            return None
        return _ticks(ax, _axes2d(ax, {"type": kind, "title": title, "elements": elems}))
    return None


def figure_chart(fig):
    axes = [ax for ax in fig.get_axes() if ax.get_visible()]
    charts = [axes_chart(ax) for ax in axes]
    if not charts or any(c is None for c in charts):
        return None
    if len(charts) == 1:
        return charts[0]
    title = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) else ""
    return {"type": "superchart", "title": title, "elements": charts}
