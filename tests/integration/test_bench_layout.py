"""bench/'s layering (issue 23): the entry script composes the experiment modules' tables, no module imports
it back, every name a module uses is defined in it, and both ways of asking for help list the same experiments.
Reads the sources; runs nothing but `--help`."""
import ast
import builtins
import re
import subprocess
import symtable
import sys

from conftest import BIN, REPO

BENCH = REPO / "bench"
ENTRY = "slotstream_bench"
# Every experiment `slotstream bench` offers, in its --help order (issue 23 moved them into tables; the list
# is the one before the move, issue 25's two after it and its sipscale, and zero_copy since).
EXPERIMENTS = ["sync_latency", "latency", "throughput", "cpu", "resources", "held_block", "idle", "cameras", "cache",
               "fan_in", "message_rate", "small_messages", "progress", "datagram", "loss", "apps", "shimloss",
               "shimperf", "sipscale", "zero_copy"]


def modules():
    return sorted(BENCH.glob("*.py"))


def imported(path):
    """The top-level names of every module `path` imports, wherever the import statement is (a function's
    lazy import counts)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_no_bench_module_imports_the_entry_script():
    # Run as __main__, an import of slotstream_bench loads a second copy whose settings (RDMA) main() never set.
    offenders = [p.name for p in modules() if ENTRY in imported(p)]
    assert offenders == []
    # Nor does a module hand itself to another (plot.py did, to dgram_plot, for its helpers: plot_common's now).
    assert [p.name for p in modules() if "sys.modules[__name__]" in p.read_text()] == []


def test_the_shared_modules_import_only_what_is_below_them():
    local = {p.stem for p in modules()}
    below = {"harness.py": set(), "report_cells.py": set(), "plot_common.py": {"report_cells"}}
    for shared, allowed in below.items():
        assert imported(BENCH / shared) & local <= allowed, shared


def test_no_two_bench_modules_import_each_other():
    # dgram_plot and shim_plot did (a deferred import dodged the cycle): a cycle among the modules is a layering
    # mistake even where Python tolerates it.
    local = {p.stem for p in modules()}
    graph = {p.stem: imported(p) & local for p in modules()}
    cycles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    cycles.append(path)
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    assert cycles == []


def test_measuring_needs_no_matplotlib():
    # A machine without python3-matplotlib still measures (plot.py then says what is missing).
    code = ("import sys; sys.path.insert(0, %r); import builtins; real = builtins.__import__\n"
            "def guard(name, *a, **k):\n"
            "    if name.split('.')[0] == 'matplotlib': raise ImportError('no matplotlib here')\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = guard; import %s" % (str(BENCH), ENTRY))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr


def test_the_parser_catches_a_missing_import():
    bad = "import json\n\ndef f():\n    return sb.run_pair(json.dumps(1))\n"
    assert undefined_globals(bad, "bad.py") == {"sb"}


def undefined_globals(source, name):
    """Names that functions of a module read as globals but that the module never defines, imports or gets
    from builtins (a leftover `sb.` after a merge would only fail when its line runs)."""
    top = symtable.symtable(source, name, "exec")
    defined = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    defined |= set(dir(builtins)) | {"__file__", "__name__", "__doc__"}
    missing, stack = set(), [top]
    while stack:
        table = stack.pop()
        stack += table.get_children()
        for s in table.get_symbols():
            if s.is_referenced() and (table is top or s.is_global()) and s.get_name() not in defined:
                missing.add(s.get_name())
    return missing


def test_every_global_a_bench_module_uses_is_defined():
    found = {p.name: undefined_globals(p.read_text(), p.name) for p in modules()}
    assert {k: v for k, v in found.items() if v} == {}


def listed(help_text):
    """The experiment names of a --help's epilog, in order."""
    epilog = help_text.split("experiments:\n", 1)[1]
    return [m.group(1) for m in re.finditer(r"^  (\w+)\s", epilog, re.M) if m.group(1) != "all"]


def test_both_helps_list_the_same_experiments_as_before():
    cli = subprocess.run([BIN, "bench", "--help"], capture_output=True, text=True, timeout=30)
    script = subprocess.run([sys.executable, str(BENCH / f"{ENTRY}.py"), "--help"], capture_output=True, text=True,
                            timeout=30)
    assert cli.returncode == 0 and script.returncode == 0, cli.stderr + script.stderr
    assert listed(cli.stdout) == EXPERIMENTS
    assert listed(script.stdout) == EXPERIMENTS
    assert cli.stdout == script.stdout
