# The in-sandbox init of pi-python-sandbox: standard library only, and
# nothing of the payload it runs (no user code, no audit hook, no repr).
#
# It is the sandbox's PID 1 (with --keeper): it reaps every process, tells
# the host how each ended, and on the host's word kills every other process,
# empties the temporary file systems and starts the payload's loop afresh in
# a new process. The pieces every payload process shares live here too: the
# frame I/O (a big-endian u32 length, then that many bytes of UTF-8 JSON;
# requests on fd 3, replies on fd 4), the reserved descriptor numbers, the
# fresh channels and output pipes, the end marks, the kill and the open-files
# limit. The task cap is the host's: it sets RLIMIT_NPROC on the held
# sandbox before this process exists (see spawn.rs).
#
# The addon ships this file and the python worker (worker.py) as one file,
# this text first: the worker calls these functions, and the rollback copy
# checks them with its own (pristine()). Syntax stays at the level of old
# Pythons, so that an interpreter that is too old reports so.
import os
import time

REQUEST_FD = 3
REPLY_FD = 4
# The host's bounds: it passes them with --limits (the payload takes
# them); these values only serve until then.
MAX_FRAME = 128 * 1024
DRAIN_CAP = 1.0
# The module high_dup uses, bound before any code ran (see pristine() in
# worker.py); None until then.
_fcntl = None


def write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _json_codec():
    """(dumps, loads) for compact UTF-8 JSON.

    The json package imports re and compiles its patterns, about a third of
    the interpreter's start-up; its C core (_json) does the same work
    without them. Checked with a round trip; the json package otherwise.
    """
    try:
        import _json

        class Context(object):
            strict = True
            object_hook = None
            object_pairs_hook = None
            parse_float = float
            parse_int = int
            parse_constant = float

        scan = _json.make_scanner(Context())

        def loads(text):
            try:
                value, end = scan(text, 0)
            except StopIteration:
                raise ValueError("not a JSON document")
            if text[end:].strip():
                raise ValueError("extra data after the JSON document")
            return value

        def refuse(obj):
            raise TypeError("%s is not JSON serializable" % type(obj).__name__)

        encode = _json.make_encoder(None, refuse, _json.encode_basestring, None, ":", ",", False, False, False)

        def dumps(value):
            return "".join(encode(value, 0))

        sample = {"a": [1, None, True, "\u00e9\n\"\\", 2.5], "b": {}}
        if loads(dumps(sample)) == sample and dumps("\u00e9") == '"\u00e9"':
            return dumps, loads
    except Exception:
        pass
    import json
    return (lambda v: json.dumps(v, ensure_ascii=False, separators=(",", ":")), json.loads)


dumps, loads = _json_codec()


def send(message):
    body = dumps(message).encode("utf-8")
    if len(body) > MAX_FRAME:
        raise ValueError("reply of %d bytes exceeds the frame limit" % len(body))
    write_all(REPLY_FD, len(body).to_bytes(4, "big") + body)


def read_exact(n):
    chunks = []
    while n:
        chunk = os.read(REQUEST_FD, min(n, 65536))
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_request():
    """The next request object, or None at EOF. Raises ValueError on a bad frame."""
    header = read_exact(4)
    if header is None:
        return None
    length = int.from_bytes(header, "big")
    if length == 0 or length > MAX_FRAME:
        raise ValueError("request frame of %d bytes is outside 1..%d" % (length, MAX_FRAME))
    body = read_exact(length)
    if body is None:
        return None
    request = loads(body.decode("utf-8"))
    if not isinstance(request, dict):
        raise ValueError("request frame is not a JSON object")
    return request


def last_pid():
    """The newest pid of this pid namespace (the kernel writes it last in
    /proc/loadavg), or None. Read through os: a file object costs six
    more system calls (fstat twice, the tty check, two seeks), and this runs
    twice on every call's path."""
    try:
        fd = os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return int(os.read(fd, 256).rsplit(None, 1)[-1])
    except (OSError, ValueError, IndexError):
        return None
    finally:
        os.close(fd)


def live_processes():
    """Pids of the processes in the sandbox other than its init (pid 1) and
    this worker. Each stat is read through os (three system calls; a file
    object costs five more): PID 1 and a restored copy poll this while the
    processes a reset or a rollback killed end."""
    me = os.getpid()
    live = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return live
    for entry in entries:
        if not entry.isdigit() or int(entry) in (1, me):
            continue
        try:
            fd = os.open("/proc/%s/stat" % entry, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            stat = os.read(fd, 4096)
        except OSError:
            continue
        finally:
            os.close(fd)
        state = stat[stat.rfind(b")") + 2:][:1]
        if state not in (b"Z", b"X"):
            live.add(int(entry))
    return live


def end_streams(mark, started):
    """Wait (bounded) for the processes this execution started, then write
    the end mark (the host's bytes) on both streams."""
    if started:
        deadline = time.monotonic() + DRAIN_CAP
        while time.monotonic() < deadline and started & live_processes():
            time.sleep(0.01)
    marked = {}
    for name, fd in (("stdout", 1), ("stderr", 2)):
        try:
            write_all(fd, mark)
            marked[name] = True
        except OSError:
            marked[name] = False
    return marked


# Rollback (see the README): with --keeper this process is the sandbox's
# PID 1. It never runs user code; it reaps, and on the host's word it kills
# every other process and forks a fresh interpreter. Before each execution
# the interpreter forks a checkpoint, a frozen copy of itself; when the call
# fails, the host tells the checkpoint to kill every other process and to
# carry on as the interpreter. Every process here is non-dumpable, so that
# no other process of the sandbox can read or write a checkpoint's memory.
# Only signals the host sends count: those from inside the sandbox carry
# the sender's pid, the host's carry none (it is outside the namespace).
KEEPER_FDS = (10, 11, 12, 13)  # the host takes these ends with pidfd_getfd
ALL_SIGNALS = None
_prctl = None


def undumpable():
    """PR_SET_DUMPABLE 0, through _ctypes alone (ctypes costs 3 ms more)."""
    global _prctl
    if _prctl is None:
        import _ctypes

        class c_int(_ctypes._SimpleCData):
            _type_ = "i"

        class Fn(_ctypes.CFuncPtr):
            _flags_ = _ctypes.FUNCFLAG_CDECL
            _restype_ = c_int

        class Libc(object):
            _handle = _ctypes.dlopen(None, 2)

        _prctl = Fn(("prctl", Libc))
    if _prctl(4, 0, 0, 0, 0) != 0:
        raise OSError("prctl(PR_SET_DUMPABLE) failed")


def from_host(info):
    return info.si_code == 0 and info.si_pid == 0  # SI_USER, from outside


# PID 1 tells the host how each process it reaps ended (the interpreter's
# exit code or signal is the cause of its death): 8-byte records (pid,
# wait status) in a pipe whose read end waits at DEATHS_FD for the host to
# take it with pidfd_getfd. Only PID 1 holds the write end; no process it
# forks keeps either end.
DEATHS_FD = 18
DEATHS = None  # PID 1's write end


def reap():
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if DEATHS is not None:
            record_death(pid, status)


def record_death(pid, status):
    """One record for the host; when it has not read for long, the oldest
    make room (reads of 4096 bytes keep the 8-byte records whole)."""
    record = pid.to_bytes(4, "little") + (status & 0xFFFFFFFF).to_bytes(4, "little")
    for _ in range(2):
        try:
            os.write(DEATHS, record)
            return
        except BlockingIOError:
            try:
                os.read(DEATHS_FD, 4096)
            except OSError:
                return
        except OSError:
            return


def open_deaths():
    """PID 1's record of deaths (see DEATHS_FD)."""
    global DEATHS
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    os.dup2(r, DEATHS_FD, inheritable=False)
    os.close(r)
    DEATHS = high_dup(w)


def close_deaths():
    """In a process PID 1 forked: neither end of the record."""
    global DEATHS
    for fd in (DEATHS_FD, DEATHS):
        try:
            os.close(fd)
        except (OSError, TypeError):
            pass
    DEATHS = None


def kill_now():
    """Signal every process of the sandbox but PID 1 and this one. kill(-1)
    reaches each process atomically: a process being forked either gets
    the signal or its parent can no longer fork."""
    try:
        os.kill(-1, 9)
    except ProcessLookupError:
        pass


def kill_all(keep=()):
    """Kill every process of the sandbox but PID 1 and this one, and wait
    until they have ended; the processes in `keep` (PID 1's new
    interpreter, forked after the kill) are left alone."""
    for _ in range(5000):
        if not keep:
            kill_now()
        if os.getpid() == 1:
            reap()
        if not live_processes() - set(keep):
            return True
        time.sleep(0.0002)
    return False


def high_dup(fd):
    # The module bound before any code ran (the rollback copy imports
    # nothing); without rollback there is no copy, and no binding.
    f = _fcntl
    if f is None:
        import fcntl as f
    new = f.fcntl(fd, f.F_DUPFD_CLOEXEC, 32)
    os.close(fd)
    return new


def fresh_channels(settle):
    """New pipes for the frames and both streams, so that nothing a killed
    process left in the old ones reaches the host. Ours go to 1-4; the
    host's ends wait at 10-13 (13 last) until the host has taken them.
    `settle` runs while the host takes them (the killed processes end).
    Returns the resume request's nonce, and whether it asks a restored
    copy to make the next call's rollback point before it answers."""
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    fds = [high_dup(fd) for fd in (req_r, rep_w, out_w, err_w, req_w, rep_r, out_r, err_r)]
    for fd, target in zip(fds, (REQUEST_FD, REPLY_FD, 1, 2) + KEEPER_FDS):
        os.dup2(fd, target, inheritable=target in (1, 2))
        os.close(fd)
    settle()
    request = read_request()
    reserve(KEEPER_FDS)
    if not isinstance(request, dict) or request.get("type") != "resume" or not isinstance(request.get("nonce"), str):
        raise ValueError("the host did not resume the interpreter")
    return request["nonce"], request.get("point") is True


RESERVED = tuple(range(10, 18))  # 10-13 fresh channels, 14-17 a call's output pipes
NULL_ID = None  # (st_dev, st_ino, st_rdev) of /dev/null


def reserve(fds):
    """Point `fds` at /dev/null: numbers the code's own files never get,
    so that what sits there is always the tool's."""
    null = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
    for fd in fds:
        os.dup2(null, fd, inheritable=False)
    os.close(null)


def reserved(fd):
    """Whether `fd` is still one of the tool's /dev/null placeholders."""
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino, st.st_rdev) == NULL_ID


def to_dev_null():
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    for fd in (REQUEST_FD, REPLY_FD):
        try:
            os.close(fd)
        except OSError:
            pass


def keeper(seed, serve, warm):
    """PID 1's loop (see above), once start_keeper() has forked the first
    interpreter; `seed` is what /tmp held before any code ran; a fresh
    interpreter runs `serve`, the payload's loop, and first `warm` while
    the others end (the payload's own code on constants: it writes the
    pages a first call would, so that the call does not copy them from this
    process on its path)."""
    import _signal as signal  # signal.py imports enum: 4 ms
    to_dev_null()
    wanted = {signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2}
    while True:
        info = signal.sigwaitinfo(wanted)
        if info.si_signo == signal.SIGCHLD or not from_host(info):
            reap()
            continue
        # SIGUSR2: a reset (the temporary file systems are emptied, as a
        # new sandbox would have them); SIGUSR1: the first execution
        # failed, and a fresh interpreter is where it was.
        # Every process ends (none can fork once the signal is pending);
        # the new interpreter is made meanwhile and waits until they are
        # gone and the temporary file systems are empty.
        kill_now()
        done_r, done_w = (high_dup(fd) for fd in os.pipe())  # clear of the fds fresh_channels places
        child = os.fork()
        if child == 0:
            os.close(done_w)
            close_deaths()
            signal.pthread_sigmask(signal.SIG_SETMASK, set())
            nonce, _ = fresh_channels(lambda: warm() or os.read(done_r, 1))
            os.close(done_r)
            prepare_streams()
            send({"type": "restored", "fresh": True, "streams": PREPARED, "nonce": nonce})
            serve()
            os._exit(0)
        os.close(done_r)
        kill_all(keep={child})
        if info.si_signo == signal.SIGUSR2:
            for top in ("/tmp", "/dev/shm"):
                empty_dir(top)
            replant(seed)
        os.write(done_w, b"1")
        os.close(done_w)


def tmp_seed(top):
    """What bubblewrap made in `top` before any code ran (the project's
    host path as a link to /workspace, and the directories above it, when
    the project is under /tmp): what a new sandbox has there, for a reset
    to make again. Directories come before what is in them; at most 64."""
    seed, stack = [], [top]
    while stack and len(seed) < 64:
        path = stack.pop()
        try:
            entries = list(os.scandir(path))
        except OSError:
            continue
        for entry in entries[:64]:
            try:
                if entry.is_symlink():
                    seed.append((entry.path, os.readlink(entry.path)))
                elif entry.is_dir(follow_symlinks=False):
                    seed.append((entry.path, None))
                    stack.append(entry.path)
            except OSError:
                pass
    return seed[:64]


def replant(seed):
    """Make the directories and links of `seed` again (see tmp_seed)."""
    for path, target in seed:
        try:
            if target is None:
                os.mkdir(path, 0o755)
            else:
                os.symlink(target, path)
        except OSError:
            pass


def empty_dir(top):
    """Remove everything in `top`, never following a link, depth-first
    without recursion (no other process runs any more: nothing can change
    the tree meanwhile)."""
    stack = [(top, None)]
    while stack:
        path, entries = stack.pop()
        if entries is None:
            try:
                entries = list(os.scandir(path))
            except OSError:
                continue
        while entries:
            entry = entries.pop()
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append((path, entries))
                    stack.append((entry.path, None))
                    break
                os.unlink(entry.path)
            except OSError:
                pass
        else:
            if path != top:
                try:
                    os.rmdir(path)
                except OSError:
                    pass


STREAM_FDS = (14, 15)  # the next call's read ends: the host takes them (pidfd_getfd)
NEXT_FDS = (16, 17)  # and their write ends, 1 and 2 once the call begins
PREPARED = False  # 14-17 hold them (else those numbers may be the code's own files)


def prepare_streams():
    """Fresh stdout and stderr pipes for the next call, so that output of
    processes that earlier calls started (they keep the old pipes) never
    reaches its result. They are made while this interpreter is idle and
    alive, before the host sends the call: the host takes the read ends
    from 14 and 15 first, when the frame that ends the idle state says
    they are there. Where they cannot be made (no free descriptor, or the
    code holds those numbers), the next call keeps the pipes it has."""
    global PREPARED
    made = []
    try:
        for _ in range(2):
            made.extend(os.pipe())
        fds = [high_dup(fd) for fd in made]
    except OSError:
        for fd in made:
            try:
                os.close(fd)
            except OSError:
                pass
        return
    if not PREPARED and not all(reserved(fd) for fd in STREAM_FDS + NEXT_FDS):
        # Ours must never land on the code's own files.
        for mine in fds:
            os.close(mine)
        return
    out_r, out_w, err_r, err_w = fds
    for fd, target in zip((out_r, err_r, out_w, err_w), STREAM_FDS + NEXT_FDS):
        os.dup2(fd, target, inheritable=False)
        os.close(fd)
    PREPARED = True


def prepare_process():
    """What every sandbox starts with, before anything else: no other
    process of the sandbox may open this one's descriptors or memory
    through /proc, so it is made non-dumpable first (PID 1, the payload
    and every copy of it fork from here, and the filter refuses making any
    process dumpable again; a program a child execs is dumpable and holds
    none of the channels: every one of them is close-on-exec). Without
    this the sandbox does not start. Then the tool's descriptor numbers
    are reserved."""
    global NULL_ID
    undumpable()
    for fd in (REQUEST_FD, REPLY_FD):
        os.set_inheritable(fd, False)
    st = os.stat("/dev/null")
    NULL_ID = (st.st_dev, st.st_ino, st.st_rdev)
    reserve(RESERVED)


def limit_files(nofile):
    """bubblewrap needed more open files for its mount fds; everything
    from here on gets the sandbox's own limit."""
    import resource
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))


def start_keeper(serve, before_fork, warm):
    """Become PID 1's keeper (see keeper()): the first payload process is
    forked now and runs on in the caller; this process never returns.
    `before_fork` runs first (what the keeper's fresh processes must have
    too); `serve` is the payload's loop a fresh process runs, after `warm`.
    What PID 1 must have done before any code runs is done before the
    fork, so that the first call never waits for PID 1 to be scheduled."""
    import _signal as signal  # signal.py imports enum: 4 ms
    global ALL_SIGNALS
    ALL_SIGNALS = set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2})
    before_fork()
    # PID 1 gets only the signals it has a handler for from inside the
    # namespace: Python's SIGINT handler would let any process end it.
    handler = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    open_deaths()
    seed = tmp_seed("/tmp")  # what /tmp holds before any code runs
    if os.fork():
        keeper(seed, serve, warm)
    close_deaths()
    signal.signal(signal.SIGINT, handler)  # the interpreter's own, as before the fork
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
