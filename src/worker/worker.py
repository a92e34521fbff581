# The in-sandbox worker of pi-python-sandbox: standard library only.
#
# It keeps one namespace across executions and speaks the host's frame
# protocol through the init (init.py, shipped ahead of this file in one
# file: its frame I/O, PID 1, reserved descriptors, end marks and kill).
# Requests arrive on fd 3, replies leave on fd 4; stdout and stderr are the
# real fds 1 and 2 (pipes to the host), so subprocess output is captured
# too. After each execution the worker writes an end mark on both streams so
# that the host knows, without a timed wait, where that execution's output
# ends. The confinement (namespaces, mounts, seccomp, rlimits) is already in
# force when this file starts; nothing here is a security boundary.
#
# Syntax stays at the level of old Pythons up to the version check, so that
# an interpreter that is too old reports so instead of a SyntaxError.
import sys
import os

# This module's code object, for --emit-code (taken before anything else ran).
MODULE_CODE = sys._getframe().f_code

PROTOCOL = 4
# The bounds below (and the init's MAX_FRAME and DRAIN_CAP) are the
# host's: it passes them with --limits (see set_limits); these values only
# serve until then.
MAX_REPR = 8 * 1024
MAX_MESSAGE = 8 * 1024
MAX_TRACEBACK = 16 * 1024
MAX_TYPE = 128
MAX_IMAGES = 4
MAX_IMAGE_BYTES = 4 * 1024 * 1024
MAX_IMAGES_TOTAL = 6 * 1024 * 1024
IMAGE_DIR = "/scratch/.pi-images"


if sys.version_info < (3, 10):
    send({"type": "error", "id": None,
          "message": "Python %d.%d is too old; the python tool needs Python 3.10 or newer (%s)"
          % (sys.version_info[0], sys.version_info[1], sys.executable)})
    sys.exit(1)

import _ast
import binascii
import builtins
import time

# The name tracebacks give the worker's frames, also when it runs as
# /worker.pyc: the file it was compiled from.
WORKER_FILE = os.path.abspath(MODULE_CODE.co_filename)


# C0 control characters other than tab and newlines, shown as their Unicode
# pictures (U+2400 + code): JSON would spell each as six bytes, so a bounded
# field full of them could overflow the reply frame.
CONTROL_PICTURES = {c: 0x2400 + c for c in range(32) if c not in (9, 10, 13)}


def clean(text):
    """Text that survives UTF-8 encoding (lone surrogates escaped) and
    whose JSON form is at most twice its UTF-8 size."""
    return text.translate(CONTROL_PICTURES).encode("utf-8", "backslashreplace").decode("utf-8")


def bound(text, limit, keep="head"):
    """Fit `text` into `limit` UTF-8 bytes with a marker saying what was cut.

    Returns (text, truncated). keep: "head", "tail" or "both".
    """
    raw = clean(text).encode("utf-8")
    if len(raw) <= limit:
        return raw.decode("utf-8"), False
    room = limit - 48  # space for the marker
    if keep == "head":
        head, tail = raw[:room], b""
    elif keep == "tail":
        head, tail = b"", raw[len(raw) - room:]
    else:
        head, tail = raw[: room * 3 // 4], raw[len(raw) - room // 4:]
    head = head.decode("utf-8", "ignore")
    tail = tail.decode("utf-8", "ignore")
    omitted = len(raw) - len(head.encode("utf-8")) - len(tail.encode("utf-8"))
    marker = "...[%d bytes omitted]..." % omitted
    if keep == "head":
        return head + marker, True
    if keep == "tail":
        return marker + "\n" + tail, True
    return head + marker + tail, True


def b64decode(text):
    """Strict base64 where the interpreter has it (3.11+)."""
    data = text.encode("ascii")
    try:
        return binascii.a2b_base64(data, strict_mode=True)
    except TypeError:
        return binascii.a2b_base64(data)


# Every execution's source, under its own name (`<python-N>`, N the host's
# execution number), so that a traceback shows the offending line, also in a
# function an earlier execution defined, as a notebook does. Kept oldest
# first and bounded: the oldest go first past MAX_SOURCE_BYTES.
MAX_SOURCE_BYTES = 8 * 1024 * 1024
SOURCES = {}
SOURCE_BYTES = [0]
# Names linecache has not been given yet.
PENDING = []


def source_name(exec_id):
    return "<python-%d>" % exec_id


def remember_source(name, code):
    SOURCES[name] = code
    PENDING.append(name)
    SOURCE_BYTES[0] += len(code)
    while SOURCE_BYTES[0] > MAX_SOURCE_BYTES and len(SOURCES) > 1:
        old = next(iter(SOURCES))
        SOURCE_BYTES[0] -= len(SOURCES.pop(old))
        lc = sys.modules.get("linecache")
        if lc is not None:
            lc.cache.pop(old, None)
    register_sources()


def register_sources():
    """Give linecache the sources it lacks, once something has imported it.

    Importing linecache (and with it tokenize and re) costs about a third of
    the interpreter's start-up, so the worker never does so itself before a
    traceback is formatted. Entries without a modification time are never
    evicted by linecache.checkcache; a clearcache() is noticed by the oldest
    name missing, and everything is given again.
    """
    lc = sys.modules.get("linecache")
    if lc is None or not SOURCES:
        return
    cache = getattr(lc, "cache", None)
    if not isinstance(cache, dict):
        return
    names = list(SOURCES) if next(iter(SOURCES)) not in cache else PENDING
    for name in names:
        code = SOURCES.get(name)
        if code is not None and name not in cache:
            cache[name] = (len(code), None, code.splitlines(True), name)
    del PENDING[:]


class SourcesAfter(object):
    """A module loader that gives linecache the sources once it has run."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        register_sources()

    def __getattr__(self, name):
        return getattr(self.loader, name)


class LinecacheWatch(object):
    """A one-shot import hook: the moment anything first imports linecache
    (traceback, logging, ...), even in the middle of an execution, it gets
    the sources, so that the code's own traceback.print_exc() shows lines
    too. It costs one call per import until then."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "linecache":
            return None
        if LinecacheWatch in sys.meta_path:
            sys.meta_path.remove(LinecacheWatch)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = SourcesAfter(spec.loader)
        return spec


def watch_linecache():
    if "linecache" not in sys.modules:
        sys.meta_path.insert(0, LinecacheWatch)


def user_traceback(exc):
    """The formatted exception without the worker's own frames: none of
    them, wherever they are in the stack (the read hook is the innermost
    frame of a refused read) and in chained exceptions too."""
    import traceback
    register_sources()
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
    todo, seen = [te], set()
    while todo:
        t = todo.pop()
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        t.stack = traceback.StackSummary.from_list(
            [f for f in t.stack if os.path.abspath(f.filename) != WORKER_FILE])
        todo.extend([t.__cause__, t.__context__] + list(getattr(t, "exceptions", None) or ()))
    return "".join(te.format())


def describe(exc):
    try:
        message = str(exc)
    except BaseException as e:  # a broken __str__ must not break the worker
        message = "<str() raised %s>" % type(e).__name__
    try:
        tb = user_traceback(exc)
    except BaseException as e:
        tb = "<traceback could not be formatted: %s>" % type(e).__name__
    return {
        "type": bound(type(exc).__name__, MAX_TYPE)[0],
        "message": bound(message, MAX_MESSAGE, "head")[0],
        "traceback": bound(tb, MAX_TRACEBACK, "tail")[0],
    }


def safe_repr(value):
    try:
        return repr(value)
    except (MemoryError, RecursionError) as e:
        return "<repr failed: %s>" % type(e).__name__
    except BaseException as e:
        return "<repr raised %s>" % type(e).__name__


class SandboxReadDenied(Exception):
    """A read of a path outside the sandbox mounts.

    Raised by the read hook so that the tool can offer a permission prompt;
    the mounts themselves are what stops the read.
    """

    def __init__(self, path, is_dir, secret=False):
        Exception.__init__(self, path)
        self.path = path
        self.is_dir = is_dir
        self.secret = secret


def unescape_mount(field):
    """Undo /proc/self/mounts' octal escapes (\\040 for a space, ...)."""
    out, i = bytearray(), 0
    while i < len(field):
        if field[i:i + 1] == b"\\" and field[i + 1:i + 4].isdigit():
            out.append(int(field[i + 1:i + 4], 8))
            i += 4
        else:
            out += field[i:i + 1]
            i += 1
    return os.fsdecode(bytes(out))


def mask_source(root):
    """Whether a mount's root (mountinfo's fourth field) is the session's
    empty mask file or directory, `<16 hex digits>/mask-file` or
    `/mask-dir`: what the host binds over a secret (the sandbox cannot
    make a mount, so it cannot plant one)."""
    parts = root.rsplit(b"/", 2)
    return (len(parts) == 3 and parts[2] in (b"mask-file", b"mask-dir") and len(parts[1]) == 16
            and all(c in b"0123456789abcdef" for c in parts[1]))


def mountpoints():
    """The sandbox's own mountpoints, except /: what user code may read;
    and those of them that mask a secret (a host secret in a granted tree
    or one of the project's). Not a mask over another mount at the same
    point: that hides a mount (a kernel file system inside a shown tree),
    as the masks of the kernel's files under /proc do."""
    points, masks, stacked = set(), set(), set()
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split(b" ", 5)
            if len(fields) >= 5:
                point = unescape_mount(fields[4]).rstrip("/")
                if point.startswith("/"):
                    if point in points:
                        stacked.add(point)
                    points.add(point)
                    if mask_source(fields[3]) and not point.startswith("/proc/"):
                        masks.add(point)
    return tuple(sorted(points)), frozenset(masks - stacked)


def install_read_hook(masks=()):
    """Turn reads outside the mounts (where the path resolves: through the
    project's host path, a link to /workspace, or a link in the project),
    and reads of masked secrets, into SandboxReadDenied.

    Covers open (and all built on it), os.listdir and os.scandir in this
    process; never stat or existence checks. Subprocesses are not covered:
    their reads simply fail with the kernel's error, or read the empty
    mask over a secret. `masks` are the masked sandbox paths (from the
    host): the mounts hide them whatever this hook does; it only names
    such a read as a secret's.
    """
    # The hook runs on every open (each import's included): prefixes are
    # built once, and the mount points ("/" never among them) match exactly.
    # The host may attach a mount or detach a mask while the sandbox runs
    # (a grant applied live): a read the lists refuse reads the mount table
    # again before it is refused, in the interpreter and in a rollback copy
    # alike, so that what they know follows the sandbox's mounts.
    known = {}

    def learn(mounts):
        known["points"] = mounts
        points, bound = mounts
        allowed = frozenset(points)
        known["allowed"] = allowed
        known["prefixes"] = tuple(m + "/" for m in allowed)
        # A mask the host detached is no mount point any more (one that
        # never was a mount point stays); a host secret in a granted tree
        # is known by its mount, also one attached while the sandbox runs.
        first = known.setdefault("first", allowed)
        masked = frozenset(m for m in masks if m in allowed or m not in first) | bound
        known["masked"] = masked
        known["masked_prefixes"] = tuple(m + "/" for m in masked)

    learn(mountpoints())

    def refresh():
        try:
            points = mountpoints()
        except OSError:
            return False
        if points == known["points"]:
            return False
        learn(points)
        return True

    def inside(path):
        return path in known["allowed"] or path.startswith(known["prefixes"])

    def secret(path):
        return path in known["masked"] or path.startswith(known["masked_prefixes"])

    def hook(event, args):
        if event == "open":
            # A write is not a read: a grant would mount the path read-only
            # anyway, so the kernel answers it (ENOENT, EROFS) without a prompt.
            if len(args) > 2 and isinstance(args[2], int) and args[2] & (os.O_WRONLY | os.O_RDWR):
                return
            is_dir = False
        elif event == "os.listdir" or event == "os.scandir":
            is_dir = True
        else:
            if event == "sys.addaudithook":
                AUDIT_HOOKS[0] = True  # the code's hook would run in a rollback copy
            return
        if not args:
            return
        path = args[0]
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        elif not isinstance(path, str):
            return  # an fd, or None for the current directory
        try:
            full = os.path.normpath(path if path.startswith("/") else os.path.join(os.getcwd(), path))
        except Exception:
            return
        if known["masked"]:
            if secret(full) and not (refresh() and not secret(full)):
                raise SandboxReadDenied(full, is_dir, True)
            if not full.startswith("/usr/"):
                # A link (in /scratch, /tmp, /proc/self/...) to a secret.
                try:
                    real = os.path.realpath(full)
                except Exception:
                    real = full
                if secret(real) and not (refresh() and not secret(real)):
                    raise SandboxReadDenied(real, is_dir, True)
        # Links are resolved before the mount points are compared: the
        # project's host path is a link to /workspace, and a link in the
        # project that leads out of the mounts is refused under either name
        # (the tool then says so without asking), not met as a missing file.
        if inside(full) and not (full == "/workspace" or full.startswith("/workspace/")):
            return
        try:
            real = os.path.realpath(full)
        except Exception:
            real = full
        if inside(real):
            return
        if refresh() and inside(real):
            # A tree attached since: its host secrets are masked in it.
            for p in (full, real):
                if secret(p):
                    raise SandboxReadDenied(p, is_dir, True)
            return
        raise SandboxReadDenied(full, is_dir)

    sys.addaudithook(hook)


def setup_site(dirs):
    """Add the user's chosen site directories (a venv's site-packages, ...).

    Returns notes for directories that were skipped. -I -S stay in force:
    nothing else of the host's Python environment is used.
    """
    import site
    notes = []
    here = "python%d.%d" % sys.version_info[:2]
    added = False
    for d in dirs:
        parts = d.split("/")
        other = [p for p in parts if p.startswith("python3.") and p != here]
        if other:
            notes.append("%s is for %s, but the interpreter is %s; skipped" % (d, other[0], here))
        elif not os.path.isdir(d):
            notes.append("%s is not a directory inside the sandbox; skipped" % d)
        else:
            site.addsitedir(d)
            added = True
    if added:
        # Native libraries size their thread pools by the CPU count, and each
        # thread's reservation counts against RLIMIT_AS: keep one thread.
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
            os.environ.setdefault(var, "1")
        os.environ.setdefault("MPLBACKEND", "Agg")
    return notes


class Rich(object):
    """Images and notes produced by one execution (display() and the final value)."""

    def __init__(self, exec_id):
        self.exec_id = exec_id
        self.images = []
        self.notes = []
        self.sent_bytes = 0
        self.saved = 0
        # The objects shown, kept alive so that identity means something.
        self.shown = []

    def add_image(self, mime, data, ext):
        self.saved += 1
        n = self.saved
        if not os.path.isdir(IMAGE_DIR):
            os.makedirs(IMAGE_DIR, exist_ok=True)
        path = "%s/%04d-%d.%s" % (IMAGE_DIR, self.exec_id, n, ext)
        with open(path, "wb") as f:
            f.write(data)
        width = height = None
        if mime == "image/png" and data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
            width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        send = mime in ("image/png", "image/jpeg")
        if not send:
            self.notes.append("%s saved as %s (not sent to the model: %s is not an image format it reads)" % (ext.upper(), path, mime))
        elif len(self.images) >= MAX_IMAGES:
            self.notes.append("image saved as %s but not sent: at most %d images per execution" % (path, MAX_IMAGES))
            send = False
        elif len(data) > MAX_IMAGE_BYTES or self.sent_bytes + len(data) > MAX_IMAGES_TOTAL:
            self.notes.append("image saved as %s but not sent: %d bytes is over the image budget" % (path, len(data)))
            send = False
        if send:
            self.sent_bytes += len(data)
            self.images.append({"path": path, "mime": mime, "width": width, "height": height, "bytes": len(data)})

    def show(self, obj):
        """Record `obj` if it renders as an image; returns whether it did."""
        if any(o is obj for o in self.shown):
            return True
        image = image_of(obj)
        if image is None:
            return False
        self.shown.append(obj)
        try:
            self.add_image(*image)
        except OSError as e:
            self.notes.append("an image could not be saved: %s" % e)
        return True

    def collect_figures(self):
        """Like a notebook's inline backend: open matplotlib figures are shown and closed."""
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        try:
            for num in plt.get_fignums():
                self.show(plt.figure(num))
            plt.close("all")
        except Exception as e:
            self.notes.append("matplotlib figures could not be rendered: %s" % type(e).__name__)


def image_of(obj):
    """(mime, bytes, extension) for an object that renders as an image, else None."""
    import io
    try:
        module = type(obj).__module__ or ""
        if module.startswith("matplotlib") and hasattr(obj, "savefig"):
            buf = io.BytesIO()
            obj.savefig(buf, format="png", bbox_inches="tight")
            return "image/png", buf.getvalue(), "png"
        if module.startswith("PIL") and hasattr(obj, "save") and hasattr(obj, "size"):
            buf = io.BytesIO()
            obj.save(buf, format="PNG")
            return "image/png", buf.getvalue(), "png"
        for method, mime, ext in (("_repr_png_", "image/png", "png"), ("_repr_jpeg_", "image/jpeg", "jpg"),
                                  ("_repr_svg_", "image/svg+xml", "svg")):
            fn = getattr(type(obj), method, None)
            if not callable(fn):
                continue
            data = fn(obj)
            if isinstance(data, tuple):
                data = data[0]
            if isinstance(data, str):
                data = data.encode("utf-8") if ext == "svg" else binascii.a2b_base64(data)
            if data:
                return mime, bytes(data), ext
    except Exception:
        return None
    return None


def text_of(value):
    """A table for DataFrames, markdown where offered, else repr()."""
    module = type(value).__module__ or ""
    if module.startswith("pandas") and hasattr(value, "to_string"):
        for kwargs in ({"max_rows": 60, "max_cols": 20}, {"max_rows": 60}):
            try:
                return value.to_string(**kwargs)
            except TypeError:
                continue
            except Exception:
                break
    fn = getattr(type(value), "_repr_markdown_", None)
    if callable(fn):
        try:
            text = fn(value)
            if isinstance(text, tuple):
                text = text[0]
            if isinstance(text, str) and text:
                return text
        except Exception:
            pass
    return safe_repr(value)


def make_display(state):
    def display(*objs):
        """Show objects as a notebook would: images go back to the model, the rest is printed."""
        for obj in objs:
            rich = state.get("rich")
            if rich is None or not rich.show(obj):
                print(text_of(obj))
    return display


def run(code, namespace, rich=None, name="<python>", start=None):
    """Execute `code` as the source `name`; returns (status, repr or None, exception dict or None).
    `start` runs first: the call begins there."""
    if start is not None:
        try:
            start()
        except BaseException as e:  # a signal handler's exception is the call's
            return "runtime_error", None, describe(e)
    remember_source(name, code)
    try:
        tree = compile(code, name, "exec", _ast.PyCF_ONLY_AST)
        last = None
        if tree.body and isinstance(tree.body[-1], _ast.Expr):
            last = _ast.Expression(tree.body.pop().value)
        body = compile(tree, name, "exec")
        tail = compile(last, name, "eval") if last is not None else None
    except BaseException as e:
        return "runtime_error", None, describe(e)
    try:
        exec(body, namespace)
        value = eval(tail, namespace) if tail is not None else None
    except SandboxReadDenied as e:
        return "permission_needed", None, dict(describe(e), path=e.path, isDir=e.is_dir, secret=e.secret)
    except BaseException as e:
        return "runtime_error", None, describe(e)
    finally:
        if rich is not None:
            rich.collect_figures()
        flush_streams()
        # The code may have imported linecache (traceback, logging, ...).
        register_sources()
    if value is None:
        return "ok", None, None
    try:
        if rich is not None and rich.show(value):
            return "ok", None, None
        return "ok", text_of(value), None
    except BaseException as e:  # a display hook that raised, even SystemExit
        return "runtime_error", None, describe(e)


def flush_streams():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except BaseException:
            pass


# The interpreter's own writes reach the host in the order they were made:
# sys.stdout and sys.stderr write through (-u), and before a write to one
# of them follows a write to the other, the other's pipe is waited on until
# the host has read it (bounded: ORDER_WAIT per switch, and after one wait
# runs out no more waits until the next call). The host reads the two pipes
# in one loop, so what it read first was written first. Writes made around
# these objects (os.write, sys.stdout.buffer, subprocesses) arrive as they
# arrive.
ORDER_WAIT = 0.2
_order = {"last": None, "waits": True}
_fionread = []


def wait_read(fd):
    """Wait (bounded) until the host has read everything in `fd`'s pipe."""
    if not _fionread:
        try:
            import termios
            _fionread.append(termios.FIONREAD)
        except (ImportError, AttributeError):
            _fionread.append(0x541B)
        import fcntl
        _fionread.append(fcntl.ioctl)
    request, ioctl = _fionread
    buf = bytearray(4)
    deadline = None
    pause = 0.00005
    while True:
        try:
            ioctl(fd, request, buf)
        except (OSError, ValueError, TypeError):
            return  # not a pipe (the code moved it): nothing to wait on
        if buf == b"\0\0\0\0":
            return
        now = time.monotonic()
        if deadline is None:
            deadline = now + ORDER_WAIT
        elif now >= deadline:
            _order["waits"] = False
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.002)


def ordered(stream, fd):
    """`stream` (a TextIOWrapper) as one whose writes keep their order with
    those of the other standard stream."""
    base = type(stream)

    class Ordered(base):
        __slots__ = ()

        def write(self, text):
            last = _order["last"]
            if last != fd:
                if last is not None and _order["waits"]:
                    wait_read(last)
                _order["last"] = fd
            return base.write(self, text)

    return Ordered(stream.buffer, encoding=stream.encoding, errors=stream.errors,
                   line_buffering=stream.line_buffering, write_through=True)


def order_streams():
    """Install the ordered standard streams (sys.__stdout__ and
    sys.__stderr__ stay the interpreter's own)."""
    try:
        sys.stdout = ordered(sys.stdout, 1)
        sys.stderr = ordered(sys.stderr, 2)
    except (AttributeError, TypeError, ValueError):
        pass


def new_call_order():
    _order["last"] = None
    _order["waits"] = True


# What the copy runs is the worker's alone. Its fork is libc's fork(),
# not os.fork(): that one runs the os.register_at_fork hooks (the code's,
# and the standard library's: random reseeds itself in a child) in the
# interpreter and in the copy. The interpreter needs no after-fork work
# from Python either: no other Python thread exists (else no copy is made)
# and the forking thread keeps the GIL across the call. From before the
# fork until the call's code starts (resume()), the interpreter holds
# every signal and the collector is off, so that no handler, no
# gc.callbacks and no __del__ or weakref callback of the code runs between
# the copy and the call's start; the copy keeps both so through its
# takeover until its next call's code starts, imports nothing and flushes
# none of the code's streams. Audit hooks cannot be
# removed and run on the copy's own steps (os.kill, open): code that added
# one gets no rollback point. Nor does code that replaced a function or a
# constant the copy uses (os.kill, time.sleep, builtins.open, os.O_CLOEXEC,
# ...) or that the worker runs between the idle fork and the call
# (binascii.a2b_base64, a closure cell of its loads or dumps), bound at
# start, or
# that traces (sys.settrace, sys.setprofile, sys.monitoring): the tracer
# would run on the copy's own lines.
AUDIT_HOOKS = [False]  # set by the read hook when the code adds an audit hook
PAUSED = []  # (signal mask, collector was on) from the fork until resume()
PRISTINE = ()  # (module, name, value) as they were before any code ran
CODES = ()  # (function, code, defaults, keyword defaults) of PRISTINE's functions
CELLS = ()  # (function, cell, contents) of the closures among them
HELD = ()  # (the dict that holds it, name, value) for each of PRISTINE: the fast check
_fork = None
_ioctl = None  # fcntl.ioctl, as it was before any code ran
_madvise = _mincore = _resident = None  # see huge_pages()
PAGE = 4096
# The modules the copy uses, bound before any code ran: the copy imports
# nothing (an import consults the module's __spec__, which code can
# replace by one whose attributes run code).
# (The init's _fcntl too.)
_gc = _sig = _thr = None


def pristine():
    """Record what the copy will call, and build the raw fork. Runs in the
    interpreter before any code of the user does."""
    global PRISTINE, _fork, _fcntl, _gc, _sig, _thr, _ioctl
    import _ctypes
    import _signal
    import _thread
    import fcntl
    import gc

    class c_int(_ctypes._SimpleCData):
        _type_ = "i"

    class Fn(_ctypes.CFuncPtr):
        # PYTHONAPI: the GIL is not released around the call.
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_PYTHONAPI | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = c_int

    class Libc(object):
        _handle = _ctypes.dlopen(None, 2)

    _fork = Fn(("fork", Libc))
    _fcntl, _gc, _sig, _thr, _ioctl = fcntl, gc, _signal, _thread, fcntl.ioctl
    global _madvise, _mincore, _resident, PAGE

    class c_size(_ctypes._SimpleCData):
        _type_ = "L"

    class c_char(_ctypes._SimpleCData):
        _type_ = "c"

    PAGE = os.sysconf("SC_PAGE_SIZE")

    class Resident(_ctypes.Array):
        _type_ = c_char
        _length_ = HUGE_STEP // PAGE

    class Madvise(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = c_int
        _argtypes_ = (c_size, c_size, c_int)

    class Mincore(_ctypes.CFuncPtr):
        _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
        _restype_ = c_int
        _argtypes_ = (c_size, c_size, Resident)

    _madvise, _mincore, _resident = Madvise(("madvise", Libc)), Mincore(("mincore", Libc)), Resident()
    # The constants too: an int subclass in their place would run its
    # __or__, __eq__ or __hash__ in the copy.
    names = {
        os: ("close", "dup2", "fstat", "getpid", "kill", "listdir", "open", "pipe", "read", "write",
             "waitpid", "set_inheritable", "_exit", "O_RDONLY", "O_RDWR", "O_CLOEXEC", "WNOHANG"),
        _signal: ("pthread_sigmask", "sigpending", "signal", "sigwaitinfo", "SIGUSR1", "SIGKILL",
                  "SIG_IGN", "SIG_BLOCK", "SIG_SETMASK"),
        gc: ("enable", "disable", "isenabled"),
        _thread: ("_count",),
        fcntl: ("fcntl", "F_DUPFD_CLOEXEC"),
        time: ("sleep",),
        # Between the idle fork and the call's code each request's code is
        # decoded with it: in a restored interpreter, before its next call.
        binascii: ("a2b_base64",),
        sys: ("gettrace", "getprofile"),
        builtins: ("__import__", "open", "len", "isinstance", "range", "set", "list", "dict", "zip", "min",
                   "int", "str", "bytes", "memoryview", "all", "iter", "next", "Exception", "BaseException",
                   "OSError", "ValueError", "TypeError", "StopIteration", "ChildProcessError",
                   "ProcessLookupError", "ImportError"),
    }
    if hasattr(sys, "monitoring"):
        names[sys.monitoring] = ("get_tool",)
    # The worker's own functions, classes and modules too: code reaches
    # this module's globals through its frames (sys._getframe(1)).
    # Its data too, each value as it is now (the worker binds none of them
    # again but PREPARED, a bool, and these tables): a value in its place
    # whose type runs code (an int or tuple subclass with an operator of
    # its own) would run it in the copy.
    own = globals()
    PRISTINE = tuple((m, n, m.__dict__[n]) for m, ns in names.items() for n in ns) + tuple(
        (sys.modules, m.__name__, m) for m in names if sys.modules.get(m.__name__) is m) + tuple(
        (own, n, v) for n, v in list(own.items()) if n not in REBOUND)
    global CODES, CELLS, HELD
    CODES = tuple((f, f.__code__, f.__defaults__, f.__kwdefaults__)
                  for _, _, f in PRISTINE if type(f) is type(pristine))
    # A closure's cells are writable (loads reads the copy's resume
    # request through its cell's scanner; dumps encodes through its own).
    CELLS = tuple((f, c, c.cell_contents) for f, _, _, _ in CODES for c in f.__closure__ or ())
    # A module's __dict__ is the same dict for the module's life (the
    # attribute is read-only); sys.modules itself is looked up each time.
    HELD = tuple((None if m is sys.modules else m if type(m) is dict else m.__dict__, n, v) for m, n, v in PRISTINE)


# The worker's globals bound again after pristine(); and its containers
# that it fills as it runs, whose contents must stay plain data.
REBOUND = ("PRISTINE", "CODES", "CELLS", "HELD", "PREPARED")
FILLED = ("ALL_SIGNALS", "CONTROL_PICTURES", "PAUSED", "AUDIT_HOOKS", "SOURCE_BYTES", "KEEPER_FDS", "RESERVED",
          "STREAM_FDS", "NEXT_FDS", "NULL_ID", "HUGE_SEEN")
PLAIN = frozenset((int, str, bytes, float, bool, type(None)))
CONTAINERS = frozenset((tuple, list, set, frozenset, dict))


def plain(value, depth=3):
    """Whether `value` is data of the built-in types alone, which run no
    code of the user's when the copy compares, hashes or iterates them.
    (The types of a flat container are read in one pass of C.)"""
    t = type(value)
    if t in PLAIN:
        return True
    if depth == 0 or t not in CONTAINERS or len(value) > 256:
        return False
    for part in (value, value.values()) if t is dict else (value,):
        kinds = set(map(type, part))
        if not kinds <= PLAIN and not (kinds <= PLAIN | CONTAINERS and all(plain(v, depth - 1) for v in part)):
            return False
    return True


def replaced():
    """The names of PRISTINE that the code has changed since, and the
    functions among them whose code or defaults it changed."""
    ModuleType = type(sys)
    modules = sys.modules
    # The common case first, without building anything: nothing changed.
    own = globals()
    if all(f.__code__ is code and f.__defaults__ is defaults and f.__kwdefaults__ is kw
           for f, code, defaults, kw in CODES) and all(cell_is(c, v) for _, c, v in CELLS) and all(
            (modules.get(name) is value and type(value) is ModuleType) if held is None else held.get(name) is value
            for held, name, value in HELD) and (PREPARED is True or PREPARED is False) and all(
            plain(own.get(name)) for name in FILLED):
        return []
    out = ["%s (its code)" % f.__name__ for f, code, defaults, kw in CODES
           if f.__code__ is not code or f.__defaults__ is not defaults or f.__kwdefaults__ is not kw]
    out.extend("%s (its closure)" % f.__name__ for f, c, v in CELLS if not cell_is(c, v))
    for (holder, name, value), (held, _, _) in zip(PRISTINE, HELD):
        if held is None:
            if modules.get(name) is not value or type(value) is not ModuleType:
                out.append("sys.modules[%r]" % name)
        elif held.get(name) is not value:
            out.append("the worker's %s" % name if held is holder else "%s.%s" % (holder.__name__, name))
    if not (PREPARED is True or PREPARED is False):
        out.append("the worker's PREPARED")
    out.extend("the contents of the worker's %s" % name for name in FILLED if not plain(own.get(name)))
    return out


def cell_is(cell, value):
    """Whether closure cell `cell` holds `value` (the code can empty it)."""
    try:
        return cell.cell_contents is value
    except ValueError:
        return False


def resume():
    """The call's code starts: the signals and the collector the fork held
    are given back (a handler of a signal that came meanwhile runs now, as
    the call's first act: the rollback undoes it with the call)."""
    if PAUSED:
        mask, collect = PAUSED.pop()
        if collect:
            _gc.enable()
        _sig.pthread_sigmask(_sig.SIG_SETMASK, mask)


def checkpoint(idle=False):
    """Fork this interpreter's copy for rollback (`idle`: between calls,
    see huge_pages()). Returns (pid, None) in
    the interpreter (which then holds its signals and collector until
    resume()), (None, reason) when there is no rollback point, and
    ("restored", (nonce, point)) in the copy once the host has made it the
    interpreter (see took_over()): it still holds both, until its next
    call starts."""
    signal = _sig
    threading = sys.modules.get("threading")
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()] if threading else []
    count = _thr._count()
    if others or count:
        count = max(count, len(others))
        return None, "%d thread%s started by earlier calls %s running (%s)" % (
            count, "" if count == 1 else "s", "was" if count == 1 else "were",
            ", ".join(others[:4]) or "started with _thread")
    if AUDIT_HOOKS[0]:
        return None, "the code added an audit hook (sys.addaudithook), which would run in the copy"
    if sys.gettrace() is not None or sys.getprofile() is not None:
        return None, "the code set a trace or profile function (sys.settrace, sys.setprofile), which would run in the copy"
    monitoring = getattr(sys, "monitoring", None)  # 3.12+
    if monitoring is not None and any(monitoring.get_tool(i) is not None for i in range(6)):
        return None, "the code registered a sys.monitoring tool, which would run in the copy"
    if _fork is None:
        return None, "the copy's functions could not be recorded before the code ran"
    changed = replaced()
    if changed:
        return None, "the code replaced %s, which the copy would run" % ", ".join(changed[:4])
    if not all(reserved(fd) for fd in KEEPER_FDS):
        return None, "the code holds file descriptors 10-13, which a rollback needs"
    try:
        undumpable()  # again: code may have made this process dumpable
    except OSError as e:
        return None, "the interpreter could not be made private (%s)" % e
    # Born with every signal held and the collector off: a signal sent the
    # moment the copy exists must neither end it nor run a handler in it,
    # and no collection may call the code's gc.callbacks or finalizers
    # there. A restored interpreter before its first call holds both since
    # its own fork.
    held = bool(PAUSED)
    if idle and not held:
        huge_pages()  # after the checks: what it calls is what was recorded
    if held:
        mask, collect = PAUSED[-1]
    else:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, ALL_SIGNALS)
        collect = _gc.isenabled()
        _gc.disable()
    pid = _fork()
    if pid < 0:
        import _ctypes
        if not held:
            if collect:
                _gc.enable()
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        return None, "the interpreter could not be copied: %s" % os.strerror(_ctypes.get_errno())
    if pid:
        if not held:
            PAUSED.append((mask, collect))
        return pid, None
    # The copy: no channels until it is needed. It never returns into the
    # serve loop unless it became the interpreter, and then keeps its
    # signals held and its collector off until the next call's code starts
    # (resume()): until then it runs the worker's code alone.
    try:
        to_dev_null()
        while True:
            info = signal.sigwaitinfo({signal.SIGUSR1})
            if from_host(info):
                break
        kill_now()
        resumed = fresh_channels(lambda: kill_all() or os._exit(70))
        # Signals the failed call queued here are dropped, not delivered.
        for sig in signal.sigpending():
            handler = signal.signal(sig, signal.SIG_IGN)
            signal.signal(sig, handler)
        if not held:
            PAUSED.append((mask, collect))
    except BaseException:
        os._exit(70)
    return "restored", resumed


def call_streams(flush=True):
    """The call's output goes to the pipes prepare_streams made (the host
    holds their read ends by now). `flush` false: they were flushed right
    before the rollback copy was made."""
    global PREPARED
    new_call_order()
    if not PREPARED:
        return  # none were made: the call keeps the pipes it has
    if flush:
        flush_streams()
    os.dup2(NEXT_FDS[0], 1)
    os.dup2(NEXT_FDS[1], 2)
    reserve(STREAM_FDS + NEXT_FDS)
    PREPARED = False


def discard(pid):
    import _signal as signal  # signal.py imports enum: 4 ms
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def release(state):
    """End the last call's rollback copy: the host has its result (a
    broken frame that came before it still finds the copy), or a new call
    or the end of the channel came first."""
    pid = state.pop("copy", None)
    if pid:
        discard(pid)
        state.setdefault("discarded", []).append(pid)


def serve():
    state = {}
    try:
        serve_calls(state)
    finally:
        release(state)  # an interpreter that ends leaves no copy behind
        for kept in ("ahead", "held"):
            if state.get(kept):
                discard(state.pop(kept))


def serve_calls(state):
    namespace = {"__name__": "__main__", "__doc__": None, "__builtins__": builtins,
                 "display": make_display(state)}
    while True:
        try:
            request = read_request()
        except (ValueError, UnicodeDecodeError) as e:
            send({"type": "error", "id": None, "message": "bad request frame: %s" % e})
            continue
        if request is None:
            return
        kind = request.get("type")
        if kind == "release":
            release(state)
            continue
        if kind == "point":
            # The call is over and the model is thinking: the last call's
            # copy goes and the next call's rollback point is made now, off
            # its path (see ahead()).
            release(state)
            rich = value = exception = None
            restored = ahead(state)
            if restored is not None:
                took_over(state, restored)
            continue
        req_id = request.get("id")
        if kind != "exec" or not isinstance(req_id, int) or not isinstance(request.get("code"), str) \
                or not isinstance(request.get("mark"), str):
            send({"type": "error", "id": req_id if isinstance(req_id, int) else None,
                  "message": "unknown or invalid request: %s" % bound(repr(kind), 200)[0]})
            continue
        try:
            code = b64decode(request["code"]).decode("utf-8")
            mark = b64decode(request["mark"])
        except (ValueError, binascii.Error) as e:
            send({"type": "error", "id": req_id, "message": "exec code or mark is not base64 (UTF-8): %s" % e})
            continue
        release(state)
        # The host replaced the project's mount (a permission-mode change)
        # since this interpreter last heard: its working directory is on
        # the old tree, which shows nothing new; go to the new one.
        moved = request.get("moved", 0)
        if isinstance(moved, int) and moved > state.get("moved", 0):
            state["moved"] = moved
            try:
                os.chdir("/workspace")
            except OSError:
                pass
        copy = None
        made = state.pop("ahead", None)
        # The copy a refused read kept (the host did not return to it).
        held_copy = state.pop("held", None)
        if held_copy:
            discard(held_copy)
            state.setdefault("discarded", []).append(held_copy)
        left = []
        for pid in state.pop("discarded", []):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    left.append(pid)
            except OSError:
                pass
        if left:
            state["discarded"] = left
        # The last call's objects go now, not between the copy and this
        # call's start (their __del__ would run there).
        rich = value = exception = None
        # A restored interpreter holds its signals and collector until the
        # call's code starts, and runs no code of the user before: its
        # streams were flushed before its fork and have had no writes since.
        held = bool(PAUSED)
        if made and not (request.get("checkpoint") is True and _thr._count() == 0):
            discard(made)  # not wanted (or, impossibly, a thread runs): a copy of today's kind
            state.setdefault("discarded", []).append(made)
            made = None
        if made:
            copy, why = made, None
        elif request.get("checkpoint") is True and ALL_SIGNALS is not None:
            if not held:
                flush_streams()  # before the copy: the code's sys.stdout is the code's
            copy, why = checkpoint()
            if copy == "restored":
                took_over(state, why)
                continue
        else:
            why = None
        # The newest pid before the code runs: with a copy, the copy is
        # (it was forked last, and lives), and /proc/loadavg is not read.
        newest = copy or last_pid()
        call_streams(flush=not copy and not held)
        if not copy and why is None and request.get("checkpoint") is not True:
            pass  # no point was asked for: the begin frame would say nothing
        elif why is None:
            body = ('{"type":"begin","id":%d,"copy":%s,"why":null}' % (req_id, copy or "null")).encode()
            write_all(REPLY_FD, len(body).to_bytes(4, "big") + body)  # send(), without the JSON encoder
        else:
            send({"type": "begin", "id": req_id, "copy": None, "why": why})
        rich = state["rich"] = Rich(req_id)
        # Processes earlier executions left running are not waited for;
        # /proc is only read before the code when there were any.
        before = live_processes() if state.get("background") else set()
        try:
            status, value, exception = run(code, namespace, rich, source_name(req_id), resume)
        finally:
            state["rich"] = None
        text, truncated = (None, False) if value is None else bound(value, MAX_REPR, "both")
        # Only a call that made a process (the newest pid of the namespace
        # moved past this call's copy) or that has earlier ones to count
        # needs the walk of /proc.
        made = last_pid()
        if state.get("background") or made is None or newest is None or made != newest:
            live = live_processes() - set(state.get("discarded", ()))
        else:
            live = set()
        if copy:
            live.discard(copy)
        background = state["background"] = len(live)
        path = is_dir = secret = None
        if status == "permission_needed":
            path, is_dir = exception.pop("path"), exception.pop("isDir")
            secret = exception.pop("secret", False)
        result = {"type": "result", "id": req_id, "status": status, "repr": text,
                  "reprTruncated": truncated, "exception": exception, "background": background,
                  "path": bound(path, 4096)[0] if path else None, "pathIsDir": bool(is_dir),
                  "pathSecret": bool(secret),
                  "images": rich.images, "notes": [bound(n, 1024)[0] for n in rich.notes[:8]]}
        started = live - before
        if not started:
            # Nothing to wait for: the end marks first, then the result
            # carries them (one frame, one wake-up of the host, less).
            marked = end_streams(mark, started)
            if background:
                prepare_streams()
            result["drained"] = {"stdout": marked["stdout"], "stderr": marked["stderr"], "streams": PREPARED}
        send(result)
        if copy and status == "permission_needed":
            # A refused read: the host may grant it and run the call again
            # on this copy (the state before the call); the next call
            # discards it otherwise.
            state["held"] = copy
        elif copy:
            # Kept until the host has the result (release): a broken frame
            # the code wrote before it is still a failure of this call,
            # rolled back (and so is a result that could not be sent).
            # Killed then, not waited for: it is reaped before the next copy.
            state["copy"] = copy
        if not started:
            continue  # the result carried the end marks
        marked = end_streams(mark, started)
        if background:
            # Processes that may hold this call's pipes live on: the next
            # call gets pipes of its own (else it keeps these).
            prepare_streams()
        send({"type": "drained", "id": req_id, "stdout": marked["stdout"], "stderr": marked["stderr"],
              "streams": PREPARED})


def took_over(state, resumed):
    """This process is a rollback copy that the host has just made the
    interpreter; `resumed` is its resume request's (nonce, point). With
    `point` the next call's rollback point is made now, before the restored
    frame goes out, so that a call sent the moment the failed call's result
    arrives finds it waiting instead of waiting for the fork. Since this
    copy's fork only the worker's own code has run here, every signal held
    and the collector off, and so it stays until the next call's code
    starts (resume()): the new copy is the state that call starts from."""
    nonce, point = resumed
    while point:
        again = ahead(state)
        if again is None:
            break
        nonce, point = again  # this process is that copy, taken over in its turn
    prepare_streams()
    send({"type": "restored", "fresh": False, "streams": PREPARED, "nonce": nonce})


def ahead(state):
    """Fork the next call's rollback point while the interpreter is idle
    (the host asks once a call is over). From the fork until that call's
    code starts, every signal is held and the collector is off, and no
    thread runs (else no copy is made): only the worker's own code runs in
    the interpreter, so the copy stays exactly the state the call starts
    from. Returns the resume request's (nonce, point) when this process is
    the copy, restored."""
    if ALL_SIGNALS is None or state.get("ahead"):
        return None
    if not PAUSED:
        flush_streams()  # before the copy: the code's sys.stdout is the code's
    copy, why = checkpoint(idle=True)
    if copy == "restored":
        return why
    if copy:
        state["ahead"] = copy
        prefault()
    return None


# A large heap on transparent huge pages: a fork copies one page-table
# entry per 2 MiB of it instead of 512 (400 MiB: 200 entries, not
# 102,400), so its rollback point costs what a small heap's does. The C
# library would ask for them as it allocates (GLIBC_TUNABLES), but only
# after reading /sys, which the sandbox does not show; so the idle
# interpreter asks the kernel to collapse what is already there.
# Resident pages when the heap was last looked at; where a look that a
# request stopped goes on from.
HUGE_SEEN = [0, 0]
HUGE_GROWTH = 64 << 20  # bytes of growth that make it look again
HUGE_STEP = 16 << 20  # bytes collapsed at once (it cannot be interrupted)
HUGE_MIN = 4 << 20  # the smallest mapping looked at
# Pages a 2 MiB block may miss and still be collapsed (the collapse fills
# them: at most 64 KiB, 3%, more memory). The object allocator's arenas
# (1 MiB, pools of 16 KiB aligned in them) miss about 8 in every 512.
HUGE_HOLES = 16


def huge_pages():
    """Before the idle fork, when the interpreter's resident memory grew
    by HUGE_GROWTH since it last looked: ask the kernel to back its large
    anonymous mappings with huge pages (MADV_HUGEPAGE, then
    MADV_COLLAPSE), HUGE_STEP at a time, only the 2 MiB blocks resident
    but for HUGE_HOLES pages (a collapse fills a block's holes with
    memory), and stopping when a request waits (the next idle fork goes
    on from there).
    Physical memory alone changes: no object, and no code of the user's
    (system calls through functions bound before any code ran). Errors
    (no huge pages on this kernel, none free) leave the heap as it was."""
    if _madvise is None:
        return
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
        try:
            resident = int(os.read(fd, 256).split()[1])
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        return
    if resident < HUGE_SEEN[0]:
        HUGE_SEEN[0] = resident
    if resident < HUGE_SEEN[0] + HUGE_GROWTH // PAGE:
        return
    HUGE_SEEN[0] = resident
    try:
        fd = os.open("/proc/self/maps", os.O_RDONLY | os.O_CLOEXEC)
        try:
            chunks = []
            while True:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(fd)
    except OSError:
        return
    huge = 2 << 20
    for line in b"".join(chunks).splitlines():
        fields = line.split()
        # An anonymous private mapping (no path), or the C library's heap.
        if fields[1:2] != [b"rw-p"] or not (len(fields) == 5 or fields[5:] == [b"[heap]"]):
            continue
        try:
            start, end = (int(x, 16) for x in fields[0].split(b"-"))
        except ValueError:
            continue
        if end - start < HUGE_MIN:
            continue
        for at in range((start + huge - 1) & ~(huge - 1), end & ~(huge - 1), HUGE_STEP):
            if at < HUGE_SEEN[1]:
                continue  # done by an earlier look
            if waiting():
                HUGE_SEEN[0], HUGE_SEEN[1] = 0, at  # go on from here next time
                return
            size = min(HUGE_STEP, (end & ~(huge - 1)) - at)
            if _mincore(at, size, _resident) != 0:
                continue
            # The runs of 2 MiB blocks resident but for HUGE_HOLES pages at most.
            pages, block, run = _resident.raw, huge // PAGE, None
            for i in range(0, size // PAGE + 1, block):
                if i < size // PAGE and pages[i:i + block].count(b"\0") <= HUGE_HOLES:
                    run = i if run is None else run
                elif run is not None:
                    if _madvise(at + run * PAGE, (i - run) * PAGE, 14) == 0:  # MADV_HUGEPAGE
                        _madvise(at + run * PAGE, (i - run) * PAGE, 25)  # MADV_COLLAPSE (Linux 6.1)
                    run = None
    HUGE_SEEN[1] = 0


def waiting():
    """Whether a request is in the pipe (FIONREAD, 0x541B on x86-64 and
    arm64, through the ioctl bound before any code ran, with an immutable
    buffer)."""
    try:
        return _ioctl(REQUEST_FD, 0x541B, b"\0\0\0\0") != b"\0\0\0\0"
    except Exception:
        return False


# The worker's own compile and exec, taken before any code of the user's ran
# (pristine() records them with the rest of its globals).
_compile, _exec = compile, exec
PREFAULT_FRAME = '{"type":"exec","id":1,"code":"eCA9IDE=","mark":"eA==","checkpoint":true}'


def prefault():
    """Right after the idle fork, while the model thinks (and in a fresh
    interpreter PID 1 made, while the processes it replaces end), write
    once to the pages a small call writes (a request decoded, the newest pid read
    from /proc/loadavg, a statement compiled and run, a repr bounded, a
    result encoded), so that the call copies fewer of them on its path.
    Runs no code of the user's: only what the serve loop itself runs for
    every call, through the worker's own references (checked with the
    rest before the fork), on constants, in a namespace of its own."""
    try:
        request = loads(PREFAULT_FRAME)
        last_pid()
        _exec(_compile("x = 1", "<prefault>", "exec"), {"__builtins__": builtins})
        text, truncated = bound("1", MAX_REPR, "both")
        dumps({"type": "result", "id": request["id"], "status": "ok", "repr": text, "reprTruncated": truncated,
               "exception": None, "background": 0, "path": None, "pathIsDir": False, "pathSecret": False,
               "images": [], "notes": [], "drained": {"stdout": True, "stderr": True, "streams": False}})
    except Exception:
        pass  # only a speed-up: a call then copies these pages itself


def send_code():
    """Send this module, compiled, as a .pyc image (magic number, zero flags
    and source stamp, then the marshalled code), so that later sandboxes
    can skip compiling it. Runs before any site directory is read."""
    import marshal
    bootstrap = sys.modules.get("_frozen_importlib_external")
    magic = getattr(bootstrap, "MAGIC_NUMBER", None)
    if not isinstance(magic, bytes) or len(magic) != 4:
        return
    image = magic + bytes(12) + marshal.dumps(MODULE_CODE)
    text = binascii.b2a_base64(image, newline=False).decode("ascii")
    piece = MAX_FRAME - 64  # each piece in a frame of its own
    for at in range(0, len(text), piece):
        send({"type": "code", "pyc": text[at:at + piece], "more": at + piece < len(text)})


def set_limits(spec):
    """Take the host's bounds: `name=value,...` (unknown names are refused,
    so that a host and a worker of different versions cannot disagree)."""
    global MAX_FRAME, MAX_REPR, MAX_MESSAGE, MAX_TRACEBACK, DRAIN_CAP, MAX_IMAGES, MAX_IMAGE_BYTES, MAX_IMAGES_TOTAL
    values = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
    known = {"frame", "repr", "message", "traceback", "drain_ms", "images", "image_bytes", "images_total"}
    unknown = set(values) - known
    if unknown:
        raise ValueError("unknown limits from the host: %s" % ", ".join(sorted(unknown)))
    MAX_FRAME = int(values.get("frame", MAX_FRAME))
    MAX_REPR = int(values.get("repr", MAX_REPR))
    MAX_MESSAGE = int(values.get("message", MAX_MESSAGE))
    MAX_TRACEBACK = int(values.get("traceback", MAX_TRACEBACK))
    DRAIN_CAP = int(values.get("drain_ms", DRAIN_CAP * 1000)) / 1000.0
    MAX_IMAGES = int(values.get("images", MAX_IMAGES))
    MAX_IMAGE_BYTES = int(values.get("image_bytes", MAX_IMAGE_BYTES))
    MAX_IMAGES_TOTAL = int(values.get("images_total", MAX_IMAGES_TOTAL))


def main():
    # Non-dumpable before anything else, so PID 1, the interpreter and
    # every rollback copy (forks keep it) are from before the first call's
    # code; the tool's descriptor numbers reserved (see the init).
    prepare_process()
    limits = [sys.argv[i + 1] for i in range(1, len(sys.argv) - 1) if sys.argv[i] == "--limits"]
    if limits:
        set_limits(limits[0])
    if "--emit-code" in sys.argv[1:]:
        send_code()
    site_dirs = [sys.argv[i + 1] for i in range(1, len(sys.argv) - 1) if sys.argv[i] == "--site"]
    # The task cap is the host's: it sets it on the held sandbox before
    # this process exists (see spawn.rs), so every process here has it.
    nofile = [int(sys.argv[i + 1]) for i in range(1, len(sys.argv) - 1) if sys.argv[i] == "--nofile"]
    if nofile:
        limit_files(nofile[0])
    site_notes = setup_site(site_dirs) if site_dirs else []
    # bwrap exports PWD after --chdir; the environment is PATH, HOME,
    # TMPDIR and LANG only.
    os.environ.pop("PWD", None)
    masks = [sys.argv[i + 1] for i in range(1, len(sys.argv) - 1) if sys.argv[i] == "--masks"]
    install_read_hook(loads(masks[0]) if masks else ())
    watch_linecache()
    order_streams()
    ready = {"type": "ready", "protocol": PROTOCOL,
             "runtimeVersion": "%d.%d.%d" % tuple(sys.version_info[:3]),
             "siteNotes": [bound(n, 1024)[0] for n in site_notes[:16]]}
    if "--keeper" in sys.argv[1:]:
        # The first interpreter exists before the ready frame does, so that
        # the host finds it as PID 1's child. pristine() runs before the
        # keeper forks: its fresh interpreters have it too.
        start_keeper(serve, pristine, prefault)
        prepare_streams()
        ready["streams"] = PREPARED
        send(ready)
        serve()
    prepare_streams()
    ready["streams"] = PREPARED
    send(ready)
    serve()


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:
        os._exit(0)
