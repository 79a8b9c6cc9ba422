"""`pagebench report` replaces only its own page and data directory: a user's file or folder at
the output's path, and anything inside a directory the report reads, are refused (one line,
exit status 2) and left as they were; re-running over a report (this version's, or one from
before the marker) works."""

from __future__ import annotations

from pathlib import Path

import pytest
from synthetic_report import synthetic_results

from pagebench import suite
from pagebench.analysis import analyse
from pagebench.cli import main
from pagebench.report import build, outputs
from pagebench.results import Results

# the head of a page written by pagebench before the generator tag (the template's first lines)
LEGACY_HEAD = ('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
               '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
               "<title>pagebench: paged KV-cache report</title>\n")


def analysed(results: Results) -> Results:
    analyse(results)
    return results


def write(out, results: Results | None = None) -> Path:
    return build.write_report(analysed(results or synthetic_results()), out,
                              env={"device": "cpu"}, options={})


@pytest.fixture
def built(monkeypatch):
    """`pagebench report` without its sweeps: ``build_report`` writes synthetic results (the
    outputs are checked by the command and by ``write_report``); the pages it was called for."""
    calls = []

    def build_report(out, **_):
        calls.append(Path(out))
        results = analysed(synthetic_results())
        return build.write_report(results, out, env={"device": "cpu"}, options={}), results

    monkeypatch.setattr(suite, "build_report", build_report)
    return calls


def tree(root: Path) -> dict:
    """Every path under ``root`` (hidden ones too) -> its bytes (None for a directory)."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
            for p in sorted(root.rglob("*"))}


def report(*argv) -> list[str]:
    return ["report", "--quick", "--no-progress", *map(str, argv)]


def refused(capsys, argv, *words) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"pagebench {argv[0]}: error: "), err
    for word in words:
        assert word in err, err
    return err


def make_legacy(page: Path) -> None:
    """Turn a report into what pagebench wrote before the marker: no generator tag, no
    marker file."""
    html = page.read_text(encoding="utf-8")
    assert outputs.GENERATOR_META + "\n" in html
    page.write_text(html.replace(outputs.GENERATOR_META + "\n", ""), encoding="utf-8")
    (page.parent / f"{page.stem}_data" / outputs.MARKER).unlink()
    assert page.read_text(encoding="utf-8").startswith(LEGACY_HEAD)


# ---- what is refused, and left as it was ---------------------------------------------------

def test_a_users_folder_named_like_the_data_directory_survives(tmp_path, capsys, built):
    prec = tmp_path / "prec"
    (prec / "mypage_data").mkdir(parents=True)
    (prec / "mypage_data" / "important.csv").write_text("my own data\n")
    (prec / "mypage.html").write_text("<html>old</html>\n")
    before = tree(tmp_path)
    refused(capsys, report("--out", prec / "mypage.html"), "--out", "mypage.html",
            "not a pagebench report page")
    assert tree(tmp_path) == before
    (prec / "mypage.html").unlink()  # no page at all: the folder is still not pagebench's
    before = tree(tmp_path)
    refused(capsys, report("--out", prec / "mypage.html"), "mypage_data", outputs.MARKER)
    assert tree(tmp_path) == before and built == []


@pytest.mark.slow
@pytest.mark.parametrize("legacy", [False, True], ids=["marked", "before-the-marker"])
def test_a_file_added_to_a_reports_data_directory_survives(tmp_path, capsys, built, legacy):
    page = write(tmp_path / "index.html")
    if legacy:
        make_legacy(page)
    (tmp_path / "index_data" / "notes.txt").write_text("mine\n")
    (tmp_path / "index_data" / "important.csv").write_text("a\n1\n")
    before = tree(tmp_path)
    refused(capsys, report("--out", page), "index_data", "important.csv, notes.txt",
            "which pagebench did not write")
    assert tree(tmp_path) == before and built == []
    with pytest.raises(ValueError, match="notes.txt"):  # the library refuses it too
        write(page)
    assert tree(tmp_path) == before


@pytest.mark.parametrize("name", ["notes.txt", "page.html", "empty.html"])
def test_a_users_file_is_not_overwritten(tmp_path, capsys, built, name):
    target = tmp_path / name
    target.write_text("" if name == "empty.html" else "<html><title>mine</title></html>\n")
    before = tree(tmp_path)
    refused(capsys, report("--out", target), f"--out: {target} exists",
            "not a pagebench report page")
    assert tree(tmp_path) == before and built == []
    with pytest.raises(ValueError, match="not a pagebench report page"):
        write(target)
    assert tree(tmp_path) == before  # no page, no data directory, no temporary file


def committed(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data / "h200").mkdir(parents=True)
    synthetic_results().get("kernels").drop(columns=["machine", "source"]).to_csv(
        data / "h200" / "kernels.csv", index=False)
    return data


@pytest.mark.parametrize("where", ["h200/kernels.csv", "h200/new.html", "site/"])
def test_an_output_inside_the_data_directory_is_refused(tmp_path, capsys, built, where):
    data = committed(tmp_path)
    before = tree(tmp_path)
    refused(capsys, report("--data-dir", data, "--out", f"{data}/{where}"),
            "--out:", f"is inside --data-dir {data}", "read as input")
    assert tree(tmp_path) == before and built == []


def test_an_output_inside_or_over_a_results_directory_is_refused(tmp_path, capsys, built):
    data, mine = committed(tmp_path), tmp_path / "runs_data"
    (mine / "cpu").mkdir(parents=True)
    (mine / "cpu" / "engine_cow.csv").write_text("n,variant,peak_blocks\n4,n=4 shared,5\n")
    before = tree(tmp_path)
    refused(capsys, report("--data-dir", data, "--results", mine, "--out", f"{mine}/cpu/"),
            f"is inside --results {mine}")
    # the page beside the results, its data directory (runs_data/) being them or holding them
    for results in (mine, mine / "cpu"):
        refused(capsys, report("--data-dir", data, "--results", results, "--out",
                               tmp_path / "runs.html"),
                f"data directory {mine} would replace --results {results}")
    assert tree(tmp_path) == before and built == []


def test_claims_csv_inside_the_data_directory_is_refused(tmp_path, capsys):
    data = committed(tmp_path)
    before = tree(tmp_path)
    refused(capsys, ["claims", "--data-dir", str(data), "--csv", str(data / "h200/kernels.csv")],
            "--csv:", "is inside --data-dir")
    assert tree(tmp_path) == before


# ---- what is replaced: pagebench's own page and data ---------------------------------------

@pytest.mark.slow
def test_the_page_and_its_data_directory_carry_their_marks(tmp_path):
    page = write(tmp_path / "index.html")
    html = page.read_text(encoding="utf-8")
    assert outputs.GENERATOR_META in html.split("</head>")[0]
    csvs = {p.name for p in (tmp_path / "index_data").glob("*.csv")}
    assert len(csvs) > 5
    assert outputs.marked_files(tmp_path / "index_data") == csvs
    assert outputs.is_report_page(page) and outputs.foreign(tmp_path / "index_data", page) is None
    assert not outputs.is_report_page(tmp_path / "index_data" / "claims.csv")


@pytest.mark.slow
def test_rerunning_over_a_report_replaces_it(tmp_path, capsys, built):
    site = tmp_path / "site"
    for _ in range(2):
        assert main(report("--out", f"{site}/")) == 0
        assert "wrote" in capsys.readouterr().out
    assert built == [site / "index.html"] * 2
    assert sorted(p.name for p in site.iterdir()) == ["index.html", "index_data"]
    write(site / "index.html", Results())  # fewer datasets: the stale CSVs and names go
    assert outputs.marked_files(site / "index_data") == {
        p.name for p in (site / "index_data").iterdir() if p.name != outputs.MARKER}
    assert not (site / "index_data" / "engine_cow.csv").exists()


@pytest.mark.slow
def test_rerunning_over_a_report_from_before_the_marker_works(tmp_path, capsys, built):
    site = tmp_path / "site"
    page = write(site / "index.html")
    make_legacy(page)
    # a CSV of a dataset an earlier version had, linked from its page
    (site / "index_data" / "old_dataset.csv").write_text("a\n1\n")
    page.write_text(page.read_text().replace(
        "</main>", '<a href="index_data/old_dataset.csv">CSV</a></main>'))
    assert outputs.marked_files(site / "index_data") is None
    assert main(report("--out", page)) == 0, capsys.readouterr().err
    assert outputs.GENERATOR_META in page.read_text()
    listed = outputs.marked_files(site / "index_data")
    assert listed and "old_dataset.csv" not in listed
    assert not (site / "index_data" / "old_dataset.csv").exists()
    assert sorted(p.name for p in site.iterdir()) == ["index.html", "index_data"]


@pytest.mark.slow
def test_a_legacy_data_directory_without_its_page_is_refused(tmp_path, capsys, built):
    page = write(tmp_path / "index.html")
    make_legacy(page)
    page.unlink()
    before = tree(tmp_path)
    refused(capsys, report("--out", page), "no pagebench page index.html beside it")
    assert tree(tmp_path) == before and built == []
