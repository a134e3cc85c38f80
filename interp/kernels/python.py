# airlock Python kernel.
#
# Started by github.com/airlock-dev/airlock/interp as `python3 -u -c <bootstrap>`; the bootstrap reads
# this source from fd 3 and executes it. File descriptors:
#   0      /dev/null (user code reading stdin gets EOF)
#   1, 2   user stdout and stderr (pipes read by the Go side)
#   3      requests from the Go side, one JSON object per line
#   4      messages to the Go side, one JSON object per line
#   5, 6   duplicates of 1 and 2, used only for sync markers
#
# A sync marker is "\0airlock-sync:" + token + "\0" written to fds 5 and 6.
# Every message carries "sync": [markers written to 5, to 6] so far for the
# current token; the Go side holds a message back until it has read that many
# markers from each stream, which keeps messages ordered after the output that
# preceded them.

import ast
import base64
import builtins
import io
import json
import linecache
import os
import signal
import sys
import types
import _thread

REQ_FD, MSG_FD, SYNC_FDS = 3, 4, (5, 6)
KERNEL_FILE = '<airlock-kernel>'
MAIN_THREAD = _thread.get_ident()
CO_COROUTINE = 0x80
RICH_METHODS = (
    ('_repr_html_', 'text/html'),
    ('_repr_markdown_', 'text/markdown'),
    ('_repr_svg_', 'image/svg+xml'),
    ('_repr_png_', 'image/png'),
    ('_repr_jpeg_', 'image/jpeg'),
    ('_repr_latex_', 'text/latex'),
    ('_repr_json_', 'application/json'),
    ('_repr_javascript_', 'application/javascript'),
)
BINARY_MIMES = ('image/png', 'image/jpeg', 'image/gif', 'application/pdf')
JSON_ROWS = 10000  # rows of a DataFrame put in its application/json


class State:
    running = False   # user code is executing: SIGINT raises KeyboardInterrupt
    critical = 0      # the main thread is writing a message: defer SIGINT
    pending = False   # a SIGINT arrived during a critical section
    token = ''
    n = 0             # the current cell, echoed in every message
    synced = [0, 0]
    max_result = 16 << 20
    loop = None


st = State()
for _fd in (REQ_FD, MSG_FD) + SYNC_FDS:
    os.set_inheritable(_fd, False)
send_lock = _thread.allocate_lock()


def on_sigint(signum, frame):
    if st.critical:
        st.pending = True
    elif st.running:
        raise KeyboardInterrupt


signal.signal(signal.SIGINT, on_sigint)


def write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def send(msgs):
    """Writes sync markers and then messages, without being interrupted."""
    main = _thread.get_ident() == MAIN_THREAD
    if main:
        st.critical += 1
    try:
        with send_lock:
            for f in (sys.stdout, sys.stderr):
                try:
                    f.flush()
                except Exception:
                    pass
            marker = ('\0airlock-sync:' + st.token + '\0').encode()
            for i, fd in enumerate(SYNC_FDS):
                try:
                    write_all(fd, marker)
                    st.synced[i] += 1
                except OSError:
                    pass
            out = []
            for m in msgs:
                m['n'] = st.n
                m['sync'] = list(st.synced)
                out.append(json.dumps(m))
            try:
                write_all(MSG_FD, ('\n'.join(out) + '\n').encode())
            except OSError:
                os._exit(70)  # the Go side is gone, or user code closed fd 4
    finally:
        if main:
            st.critical -= 1
    if main and st.pending and not st.critical:
        st.pending = False
        if st.running:
            raise KeyboardInterrupt


def limit_bundle(data):
    """Returns a result message for a MIME bundle, dropping it if too large."""
    size = sum(len(v) for v in data.values())
    if size <= st.max_result:
        return {'type': 'result', 'data': data}
    note = '<result of %d bytes omitted: larger than the limit of %d bytes>' % (size, st.max_result)
    return {'type': 'result', 'data': {'text/plain': note}, 'truncated': True}


def safe_getattr(obj, name):
    try:
        return getattr(obj, name, None)
    except Exception:
        return None


def figure_bundle(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format='png')
    data = {'image/png': base64.b64encode(buf.getvalue()).decode('ascii'), 'text/plain': repr(fig)}
    try:
        chart = figure_chart(fig)  # after savefig: tick labels exist once drawn
        if chart is not None:
            data['e2b/chart'] = json.dumps(chart, default=scalar)
    except Exception as e:
        warn_formatter('chart', e)
    return data


def figure_chart(fig):
    """The data of a matplotlib figure in E2B's chart schema (result.chart):
    line and bar charts with their title, axis labels, ticks and elements;
    several axes make a superchart. None for a figure without data."""
    axes = [ax for ax in fig.get_axes()]
    if not axes or not any(ax.has_data() for ax in axes):
        return None
    if len(axes) == 1:
        return axes_chart(axes[0])
    title = fig._suptitle.get_text() if getattr(fig, '_suptitle', None) is not None else None
    return {'type': 'superchart', 'title': title or None, 'elements': [axes_chart(ax) for ax in axes]}


def axes_chart(ax):
    from matplotlib.collections import PathCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import PathPatch, Rectangle, Wedge
    parts = [c for c in ax.get_children() if c in ax.lines or c in ax.patches or c in ax.collections]
    chart = {'type': 'unknown', 'title': ax.get_title() or None, 'elements': []}
    if parts and all(isinstance(c, Line2D) for c in parts):
        chart['type'] = 'line'
    elif ax.containers and parts and all(isinstance(c, Rectangle) for c in parts):
        chart['type'] = 'bar'
    elif parts and all(isinstance(c, PathCollection) for c in parts):
        chart['type'] = 'scatter'
    elif parts and all(isinstance(c, Wedge) for c in parts):
        # a pie: each wedge's label, angle (degrees) and radius, as E2B's
        chart['type'] = 'pie'
        for w in parts:
            chart['elements'].append({'label': w.get_label(), 'angle': abs(sig8(w.theta2 - w.theta1)),
                                      'radius': float(w.r)})
        return chart
    elif parts and any(isinstance(c, PathPatch) for c in parts) and \
            all(isinstance(c, (PathPatch, Line2D)) for c in parts):
        chart['type'] = 'box_and_whisker'
    else:
        return chart
    labels = {'x_label': ax.get_xlabel() or None, 'y_label': ax.get_ylabel() or None}
    for axis in ('x', 'y'):
        label = labels[axis + '_label']
        unit = None
        if label:
            import re
            m = re.search(r'\s\((.*?)\)|\[(.*?)\]', label)
            if m:
                unit = m.group(1) or m.group(2)
        chart[axis + '_label'], chart[axis + '_unit'] = label, unit
    if chart['type'] == 'box_and_whisker':
        return box_chart(ax, chart, [c for c in parts if isinstance(c, PathPatch)])
    if chart['type'] in ('line', 'scatter'):
        for axis, get in (('x', ax.xaxis), ('y', ax.yaxis)):
            ticks = list(get.get_ticklocs())
            tick_labels = [t.get_text() for t in get.get_ticklabels()]
            dates = is_date_axis(get)
            chart[axis + '_ticks'] = [iso_date(t) if dates else float(t) for t in ticks]
            chart[axis + '_tick_labels'] = tick_labels
            chart[axis + '_scale'] = axis_scale(get, ax, axis, ticks, tick_labels, dates)
        if chart['type'] == 'scatter':
            for coll in parts:
                label = coll.get_label()
                if label.startswith('_child'):
                    label = 'Scatter ' + label[6:]
                points = [[point_value(x), point_value(y)] for x, y in coll.get_offsets()]
                chart['elements'].append({'label': label, 'points': points})
            return chart
        for n, line in enumerate(ax.get_lines()):
            label = line.get_label()
            if label.startswith('_child'):
                label = 'Line ' + label[6:]
            points = [[point_value(x), point_value(y)] for x, y in zip(line.get_xdata(), line.get_ydata())]
            chart['elements'].append({'label': label, 'points': points})
        return chart
    for container in ax.containers:
        group = container.get_label()
        if group.startswith('_container'):
            group = 'Group ' + group[10:]
        rects = list(container)
        heights = [r.get_height() for r in rects]
        if len(heights) > 1 and all(h == heights[0] for h in heights):
            # horizontal bars (barh): categories on the y axis
            chart['x_label'], chart['y_label'] = chart['y_label'], chart['x_label']
            chart['x_unit'], chart['y_unit'] = chart['y_unit'], chart['x_unit']
            names = [t.get_text() for t in ax.get_yticklabels()]
            values = [r.get_width() for r in rects]
        else:
            names = [t.get_text() for t in ax.get_xticklabels()]
            values = heights
        for name, value in zip(names, values):
            chart['elements'].append({'label': name, 'group': group, 'value': float(value)})
    return chart


def sig8(v):
    """v rounded as E2B's charts round it: to 8 - (its decimal exponent)
    significant digits, so that a pie's 323.99999999999994 degrees are 324."""
    from decimal import Decimal, localcontext
    d = Decimal(str(float(v)))
    with localcontext() as ctx:
        ctx.prec = max(1, 8 - d.adjusted())
        return float(+d)


def box_chart(ax, chart, boxes):
    """E2B's box_and_whisker chart of a boxplot: for each box (a PathPatch,
    in order, named by its tick label) its quartiles from the box, its
    median, whiskers' ends and outliers from the lines drawn over it."""
    import numpy as np
    spans = []
    for b in boxes:
        v = b.get_path().vertices
        spans.append((v[:, 0].min(), v[:, 0].max(), v[:, 1].min(), v[:, 1].max()))
    # boxplot puts its boxes at fixed positions of the category axis: x for
    # vertical boxes (the default), y for horizontal ones (vert=False).
    from matplotlib.ticker import FixedLocator
    vertical = not isinstance(ax.yaxis.get_major_locator(), FixedLocator) or \
        isinstance(ax.xaxis.get_major_locator(), FixedLocator)
    if not vertical:
        chart['x_label'], chart['y_label'] = chart['y_label'], chart['x_label']
        chart['x_unit'], chart['y_unit'] = chart['y_unit'], chart['x_unit']
        spans = [(s[2], s[3], s[0], s[1]) for s in spans]
    ticks = ax.get_xticklabels() if vertical else ax.get_yticklabels()
    names = [t.get_text() for t in ticks]
    for i, (x0, x1, q1, q3) in enumerate(spans):
        el = {'label': names[i] if i < len(names) else str(i + 1), 'min': sig8(q1), 'first_quartile': sig8(q1),
              'median': None, 'third_quartile': sig8(q3), 'max': sig8(q3), 'outliers': []}
        widest = -1
        for line in ax.lines:
            xs, ys = np.asarray(line.get_xdata(), float), np.asarray(line.get_ydata(), float)
            if not vertical:
                xs, ys = ys, xs
            if len(xs) == 0 or not (x0 - 1e-9 <= xs.mean() <= x1 + 1e-9):
                continue
            if line.get_linestyle() in ('None', '', ' ') and line.get_marker() not in (None, 'None', ''):
                el['outliers'] += [sig8(y) for y in ys]
                continue
            el['min'], el['max'] = min(el['min'], sig8(ys.min())), max(el['max'], sig8(ys.max()))
            width = xs.max() - xs.min()
            if len(ys) == 2 and ys[0] == ys[1] and q1 <= ys[0] <= q3 and width > widest:
                widest, el['median'] = width, sig8(ys[0])
        chart['elements'].append(el)
    return chart


def is_date_axis(axis):
    try:
        import matplotlib.dates as mdates
        conv = axis.get_converter() if hasattr(axis, 'get_converter') else axis.converter
        return isinstance(conv, (mdates.DateConverter, mdates.ConciseDateConverter)) or \
            type(conv).__name__ == '_SwitchableDateConverter'
    except Exception:
        return False


def iso_date(num):
    import matplotlib.dates as mdates
    return mdates.num2date(num).isoformat()


def axis_scale(axis, ax, which, ticks, labels, dates):
    if dates:
        return 'datetime'
    scale = ax.get_xscale() if which == 'x' else ax.get_yscale()
    if scale != 'linear':
        return scale
    # categorical: ticks 0..n-1 whose labels are not those numbers
    if ticks and all(t == i and str(i) != lab for i, (t, lab) in enumerate(zip(ticks, labels))):
        return 'categorical'
    return 'linear'


def point_value(v):
    import datetime
    if isinstance(v, (datetime.date, datetime.datetime)):
        return v.isoformat()
    if type(v).__name__ == 'datetime64':
        return str(v.astype('datetime64[s]'))
    return scalar(v) if not isinstance(v, (int, float, str)) else v


def encode_mime(mime, value):
    if value is None:
        return None
    if mime in BINARY_MIMES or mime.startswith('image/') and mime != 'image/svg+xml':
        if isinstance(value, (bytes, bytearray, memoryview)):
            return base64.b64encode(bytes(value)).decode('ascii')
        return str(value)  # by convention already base64
    if mime == 'application/json' or mime.endswith('+json'):
        return value if isinstance(value, str) else json.dumps(value, default=str)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode('utf-8', 'replace')
    return str(value)


def bundle(obj):
    """Builds the MIME bundle of a value: rich reprs, pandas, figures, repr."""
    data = {}
    mpl_figure = sys.modules.get('matplotlib.figure')
    pd = sys.modules.get('pandas')
    if mpl_figure is not None and isinstance(obj, mpl_figure.Figure):
        data.update(figure_bundle(obj))
        plt = sys.modules.get('matplotlib.pyplot')
        if plt is not None:
            plt.close(obj)
        return data
    if not isinstance(obj, type):
        # Objects claiming every attribute (mocks, proxies) have no rich repr.
        claims_all = callable(safe_getattr(obj, '_airlock_canary_method_should_not_exist_'))
        mb = None if claims_all else safe_getattr(obj, '_repr_mimebundle_')
        if callable(mb):
            try:
                got = mb(include=None, exclude=None)
                if isinstance(got, tuple):
                    got = got[0]
                for mime, value in (got or {}).items():
                    enc = encode_mime(mime, value)
                    if enc is not None:
                        data[mime] = enc
            except Exception as e:
                warn_formatter('_repr_mimebundle_', e)
        for meth, mime in RICH_METHODS:
            if claims_all or mime in data:
                continue
            f = safe_getattr(obj, meth)
            if not callable(f):
                continue
            try:
                value = f()
                if isinstance(value, tuple):  # (data, metadata)
                    value = value[0]
                enc = encode_mime(mime, value)
                if enc is not None:
                    data[mime] = enc
            except Exception as e:
                warn_formatter(meth, e)
    if pd is not None and isinstance(obj, (pd.DataFrame, pd.Series)) and 'application/json' not in data:
        try:
            part = obj if len(obj) <= JSON_ROWS else obj.head(JSON_ROWS)
            data['application/json'] = part.to_json(orient='split', date_format='iso', default_handler=str)
        except Exception as e:
            warn_formatter('to_json', e)
        if isinstance(obj, pd.DataFrame):
            try:
                data['e2b/data'] = frame_data(obj)
            except Exception as e:
                warn_formatter('to_dict', e)
        if isinstance(obj, pd.Series) and 'text/html' not in data:
            try:
                data['text/html'] = obj.to_frame()._repr_html_()
            except Exception as e:
                warn_formatter('to_frame', e)
    data['text/plain'] = repr(obj)
    return data


def dedent(src):
    """textwrap.dedent without importing textwrap into every kernel."""
    if not src[:1].isspace():
        return src
    import textwrap
    return textwrap.dedent(src)


def frame_data(df):
    """A DataFrame as E2B's result.data: {column: [values]}, timestamps in
    ISO 8601, at most JSON_ROWS rows."""
    pd = sys.modules['pandas']
    part = df if len(df) <= JSON_ROWS else df.head(JSON_ROWS)
    out = {}
    for key, values in part.to_dict(orient='list').items():
        out[str(key)] = [v.isoformat() if isinstance(v, pd.Timestamp) else None if isinstance(v, float) and v != v else v for v in values]
    return json.dumps(out, default=scalar)


def scalar(o):
    """JSON for what json does not know: numpy scalars as their value."""
    item = safe_getattr(o, 'item')
    if callable(item):
        try:
            v = item()
            if not isinstance(v, float) or v == v:
                return v
            return None
        except Exception:
            pass
    return str(o)


def warn_formatter(name, e):
    try:
        sys.stderr.write('airlock: %s failed: %s: %s\n' % (name, type(e).__name__, e))
    except Exception:
        pass


def open_figures():
    plt = sys.modules.get('matplotlib.pyplot')
    if plt is None:
        return []
    return [plt.figure(num) for num in plt.get_fignums()]


def flush_figures():
    """Renders and closes every open matplotlib figure; returns the results."""
    plt = sys.modules.get('matplotlib.pyplot')
    out = []
    for fig in open_figures():
        try:
            out.append(limit_bundle(figure_bundle(fig)))
        except Exception as e:
            warn_formatter('savefig', e)
        plt.close(fig)
    return out


def show(*args, **kwargs):
    """Replacement for matplotlib.pyplot.show: sends every open figure."""
    msgs = flush_figures()
    if msgs:
        send(msgs)


def display(*objs, **kwargs):
    """Sends the rich representation of each object as a result now."""
    for obj in objs:
        if kwargs.get('raw') and isinstance(obj, dict):
            data = {k: encode_mime(k, v) for k, v in obj.items()}
        else:
            data = bundle(obj)
        send([limit_bundle(data)])


class PatchOnImport:
    """Import hook that runs patch(module) once module `name` is loaded
    (matplotlib.pyplot: our show; PIL.Image: images as results)."""

    def __init__(self, name, patch):
        self.name, self.patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        import importlib.util
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, 'exec_module'):
            return spec
        orig, patch = spec.loader.exec_module, self.patch

        def exec_module(module):
            orig(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


def patch_pyplot(module):
    """Swaps pyplot.show for ours."""
    show.__doc__ = module.show.__doc__
    module.show = show


def patch_pil(module):
    """PIL images become results as in E2B's kernel: Image.show() displays
    the image (no viewer is started) and save() to a file name displays it
    too, then saves."""
    cls = module.Image
    save = cls.save

    def show_image(self, title=None, **options):
        display(self)

    def save_and_show(self, fp, format=None, **params):
        if isinstance(fp, (str, os.PathLike)):
            display(self)
        return save(self, fp, format, **params)

    cls.show, cls.save = show_image, save_and_show


class DisplayObject:
    """IPython.display's DisplayObject, for the shim below: data given
    directly, or read from filename (url is kept, not fetched)."""
    _mime = 'text/plain'
    _binary = False

    def __init__(self, data=None, url=None, filename=None, metadata=None, **kwargs):
        if data is not None and isinstance(data, str) and filename is None and url is None and \
                not self._binary and os.path.exists(data) and len(data) < 4096 and '\n' not in data:
            filename, data = data, None
        self.data, self.url, self.filename, self.metadata = data, url, filename, metadata
        if filename is not None and data is None:
            with open(filename, 'rb' if self._binary else 'r') as f:
                self.data = f.read()

    def __repr__(self):
        return '<%s.%s object>' % (type(self).__module__, type(self).__name__)


def _shim_class(name, mime, meth):
    cls = type(name, (DisplayObject,), {'_mime': mime, '__module__': 'IPython.core.display'})
    setattr(cls, meth, lambda self: self.data)
    return cls


HTML = _shim_class('HTML', 'text/html', '_repr_html_')
Markdown = _shim_class('Markdown', 'text/markdown', '_repr_markdown_')
SVG = _shim_class('SVG', 'image/svg+xml', '_repr_svg_')
Latex = _shim_class('Latex', 'text/latex', '_repr_latex_')
Javascript = _shim_class('Javascript', 'application/javascript', '_repr_javascript_')


class JSON(DisplayObject):
    __module__ = 'IPython.core.display'

    def _repr_json_(self):
        return self.data


class Image(DisplayObject):
    """IPython.display.Image: PNG or JPEG bytes (or a file of them)."""
    __module__ = 'IPython.core.display'
    _binary = True

    def __init__(self, data=None, url=None, filename=None, format=None, embed=None, width=None, height=None, **kwargs):
        if isinstance(data, str) and filename is None and os.path.exists(data):
            filename, data = data, None
        super().__init__(data, url, filename)
        fmt = (format or '').lower()
        if not fmt and filename:
            fmt = filename.rsplit('.', 1)[-1].lower()
        if not fmt and isinstance(self.data, (bytes, bytearray)):
            fmt = 'jpeg' if bytes(self.data[:3]) == b'\xff\xd8\xff' else 'png'
        self.format = 'jpeg' if fmt in ('jpg', 'jpeg') else 'png'
        self.width, self.height = width, height

    def _repr_png_(self):
        return self.data if self.format == 'png' else None

    def _repr_jpeg_(self):
        return self.data if self.format == 'jpeg' else None


def clear_output(wait=False):
    """IPython.display.clear_output: nothing to clear in airlock's results."""


class IPythonShim:
    """Import hook, last on sys.meta_path: when IPython is not installed,
    `from IPython.display import display, Image, HTML...` (and
    IPython.core.display, IPython.core.display_functions) get a small module
    with airlock's display and IPython's display classes, as notebooks and
    E2B's kernel have them. An installed IPython comes first and wins."""
    NAMES = ('IPython', 'IPython.display', 'IPython.core', 'IPython.core.display',
             'IPython.core.display_functions')

    def find_spec(self, name, path, target=None):
        if name not in self.NAMES:
            return None
        import importlib.machinery
        return importlib.machinery.ModuleSpec(name, self, is_package=name in ('IPython', 'IPython.core'))

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__dict__.update(display=display, clear_output=clear_output, DisplayObject=DisplayObject,
                               HTML=HTML, Markdown=Markdown, SVG=SVG, Latex=Latex, Javascript=Javascript,
                               JSON=JSON, Image=Image)
        if module.__name__ in ('IPython', 'IPython.core'):
            module.__path__ = []



def format_error(e, interrupted=False):
    import traceback
    name = type(e).__name__
    value = str(e)
    if isinstance(e, SystemExit):
        value = '' if e.code is None else str(e.code)
    root = traceback.TracebackException(type(e), e, e.__traceback__, compact=True)
    if isinstance(e, SyntaxError) and not any(f.filename.startswith('<cell-') for f in root.stack):
        # The cell does not compile: only the error itself is of interest.
        lines = list(root.format_exception_only())
    else:
        # Drop the kernel's frames, and those of the machinery above the
        # cell (asyncio running a cell with top-level await).
        te, seen = root, set()
        while te is not None and id(te) not in seen:
            seen.add(id(te))
            frames = list(te.stack)
            for i, f in enumerate(frames):
                if f.filename.startswith('<cell-'):
                    frames = frames[i:]
                    break
            te.stack = traceback.StackSummary.from_list(
                [f for f in frames if f.filename not in (KERNEL_FILE, '<string>')])
            te = te.__cause__ or te.__context__
        lines = list(root.format())
    m = {'type': 'error', 'name': name, 'value': value, 'traceback': [l for c in lines for l in c.rstrip('\n').split('\n')]}
    if interrupted:
        m['interrupted'] = True
    return m


def run_code(code, ns):
    if code.co_flags & CO_COROUTINE:
        if st.loop is None:
            import asyncio
            st.loop = asyncio.new_event_loop()
        return st.loop.run_until_complete(eval(code, ns))
    return eval(code, ns)


def set_env(env):
    """Sets environment variables; returns what restores the old values."""
    old = {}
    for k, v in env.items():
        old[k] = os.environ.get(k)
        os.environ[k] = v
    return old


def restore_env(old):
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


MAGIC_LINE = None


def parse_cell(src, fname):
    """Parses a cell; lines that are IPython shell escapes (!cmd) or line
    magics (%pip, %cd, %env, %matplotlib) become calls, as notebooks written
    for Jupyter use them. Only a cell that does not parse otherwise is
    rewritten."""
    try:
        return ast.parse(src, fname, 'exec')
    except SyntaxError as e:
        first = e
    global MAGIC_LINE
    if MAGIC_LINE is None:
        import re
        MAGIC_LINE = re.compile(r'^([ \t]*)([!%])(.*)$')
    lines = src.split('\n')
    changed = False
    for i, line in enumerate(lines):
        m = MAGIC_LINE.match(line)
        if m and not line.rstrip().endswith('\\'):
            indent, kind, rest = m.groups()
            lines[i] = '%s_airlock_magic(%r, %r)' % (indent, kind, rest.strip())
            changed = True
    if not changed:
        raise first
    try:
        return ast.parse('\n'.join(lines), fname, 'exec')
    except SyntaxError:
        raise first


def magic(kind, line):
    """Runs an IPython-style shell escape (!cmd) or line magic (%name)."""
    import subprocess
    for f in (sys.stdout, sys.stderr):
        f.flush()
    if kind == '!':
        subprocess.run(line, shell=True)
        return None
    name, _, arg = line.partition(' ')
    arg = arg.strip()
    if name == 'pip':
        import shlex
        subprocess.run([sys.executable, '-m', 'pip'] + shlex.split(arg))
    elif name == 'cd':
        os.chdir(os.path.expanduser(arg or '~'))
        print(os.getcwd())
    elif name == 'pwd':
        return os.getcwd()
    elif name == 'env':
        if not arg:
            return dict(os.environ)
        sep = '=' if '=' in arg else ' '
        if sep not in arg:
            return os.environ.get(arg)
        k, _, v = arg.partition(sep)
        os.environ[k.strip()] = v.strip()
    elif name in ('matplotlib', 'config', 'load_ext', 'reload_ext', 'autoreload'):
        pass  # figures are always captured; the rest has no meaning here
    else:
        raise NameError('%%%s is not supported (supported: !command, %%pip, %%cd, %%pwd, %%env, %%matplotlib)' % name)
    return None


def run_cell(req, ns):
    n = st.n
    # An indented cell (code pasted from inside a function, or a string
    # literal written indented) runs as if it were not: textwrap.dedent,
    # as E2B's and IPython's kernels do.
    src = dedent(req.get('code', ''))
    fname = '<cell-%d>' % n
    linecache.cache[fname] = (len(src), None, src.splitlines(True), fname)
    msgs = []
    err = None
    old_env = set_env(req.get('env') or {})
    try:
        st.running = True
        try:
            flags = getattr(ast, 'PyCF_ALLOW_TOP_LEVEL_AWAIT', 0)
            tree = parse_cell(src, fname)
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            if tree.body:
                run_code(compile(tree, fname, 'exec', flags=flags, dont_inherit=True), ns)
            if last is not None:
                value = run_code(compile(last, fname, 'eval', flags=flags, dont_inherit=True), ns)
                if value is not None:
                    ns['_'] = value
                    m = limit_bundle(bundle(value))
                    m['main'] = True
                    msgs.append(m)
            msgs.extend(flush_figures())
        finally:
            st.running = False
    except KeyboardInterrupt as e:
        err = format_error(e, interrupted=True)
    except BaseException as e:
        err = format_error(e)
    restore_env(old_env)
    if err is not None:
        # Figures drawn before the error are still shown.
        try:
            msgs.extend(flush_figures())
        except BaseException:
            pass
        msgs.append(err)
    msgs.append({'type': 'end'})
    send(msgs)


class Quitter:
    """exit() and quit() without site's closing of sys.stdin."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return 'Use %s() to end the cell with SystemExit' % self.name

    def __call__(self, code=None):
        raise SystemExit(code)


def main():
    mod = types.ModuleType('__main__')
    mod.__dict__['__builtins__'] = builtins
    sys.modules['__main__'] = mod
    ns = mod.__dict__
    sys.argv = ['']
    builtins.display = display
    builtins._airlock_magic = magic
    builtins.exit, builtins.quit = Quitter('exit'), Quitter('quit')
    sys.meta_path.insert(0, PatchOnImport('matplotlib.pyplot', patch_pyplot))
    sys.meta_path.insert(0, PatchOnImport('PIL.Image', patch_pil))
    sys.meta_path.append(IPythonShim())
    reqs = os.fdopen(REQ_FD, 'rb', buffering=1 << 16)
    first = True
    while True:
        try:
            line = reqs.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            os._exit(0)
        try:
            req = json.loads(line)
            st.token = req.get('token', '')
            st.n = req.get('n', 0)
            st.synced = [0, 0]
            st.max_result = req.get('max_result') or st.max_result
            if first or req.get('init'):
                first = False
                send([{'type': 'ready', 'pid': os.getpid(), 'version': sys.version.split()[0]}])
                continue
            run_cell(req, ns)
        except BaseException as e:
            # An interrupt that escaped run_cell, or a bug in the kernel
            # itself: report it and keep serving.
            st.running = False
            try:
                err = format_error(e, interrupted=isinstance(e, KeyboardInterrupt))
                send([err, {'type': 'end'}])
            except BaseException:
                os._exit(71)


main()
