"""bench/cache_experiments.py's sizing: the cache experiment's windows and block counts from the last-level cache
sysfs reports, for small and very large caches (a VM may report its host's whole 260-300 MiB L3 shared by its
2 CPUs: the sweep asked the sender for `--blocks 9600`, beyond the 4,096 a connection may have, and `bench all
--tiny` failed there). Pure Python on fake sysfs trees; runs nothing."""
import sys
import types

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "bench"))
import cache_experiments as ce  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
LLC_SIZES = [2 * MiB, 32 * MiB, 260 * MiB, 300 * MiB, 1 * GiB]
CFG = types.SimpleNamespace(transports=["shm", "tcp"])


def fake_sysfs(root, llc, llc_cpus="0-1", l2=2 * MiB):
    """cpu0's cache directory as Linux lays it out: L1d, L1i, L2 (per core) and the LLC (`llc` bytes shared by
    `llc_cpus`), sizes written in K as the kernel does."""
    levels = [(1, "Data", 48 * KiB, "0"), (1, "Instruction", 32 * KiB, "0"), (2, "Unified", l2, "0"),
              (3, "Unified", llc, llc_cpus)]
    for i, (level, kind, size, cpus) in enumerate(levels):
        d = root / f"index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(f"{kind}\n")
        (d / "size").write_text(f"{size >> 10}K\n")
        (d / "shared_cpu_list").write_text(f"{cpus}\n")
    return root


def geometries(s):
    """Every (protocol, W, devices, blocks) the sweep would ask for, per_device both ways."""
    for _, _, d, w in s["points"]:
        for p in ce.PROTOCOLS:
            for per_device in (False, True):
                spec, blocks = ce.geometry(p, w, d, s["cache"], per_device)
                yield p, w, d, blocks


@pytest.mark.parametrize("llc", LLC_SIZES, ids=lambda b: f"{b >> 20}MiB")
@pytest.mark.parametrize("mode", ["tiny", "quick", "full"])
def test_every_point_fits_a_connections_blocks(tmp_path, llc, mode):
    s = ce.settings(CFG, quick=mode == "quick", tiny=mode == "tiny", cache_dir=fake_sysfs(tmp_path, llc))
    assert s["cache_share"] == llc // 2, "the share is the LLC over the CPUs sharing it"
    cap = ce.TINY_CACHE_CAP if mode == "tiny" else ce.CACHE_CAP
    assert s["cache"] == max(ce.CACHE_FLOOR, min(llc // 2, cap) // ce.BLOCK * ce.BLOCK)
    assert s["points"]
    for p, w, d, blocks in geometries(s):
        assert 1 <= blocks <= ce.MAX_BLOCKS, (p, w, d, blocks)
        assert w >= ce.BLOCK or w == s["cache"] // 4, (p, w)
    # The windows the claims table reads are still there: W = C and W = 4C (not for --tiny: C/4 and C).
    windows = {w for _, _, _, w in s["points"]}
    assert s["cache"] in windows and s["cache"] // 4 in windows
    if mode != "tiny":
        assert 4 * s["cache"] in windows


def test_the_cap_is_what_a_sender_may_ask_for():
    # 4C of 64 KiB blocks is exactly the most blocks a connection may have: carc's buffers at the cap.
    assert 4 * ce.CACHE_CAP // ce.BLOCK == ce.MAX_BLOCKS
    header = (REPO / "include/slotstream/slotstream.h").read_text()
    assert f"kMaxBlocks = {ce.MAX_BLOCKS};" in header


def test_small_and_unknown_caches():
    assert ce.sweep_cache(0) == ce.FALLBACK_CACHE        # sysfs says nothing: carc's receiver's fallback
    assert ce.sweep_cache(64 * KiB) == ce.CACHE_FLOOR    # W = C/4 is still a whole block
    assert ce.sweep_cache(16 * MiB) == 16 * MiB          # this kind of host (32 MiB L3, 2 CPUs): unchanged
    assert ce.sweep_cache(150 * MiB) == ce.CACHE_CAP
    assert ce.sweep_cache(150 * MiB, tiny=True) == ce.TINY_CACHE_CAP


def test_geometry_refuses_more_blocks_than_a_connection_has():
    with pytest.raises(ValueError, match="4096"):
        ce.geometry("credit", 4 * 150 * MiB, 1, 150 * MiB, False)
