"""``memqual memslots model|lookup|kvm`` through the real argument parser."""

from __future__ import annotations

import json

import pytest

from memqual.host.cli import main as cli


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["memslots", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_model_table_shows_the_published_figures(capsys):
    rc, out, err = run(capsys, "model", "--layout", "seed-32", "--workload", "miss", "--lookups", "2000")
    assert rc == 0, err
    rows = {line.split()[1]: line for line in out.splitlines() if line.startswith("│")}
    assert set(rows) >= {"linear", "reorder", "tree2011", "hbtree", "binsearch", "binsearch-lru", "rbtree"}
    assert "32.00" in rows["linear"] and rows["linear"].rstrip("│ ").endswith("32")
    assert rows["tree2011"].rstrip("│ ").endswith("6-7")  # the seed's figure, beside the 2011 tree's count
    assert rows["hbtree"].rstrip("│ ").endswith(" 7")  # memqual's own tree: no published figure, just its bound
    assert "seed 000" in out and "for reference only" not in out
    assert "hbtree: memqual's own height-budgeted proposal" in " ".join(out.split())


def test_model_table_says_when_the_published_figures_are_another_case(capsys):
    rc, out, _ = run(capsys, "model", "--layout", "seed-3", "--workload", "miss", "--lookups", "100")
    assert rc == 0
    assert "the seed's figures are for misses on 32 slots; shown for reference only." in out


def test_model_json(capsys):
    rc, out, _ = run(
        capsys, "model", "--layout", "seed-3", "--workload", "ram-hits", "--json", "--lookups", "500", "--seed", "9"
    )
    assert rc == 0
    doc = json.loads(out)
    assert doc["layout"] == "seed-3" and doc["workload"] == "ram-hits" and doc["seed"] == 9
    assert doc["structures"]["reorder"]["max_nodes"] == 2
    assert set(doc["published"]) >= {"claim", "structures", "applies"}


def test_model_from_a_file(capsys, tmp_path):
    path = tmp_path / "two.json"
    path.write_text(
        json.dumps({"slots": [{"id": 0, "base_gfn": 0, "npages": 16}, {"id": 1, "base_gfn": 32, "npages": 16}]})
    )
    rc, out, _ = run(capsys, "model", "--layout", str(path), "--workload", "miss", "--json", "--lookups", "100")
    assert rc == 0
    assert json.loads(out)["structures"]["linear"]["max_nodes"] == 2


def test_lookup_lines(capsys):
    rc, out, _ = run(capsys, "lookup", "--layout", "seed-3", "0x100000", "3670016")
    assert rc == 0
    lines = out.splitlines()
    assert len(lines) == 14  # 2 gfns x 7 structures
    assert lines[0].split() == ["gfn", "0x100000", "linear", "slot", "2", "nodes", "3"]
    hole = [line.split() for line in lines[7:]]  # 3670016 = 0x380000: above the last slot
    assert all(words[1] == "0x380000" and words[3] == "miss" for words in hole)
    assert [words[-1] for words in hole if words[2] == "linear"] == ["3"]


def test_lookup_json(capsys):
    rc, out, _ = run(capsys, "lookup", "--layout", "seed-32", "--json", "0xA0", "256")
    assert rc == 0
    results = json.loads(out)["results"]
    assert [r["gfn"] for r in results] == [0xA0, 256]
    assert results[0]["structures"]["linear"] == {"slot": None, "nodes": 32}
    assert results[1]["structures"]["reorder"] == {"slot": 1, "nodes": 2}  # second biggest slot


@pytest.mark.parametrize(
    "argv, message",
    [
        (["lookup", "--layout", "seed-3", "12z"], "bad gfn '12z': give a decimal number or 0x-prefixed hex"),
        (["model", "--layout", "seed-99", "--workload", "miss"], "unknown layout 'seed-99'"),
        (
            ["model", "--layout", "/nonexistent/l.json", "--workload", "miss"],
            "layout file /nonexistent/l.json not found",
        ),
        (["model", "--layout", "seed-3", "--workload", "misses"], "unknown workload 'misses'"),
        (["model", "--layout", "seed-3", "--workload", "miss", "--lookups", "0"], "--lookups 0 is too small"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, message):
    rc, out, err = run(capsys, *argv)
    assert rc == 2
    assert out == ""
    assert err.count("\n") == 1 and message in err


def test_invalid_layout_file_names_the_slots(capsys, tmp_path):
    path = tmp_path / "dup.json"
    path.write_text(
        json.dumps({"slots": [{"id": 4, "base_gfn": 0, "npages": 1}, {"id": 4, "base_gfn": 9, "npages": 1}]})
    )
    rc, _, err = run(capsys, "lookup", "--layout", str(path), "1")
    assert rc == 2 and "duplicate slot id 4" in err and err.count("\n") == 1


def test_kvm_uses_its_own_module():
    from memqual.host.cli import memslots_kvm as kvm_cli

    args = cli.build_parser().parse_args(["memslots", "kvm"])
    assert args.handler is kvm_cli.run
