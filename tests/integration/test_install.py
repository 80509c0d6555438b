"""An installed slotstream (`cmake --install build --prefix P`) is usable without the source tree: a program
outside the tree builds against it with find_package and with pkg-config and streams to the installed
`slotstream recv`; the installed `slotstream bench` finds its orchestrator; the prefix can be moved."""
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess

import pytest

from conftest import BIN, REPO, TRANSPORTS, Receiver, parse_finished, seq_name

BUILD = pathlib.Path(BIN).resolve().parent
CONSUMER = REPO / "tests" / "install" / "consumer"


def run(argv, timeout=300, **kw):
    p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kw)
    assert p.returncode == 0, f"{' '.join(map(str, argv))} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    if not (BUILD / "CMakeCache.txt").exists():
        pytest.fail(f"{BUILD} is not a CMake build directory (SLOTSTREAM_BIN={BIN}); build with scripts/build.sh")
    p = tmp_path_factory.mktemp("install") / "prefix"  # outside the source tree
    run(["cmake", "--install", BUILD, "--prefix", p])
    return p


def elf_dynamic(path):
    return run(["readelf", "-d", path]).stdout


def test_installed_layout(prefix):
    for rel in ["bin/slotstream", "include/slotstream/slotstream.h", "include/slotstream/status.h",
                "lib/cmake/slotstream/slotstreamConfig.cmake", "lib/cmake/slotstream/slotstreamConfigVersion.cmake",
                "lib/cmake/slotstream/slotstreamTargets.cmake", "lib/pkgconfig/slotstream.pc",
                "share/slotstream/bench/slotstream_bench.py", "share/slotstream/bench/plot.py",
                "share/slotstream/bench/dgram_experiments.py", "share/slotstream/bench/dgram_plot.py",
                "share/slotstream/workers/checksum.sh", "share/slotstream/workers/h264.sh",
                "share/slotstream/examples/hello_stream.cc", "share/slotstream/examples/python/camera_sender.py",
                "share/man/man1/slotstream.1", "share/bash-completion/completions/slotstream",
                "share/zsh/site-functions/_slotstream", "lib/systemd/system/slotstream-recv.service",
                "share/slotstream/recv.toml"]:
        assert (prefix / rel).exists(), rel
    for module in (REPO / "bench").glob("*.py"):  # the entry script imports the experiment modules and harness.py
        assert (prefix / "share/slotstream/bench" / module.name).exists(), module.name
    assert os.access(prefix / "share/slotstream/workers/checksum.sh", os.X_OK)
    libs = sorted(p.name for p in (prefix / "lib").glob("libslotstream*"))
    # ... and the datagram transport's preload shim (LD_PRELOAD=P/lib/libslotstream_udp.so).
    assert libs == ["libslotstream.so", "libslotstream.so.0.1", "libslotstream.so.0.1.0", "libslotstream_udp.so"], libs
    assert "Library soname: [libslotstream.so.0.1]" in elf_dynamic(prefix / "lib/libslotstream.so.0.1.0")
    assert "libslotstream" not in elf_dynamic(prefix / "bin/slotstream"), "the CLI is one self-contained binary"
    assert not list(prefix.rglob("*.a")), "no static library is installed (it would leak UCX to consumers)"


def test_installed_man_page_has_examples_and_exit_status(prefix):
    text = subprocess.run(["man", "-l", "-P", "cat", str(prefix / "share/man/man1/slotstream.1")], capture_output=True,
                          text=True, timeout=30, env={"MANWIDTH": "200", "PATH": "/usr/bin:/bin"}).stdout
    sections = re.findall(r"^([A-Z][A-Z ]+)$", text, re.M)
    want = ["EXAMPLES", "EXIT STATUS", "FILES", "SEE ALSO"]
    assert [s for s in sections if s in want] == want, sections
    examples = text.split("EXAMPLES", 1)[1].split("EXIT STATUS", 1)[0]
    for command in ("slotstream recv --listen 0.0.0.0:7000 --out /data/streams", "slotstream send --to B:7000",
                    "slotstream verify /data/streams", "--transport shm"):
        assert command in examples, command
    status = text.split("EXIT STATUS", 1)[1].split("FILES", 1)[0]
    assert [m for m in re.findall(r"^ {7}(\d+)[ ,]", status, re.M)] == ["0", "1", "2", "130"], status


def test_installed_systemd_unit_runs_the_installed_binary(prefix, tmp_path):
    # The unit was a file to copy by hand, with /usr/local/bin/slotstream whatever the prefix.
    unit = prefix / "lib/systemd/system/slotstream-recv.service"
    text = unit.read_text()
    assert f"\nExecStart={prefix}/bin/slotstream recv --config /etc/slotstream/recv.toml\n" in text, text
    assert "@" not in text.replace("man:slotstream", ""), "a placeholder left unreplaced"
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze is not installed (package systemd, scripts/setup.sh test)")
    p = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and not p.stderr.strip(), p.stderr


@pytest.mark.deadline(60)
def test_the_installed_sample_recv_toml_starts_a_receiver(prefix, tmp_path):
    # The sample the unit's comment installs as /etc/slotstream/recv.toml, only its paths and ports moved here.
    sample = prefix / "share/slotstream/recv.toml"
    assert f"{prefix}/share/slotstream/workers/checksum.sh" in sample.read_text(), "the worker path is the prefix's"
    token = tmp_path / "token"
    token.write_text("a shared secret of the senders\n")
    out = tmp_path / "streams"
    rx = subprocess.Popen([prefix / "bin/slotstream", "recv", "--config", sample, "--listen", "127.0.0.1:0",
                           "--out", out, "--token-file", token, "--metrics", "127.0.0.1:0", "--exit-after-senders", "1"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = rx.stdout.readline()
        assert line.startswith("listening on "), (line, rx.stderr.read() if rx.poll() is not None else "")
        addr = line.split()[2]
        p = subprocess.run([prefix / "bin/slotstream", "send", "--to", addr, "--name", "sample", "--token-file", token,
                            "--synthetic", "0:50:16x16x3", "--duration", "0.1"], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        assert rx.wait(30) == 0, rx.stderr.read()
    finally:
        rx.kill()
    assert list((out / "sample" / "device-0").iterdir()), "nothing stored"


@pytest.fixture(scope="module")
def consumers(prefix, tmp_path_factory):
    """The consumer program built twice against the prefix: through find_package and through pkg-config."""
    work = tmp_path_factory.mktemp("consumer")
    run(["cmake", "-S", CONSUMER, "-B", work / "cmake", "-G", "Ninja", f"-DCMAKE_PREFIX_PATH={prefix}"])
    run(["cmake", "--build", work / "cmake"])
    # Exactly the README's command: `c++ app.cc $(pkg-config --cflags --libs slotstream)`, nothing added
    # (no -std, no rpath, no LD_LIBRARY_PATH): it must compile, link and run as it is.
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib/pkgconfig"))
    env.pop("LD_LIBRARY_PATH", None)
    run(["sh", "-c", f"c++ {CONSUMER / 'consumer.cc'} $(pkg-config --cflags --libs slotstream) -o {work / 'consumer-pc'}"],
        env=env)
    return {"find_package": work / "cmake" / "consumer", "pkg-config": work / "consumer-pc"}


def expected_message(device, i):
    return f"consumer {device} {i} ".encode() + bytes([ord("a") + device]) * (i * 1000)


@pytest.mark.deadline(240)
@pytest.mark.parametrize("how", ["find_package", "pkg-config"])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_consumer_streams_to_the_installed_receiver(prefix, consumers, tmp_path, how, transport):
    program = consumers[how]
    needed = elf_dynamic(program)
    assert "libslotstream.so.0.1" in needed
    assert "libucp" not in needed and "libspdlog" not in needed, "private dependencies leaked to the consumer"
    out = tmp_path / "out"
    rx = Receiver(["--out", out, "--transport", transport, "--exit-after-senders", "1"],
                  binary=prefix / "bin" / "slotstream")
    try:
        host, port = rx.addr.rsplit(":", 1)
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}  # the rpath finds the library
        p = run([program, host, port, f"consumer-{transport}", transport], timeout=60, env=env)
        assert f"over {transport}" in p.stdout
        assert parse_finished(rx.stdout.next_line(15))["messages"] == 20
        for d in (0, 1):
            for i in range(10):
                got = (out / f"consumer-{transport}" / f"device-{d}" / seq_name(i)).read_bytes()
                assert got == expected_message(d, i), (d, i)
    finally:
        rx.terminate(10)


@pytest.mark.deadline(240)
def test_installed_bench_runs_outside_the_source_tree(prefix, tmp_path):
    out = tmp_path / "bench"
    # --tiny: the installed orchestrator, its peers and its plots are what is checked, not figures (--quick took 77 s
    # of this test's 85). --force is recorded even though --tiny skips the load gate anyway.
    p = run([prefix / "bin" / "slotstream", "bench", "latency", "--tiny", "--force", "--out", out], timeout=200,
            cwd=tmp_path)
    assert "== measured in" in p.stdout
    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["load"]["forced"] is True, doc["config"]["load"]
    assert doc["errors"] == []
    assert {r["experiment"] for r in doc["records"]} == {"latency"}
    protocols = {r["protocol"] for r in doc["records"]}
    assert {"status_byte", "sliding_window"} <= protocols, protocols
    assert (out / "fig12_latency.png").stat().st_size > 1000


def test_pkg_config_names_cxx20_an_rpath_and_the_version(prefix):
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / "lib/pkgconfig"))
    assert "-std=c++20" in run(["pkg-config", "--cflags", "slotstream"], env=env).stdout.split()
    libdir = run(["pkg-config", "--variable=libdir", "slotstream"], env=env).stdout.strip()
    assert f"-Wl,-rpath,{libdir}" in run(["pkg-config", "--libs", "slotstream"], env=env).stdout.split()
    version = run([BIN, "--version"]).stdout.split()[1]
    assert run(["pkg-config", "--modversion", "slotstream"], env=env).stdout.strip() == version


def test_the_prefix_can_move(prefix, tmp_path):
    moved = tmp_path / "elsewhere"
    shutil.copytree(prefix, moved, symlinks=True)
    help_text = run([moved / "bin" / "slotstream", "--help"]).stdout
    assert "recv" in help_text and "bench" in help_text
    env = dict(os.environ, PKG_CONFIG_PATH=str(moved / "lib/pkgconfig"))
    cflags = run(["pkg-config", "--cflags", "slotstream"], env=env).stdout
    assert str(moved) in cflags, cflags
    # bench finds the moved orchestrator (its --help comes from slotstream_bench.py itself)
    assert "experiments:" in run([moved / "bin" / "slotstream", "bench", "--help"]).stdout
    digest = hashlib.sha256((moved / "share/slotstream/bench/slotstream_bench.py").read_bytes()).hexdigest()
    assert digest == hashlib.sha256((REPO / "bench/slotstream_bench.py").read_bytes()).hexdigest()


@pytest.mark.deadline(120)
def test_installed_gstreamer_plugin(prefix, tmp_path):
    """The plugin lands in P/lib/gstreamer-1.0, is found there through GST_PLUGIN_PATH, stands alone (the library
    linked in, its symbols private), and streams from the installed slotstreamsink to the installed `slotstream recv`."""
    plugin = prefix / "lib" / "gstreamer-1.0" / "libgstslotstream.so"
    assert plugin.exists()
    assert "libslotstream" not in elf_dynamic(plugin), "the plugin is self-contained"
    exported = run(["nm", "-D", "--defined-only", plugin]).stdout
    assert "gst_plugin_slotstream_get_desc" in exported
    leaked = [line for line in exported.splitlines() if "slotstream" in line and " gst_plugin_slotstream_" not in line]
    assert leaked == [], "the library's symbols are private to the plugin"
    env = dict(os.environ, GST_PLUGIN_PATH=str(plugin.parent), GST_REGISTRY=str(tmp_path / "registry.bin"))
    inspect = run(["gst-inspect-1.0", "slotstream"], env=env).stdout
    assert f"Filename                 {plugin}" in inspect
    out = tmp_path / "out"
    rx = Receiver(["--out", out, "--exit-after-senders", "1"], binary=prefix / "bin" / "slotstream")
    try:
        run(["gst-launch-1.0", "videotestsrc", "num-buffers=5", "!", "video/x-raw,width=32,height=24,format=RGB", "!",
             "slotstreamsink", f"to={rx.addr}", "sender-name=installed", "sync=false"], env=env, timeout=60)
        assert parse_finished(rx.stdout.next_line(15))["messages"] == 7  # caps, 5 buffers, end of stream
    finally:
        rx.terminate(10)
    # The installed example finds the installed plugin by itself.
    example = prefix / "share/slotstream/examples/gstreamer/camera_to_file.sh"
    env.pop("GST_PLUGIN_PATH")
    p = run(["bash", example, tmp_path / "camera.avi", "10"], env=env, timeout=60)
    assert "10 frames received" in p.stdout
