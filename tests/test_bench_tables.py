"""The benchmarks' records and the tables written from them, on CPU: every committed
RESULTS-*.md is what its records give, and each record kind is read as written.
"""
from __future__ import annotations


import pytest

from bench_fixtures import BENCH, REPO, import_bench

pytest.importorskip("torch")  # bench_lms_swap imports the zoo, which imports torch


def test_distributed_plan_and_table(tmp_path):
    import argparse
    bd = import_bench("bench_distributed")
    GiB = 1 << 30
    two = bd.plan(argparse.Namespace(scales=[1.5], engines=["ddp", "fsdp"]), 2)
    assert two[:3] == [("ddp", 2, 1.0, False), ("ddp", 2, 1.5, True), ("fsdp", 2, 1.5, True)]
    assert ("ddp", 1, 1.5, True) in two and two[-1] == ("ddp", 2, 1.5, False)
    one = bd.plan(argparse.Namespace(scales=[1.5], engines=["ddp"]), 1)
    assert len(one) == len(set(one)) == 4          # no job twice on one GPU

    stock = {("ddp", 2): {"step_s": 1.0, "batch": 100}}
    rank = {"batch": 150, "lms": True, "step_s": 2.0, "units_per_s": 75.0, "unit": "img/s",
            "out_bytes_per_step": 54e9, "in_bytes_per_step": 53e9, "peak_host_rss": 60 * GiB}
    row = {"engine": "ddp", "nproc": 2, "scale": 1.5, "batch": 150, "lms": True, "status": "ok",
           "host_total": 256 * GiB, "min_mem_available": 130 * GiB,
           "results": [dict(rank, rank=1, step_s=2.5), dict(rank, rank=0)]}
    bd.summarize(row, stock, {})
    assert row["step_s"] == 2.5 and row["units_per_s"] == 150.0   # slowest rank; all ranks
    assert [d["rank"] for d in row["per_rank"]] == [0, 1]
    assert [d["pct_of_bound"] for d in row["per_rank"]] == [100.0, 80.0]  # 2 s of PCIe
    assert row["node_peak_host_rss"] == 120 * GiB and row["node_host_used_peak"] == 126 * GiB
    oom = {"engine": "ddp", "nproc": 2, "scale": 1.5, "batch": 150, "lms": False,
           "status": "CUDA OOM", "error": "CUDA out of memory.", "results": []}
    meta = {"command": "c", "model": "resnet50", "base_batch": 100, "base_batch_from": "given",
            "max_gpu_gib": None, "node_budget": 200 * GiB, "host_total": 256 * GiB}
    bd.write(tmp_path, meta, [row, oom])
    md = (tmp_path / "results.md").read_text()
    assert "| ddp | 2 | 1.5x | 150 | lms | ok |" in md and "**CUDA OOM**: CUDA out of memory." in md
    assert all(line.count("|") == 17 for line in md.splitlines() if line.startswith("| ddp"))


def test_zoo_table_is_written_from_records(tmp_path):
    """RESULTS-zoo.md comes from records/zoo.jsonl: a section per record, the newest first."""
    bench = import_bench("bench_lms_swap")
    row = {"model": "unet", "scale": 2.0, "batch": 200, "mode": "lms", "status": "ok",
           "units_per_s": 50.0, "unit": "img/s", "step_s": 4.0, "frac_of_bound": 0.5}
    old = {"run": "7", "date": "2026-11-22", "commit": None, "machine": {"gpu": "H100"},
           "torch": None, "source": "h100-run7", "command": "c7", "results": [row]}
    new = dict(old, run="8", commit="abc1234", torch="2.11", source=None, command="c8",
               link={"d2h_gbps": 27.0, "h2d_gbps": 26.5})
    bench.write_table(tmp_path / "t.md", [old, new])
    md = (tmp_path / "t.md").read_text()
    assert md.index("## run 8, 2026-11-22, commit abc1234, H100, torch 2.11") < md.index(
        "## run 7, 2026-11-22, commit unknown, H100, folder `h100-run7`")
    assert "27.0 GB/s out, 26.5 in" in md and md.count("| unet | 2.0x | 200 | lms | ok |") == 2


# Every RESULTS-*.md is written by code from its records: (table, module, how it is written).
def _write_zoo(m, recs, path):
    m.write_table(path, recs)


def _write_loops(m, recs, path):
    m.write_table(path, recs)


def _write_distributed(m, recs, path):
    m.write_table(path, recs)


TABLES = {
    "zoo": ("bench_lms_swap", _write_zoo),
    "loops": ("bench_loops", _write_loops),
    "distributed": ("bench_distributed", _write_distributed),
    **{name: ("record_tables", lambda m, recs, path, name=name: m.write_table(name, path, recs))
       for name in ("allocator", "tf_allocator", "victim_trace", "probes")},
}


def test_every_results_table_has_a_writer():
    assert sorted(p.name for p in BENCH.glob("RESULTS-*.md")) == sorted(
        f"RESULTS-{n}.md" for n in TABLES)


@pytest.mark.parametrize("name", sorted(TABLES))
def test_committed_table_is_what_its_records_give(tmp_path, name):
    """A table edited by hand, or records changed without regenerating it, fails here."""
    records = import_bench("records")
    module, write = TABLES[name]
    out = tmp_path / f"RESULTS-{name}.md"
    write(import_bench(module), records.load(BENCH / "records" / f"{name}.jsonl"), out)
    assert out.read_text() == (BENCH / f"RESULTS-{name}.md").read_text(), (
        f"RESULTS-{name}.md differs from its records: regenerate it (README.md says how)")


def test_record_tables_on_one_real_record_each(tmp_path):
    """Each of the four writers on the first record of its file: the section names its
    commit, runs and where the commands are, and the rows carry the record's figures."""
    import json
    rt = import_bench("record_tables")

    def first(name):
        return json.loads((BENCH / "records" / f"{name}.jsonl").open().readline())

    def md(name, rec):
        return rt.write_table(name, tmp_path / f"{name}.md", [rec]).read_text()

    alloc = first("allocator")  # run 106, b535afc
    text = md("allocator", alloc)
    assert "## Commit b535afc" in text and "106 (`h100-run104/r106`)" in text
    assert "the notes of `h100-run104` in `records/runs.jsonl`" in text
    bw = alloc["tests"]["bandwidth_lms"]
    spill = "/".join(f"{x['out_gbps'] / bw['ref_d2h_gbps']:.2f}" for x in bw["rounds"])
    assert f"| 106 | bandwidth_lms | ran | 0 | spill {spill}, return" in text
    assert "| 106 | summary |" not in text
    assert text.count("\n| 106 | ") == len(alloc["tests"]) - 1

    text = md("tf_allocator", first("tf_allocator"))  # run 107: a failed CHECK, rc=134
    assert "| 107 | tf_writers.log | Check failed; rc=134 | 0 |" in text

    vt = first("victim_trace")
    text = md("victim_trace", vt)
    row = vt["rows"][0]
    assert (f"| {vt['run']} | {vt['model']}, batch {vt['meta']['batch']} | {row['fraction']} "
            f"({row['capacity'] / (1 << 30):.1f} GiB) | {row['policy']} |") in text
    assert text.count(f"\n| {vt['run']} | ") == len(vt["rows"])

    pr = first("probes")  # a zoo configuration's results.json: the command is in the record
    text = md("probes", pr)
    assert f"Commands: `{pr['data']['command']}`." in text and "Commands not in the records" not in text
    res = pr["data"]["results"][0]
    assert f"| {pr['run']} | {pr['probe']} | bench_lms_swap.py | {res['model']} {res['scale']}x" in text


def test_per_step_traces_are_kept_apart(tmp_path):
    """The zoo's per-step lines go to a gzipped file beside the records, keyed so that each
    goes back to its result; the record and its table keep everything else."""
    records = import_bench("records")
    rec = {"run": "9", "date": "d", "commit": "c", "command": "x",
           "results": [{"model": "unet", "scale": 1.5, "batch": 6, "mode": "lms",
                        "per_step": [{"kind": "timed", "s": 1.0}]},
                       {"model": "unet", "scale": 1.0, "batch": 4, "mode": "stock"}]}
    path = tmp_path / "zoo.jsonl"
    records.append_with_traces(path, rec)
    assert records.traces_path(path).name == "zoo-per-step.jsonl.gz"
    [kept] = records.load(path)
    assert all("per_step" not in r for r in kept["results"]) and kept["command"] == "x"
    [t] = records.load_traces(path)
    assert t == {"run": "9", "date": "d", "commit": "c", "result": 0, "model": "unet",
                 "scale": 1.5, "batch": 6, "mode": "lms", "per_step": [{"kind": "timed", "s": 1.0}]}
    # the committed zoo records: every trace finds exactly one result that lacks it
    zoo = records.load(BENCH / "records" / "zoo.jsonl")
    for t in records.load_traces(BENCH / "records" / "zoo.jsonl"):
        [r] = [r for r in zoo if all(r.get(k) == t.get(k) for k in records.TRACE_KEYS)]
        res = r["results"][t["result"]]
        assert (res["model"], res["scale"], res["mode"]) == (t["model"], t["scale"], t["mode"])
        assert "per_step" not in res


def test_every_allocator_counter_a_step_records_is_one_the_lms_core_prints():
    """The benches record the pluggable allocator's counters by name from the text its LMS
    core prints; a name the core does not print would read 0 in every step, unnoticed."""
    allocator_memory = import_bench("allocator_memory")
    printed = set()
    for src in [*(REPO / "patches").rglob("*.cpp"), *(REPO / "patches").rglob("*.inc")]:
        text = src.read_text(errors="replace")
        printed.update(__import__("re").findall(r'"([\w.]+)(?:=|",)', text))
    missing = [k for k in allocator_memory.ALLOC_TOTALS if k not in printed]
    assert not missing, missing

    class _Alloc:  # what lms_swap.allocator.lms_stats hands over: ints, a key it may lack
        @staticmethod
        def lms_stats():
            return {"swap_out_bytes": 7, "launch_gate.inactive_reason": "none"}
    got = allocator_memory.alloc_totals(_Alloc)
    assert got["alloc.swap_out_bytes"] == 7 and got["alloc.swap_in_time_ns"] == 0
    assert set(got) == {f"alloc.{k}" for k in allocator_memory.ALLOC_TOTALS}
