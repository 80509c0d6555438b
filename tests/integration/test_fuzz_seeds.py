"""fuzz/corpus holds exactly the seeds fuzz/seeds.py writes (fuzz/README.md: the seeds stay small; what a run finds
goes to build-fuzz/corpus/): 1,197 libFuzzer outputs had been committed beside the 71 seeds. Runs seeds.py only."""
import subprocess
import sys

from conftest import REPO


def files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()
            and p.name != ".gitignore"}


def test_the_corpus_is_the_seeds_and_nothing_else(tmp_path):
    subprocess.run([sys.executable, str(REPO / "fuzz/seeds.py"), str(tmp_path)], check=True, timeout=60)
    seeds, committed = files(tmp_path), files(REPO / "fuzz/corpus")
    assert seeds, "seeds.py wrote nothing"
    assert sorted(set(committed) - set(seeds)) == [], "not seeds (fuzz/run.sh writes findings to build-fuzz/corpus)"
    assert sorted(set(seeds) - set(committed)) == [], "seeds missing: rerun fuzz/seeds.py"
    assert [n for n in seeds if seeds[n] != committed[n]] == [], "stale seeds: rerun fuzz/seeds.py"
    assert sum(map(len, seeds.values())) < 64 << 10
