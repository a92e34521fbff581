"""What the in-sandbox init (src/worker/init.py) knows of the python worker
that runs on it: nothing. Reads the init's text, a NUL, then the worker's
on stdin; prints {"problems": [...], "defines": [...], "imports": [...]}.

The init reads only names it defines, builtins and the modules it imports;
it runs no code and makes no value's text (no exec, compile, repr, ...),
imports none of the interpreter's code machinery and sets no hook on the
interpreter. The worker, shipped after it in one file, defines none of the
init's names again and sets only the ones it owns the value of.
"""
import ast
import builtins
import json
import symtable
import sys

# REPL knowledge: running code, its values' text, hooks on the interpreter.
NAMES = {"exec", "eval", "compile", "repr", "ascii", "breakpoint", "__import__", "globals", "locals", "vars",
         "input", "help"}
MODULES = {"builtins", "marshal", "linecache", "traceback", "ast", "_ast", "code", "codeop", "importlib",
           "runpy", "pickle", "inspect", "dis", "pdb", "site"}
ATTRIBUTES = {"addaudithook", "audit", "settrace", "setprofile", "displayhook", "excepthook", "_getframe",
              "monitoring", "ps1", "ps2"}
# What the worker may set in the init: the host's bounds and whether the
# next call's pipes are made.
WRITES = {"MAX_FRAME", "DRAIN_CAP", "PREPARED", "_fcntl"}


def scopes(table):
    yield table
    for child in table.get_children():
        yield from scopes(child)


def check(init, worker):
    problems = []
    top = symtable.symtable(init, "init.py", "exec")
    own = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    imports = {s.get_name() for s in top.get_symbols() if s.is_imported()}
    for table in scopes(top):
        for s in table.get_symbols():
            name = s.get_name()
            outside = table is top or s.is_global()
            if outside and s.is_referenced() and name not in own and not hasattr(builtins, name):
                problems.append("init.py reads %s, which it does not define (in %s)" % (name, table.get_name()))
            if outside and s.is_referenced() and name in NAMES:
                problems.append("init.py uses %s (in %s)" % (name, table.get_name()))
    for node in ast.walk(ast.parse(init)):
        if isinstance(node, ast.Import):
            found = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found = [(node.module or "").split(".")[0]]
        else:
            found = []
        problems.extend("init.py imports %s" % m for m in found if m in MODULES)
        if isinstance(node, ast.Attribute) and node.attr in ATTRIBUTES:
            problems.append("init.py uses .%s" % node.attr)
    wtop = symtable.symtable(worker, "worker.py", "exec")
    for s in wtop.get_symbols():
        name = s.get_name()
        if name in own and name not in imports and (s.is_assigned() or s.is_namespace() or s.is_imported()):
            problems.append("worker.py defines %s again" % name)
    for table in scopes(wtop):
        if table is wtop:
            continue
        for s in table.get_symbols():
            name = s.get_name()
            if s.is_declared_global() and s.is_assigned() and name in own and name not in WRITES:
                problems.append("worker.py's %s sets the init's %s" % (table.get_name(), name))
    return {"problems": problems, "defines": sorted(own - imports), "imports": sorted(imports)}


if __name__ == "__main__":
    init, worker = sys.stdin.read().split("\0")
    print(json.dumps(check(init, worker)))
