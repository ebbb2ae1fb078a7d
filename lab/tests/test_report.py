"""hsm_lab.report: the landing page's verdicts and the appendix's table of every measured number."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from hsm_lab import paper, report


def _write(root: Path, rel: str, records: list[dict], scale: str = "full", date: str = "2026-01-01T00:00:00Z",
           **config) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    prov = {"date_utc": date, "git_commit": "0" * 40, "hsm_scale": scale, "cpu_model": "AMD EPYC", "cpu_count": 2,
            "cuda_device": None, "config": config}
    path.write_text(json.dumps({"schema": 1, "provenance": prov, "records": records}))


def _ppl(claim: str, value: float, valid: float | None = None) -> dict:
    return {"claim": claim, "value": value, "measure": "test_perplexity", "valid_perplexity": valid}


def test_main_run_follows_the_rules(tmp_path: Path) -> None:
    ptb = "arxiv2016.table1.ptb.learned_tree.perplexity"
    rnd = "icml2017.table2.random_tree.perplexity"
    trec = "sf2020.table1.trec.flat.f1"
    _write(tmp_path, "lm/ptb.json", [_ppl(ptb, 169.0)], date="2026-03-01T00:00:00Z")
    _write(tmp_path, "lm/ptb-paper-lr0.025-l2-decay1.json", [_ppl(ptb, 167.2)], date="2026-01-01T00:00:00Z")
    _write(tmp_path, "lm/gutenberg-678books-250k-65ary-2ep-random-seed0.json", [_ppl(rnd, 177.4, 159.0)])
    _write(tmp_path, "lm/gutenberg-678books-250k-65ary-2ep-random-seed1.json", [_ppl(rnd, 177.0, 159.3)])
    _write(tmp_path, "taxonomy/trec-full-ft300-10ep.json", [{"claim": trec, "value": 55.0}], max_epochs=10)
    _write(tmp_path, "taxonomy/trec-full-ft300-40ep.json", [{"claim": trec, "value": 60.9}], max_epochs=40)
    _write(tmp_path, "taxonomy/trec.json", [{"claim": trec, "value": 49.0}], scale="full, reduced: x=1")
    # a run still going is not a measurement yet
    _write(tmp_path, "lm/ptb-paper-bis.json", [_ppl(ptb, 1.0)], complete=False, date="2026-09-01T00:00:00Z")
    found = report.measurements(tmp_path)
    assert len(found[ptb]) == 2
    # the rule (the paper's settings), not the latest
    assert report.main_measurement(ptb, found).file == "lm/ptb-paper-lr0.025-l2-decay1.json"
    assert report.main_measurement(rnd, found).value == 177.4  # the seed with the best validation perplexity
    assert report.main_measurement(trec, found).value == 60.9  # the largest epoch budget
    assert report.main_measurement("icml2017.speedup.train", found) is None


def test_each_number_is_listed_once_with_its_other_runs_named(tmp_path: Path) -> None:
    ptb = "arxiv2016.table1.ptb.learned_tree.perplexity"
    _write(tmp_path, "lm/ptb.json", [_ppl(ptb, 169.0)])
    _write(tmp_path, "lm/ptb-l2-decay1.json", [_ppl(ptb, 157.8, 171.1)])
    groups = report.number_groups(tmp_path)
    claims = [c for g in groups for c in g.claims]
    assert claims.count(ptb) == 1 and set(report.NOT_RUN) <= set(claims)
    text = report.numbers_markdown(groups)
    assert "157.8 (valid 171.1)" in text and "1.2 lower (better)" in text
    assert "Other runs of these numbers" in text and "`ptb.json`" in text
    assert "169.0" not in text  # named, not repeated
    assert "not run here: the flat softmax over 250,000 words was not trained for the trees' epochs" in text


def test_times_are_ratios_on_one_device_never_differences(tmp_path: Path) -> None:
    records = []
    for model, train, test in (("flat_soft_max", 570.0, 187.0), ("learned_tree", 5.2, 1.4)):
        records += [{"claim": f"icml2017.table2.{model}.train_ms_per_batch", "value": train},
                    {"claim": f"icml2017.table2.{model}.test_ms_per_batch", "value": test}]
    records += [{"claim": "icml2017.speedup.train", "value": 570.0 / 5.2},
                {"claim": "icml2017.speedup.test", "value": 187.0 / 1.4}]
    _write(tmp_path, "lm/timing.json", records)
    text = report.numbers_markdown(report.number_groups(tmp_path))
    assert "paper, GTX TITAN" in text and "ours, AMD EPYC, 2 cores" in text
    assert "4.5 (2.78×; the paper: “nearly three times”)" in text
    assert f"5.2 ({570.0 / 5.2:.1f}×)" in text
    assert "+" not in text.split("Time per batch")[1].split("Ours")[0]  # no signed deltas across devices


def test_perplexity_and_percent_differences_say_which_way_is_better() -> None:
    assert report.compare_in_words(167.8, 148.0, higher_is_better=False) == "19.8 higher (worse)"
    assert report.compare_in_words(141.8, 151.0, higher_is_better=False) == "9.2 lower (better)"
    assert report.compare_in_words(60.9, 72.6, higher_is_better=True, unit="%") == "11.7 points lower (worse)"
    assert report.compare_in_words(109.0, 2.78, higher_is_better=True, unit="x") == "39× the paper's"


def test_non_finite_values_show_a_marker() -> None:
    for value in (math.nan, math.inf, -math.inf):
        assert report.format_value(value) == report.NOT_FINITE
        assert report.compare_in_words(value, 148.0, higher_is_better=False) == report.NOT_FINITE
    number = paper.get("arxiv2016.table1.ptb.learned_tree.perplexity")
    bad = report.Measurement(number.key, math.nan, "lm/ptb-l2-decay1.json", "full", "AMD EPYC, 2 cores", "",
                             {"valid_perplexity": math.inf}, {})
    row = report.NumberRow(number.key, "Learned Tree (25-ary)", number, bad)
    text = report.numbers_markdown([report.NumberGroup("PTB", "/notebooks/lm_ptb", (row,))])
    assert "nan" not in text.lower().replace("not a finite number", "") and report.NOT_FINITE in text


def test_a_measured_number_of_no_chapter_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, "lm/x.json", [{"claim": "icml2017.gain.d50.arity5", "value": 1.0}])
    with pytest.raises(ValueError, match="in no chapter"):
        report.number_groups(tmp_path)


def test_committed_results_give_at_most_fifteen_verdicts() -> None:
    rows = report.verdicts()
    assert 8 <= len(rows) <= 15
    assert all(row.verdict in report.VERDICT_WORDS and row.doc.startswith("/notebooks/") for row in rows)
    table = report.verdict_table_markdown(rows)
    assert table.count("\n") == len(rows) + 2 and "nan" not in table
    groups = report.number_groups()
    listed = [c for g in groups for c in g.claims]
    assert len(listed) == len(set(listed)) and set(report.measurements()) <= set(listed)


def test_every_link_names_a_chapter_of_the_book() -> None:
    """{doc} links inside a cell's Markdown output are not checked by the build: check them here."""
    root = Path(__file__).resolve().parents[2]
    toc = (root / "_toc.yml").read_text(encoding="utf-8")
    docs = {row.doc for row in report.verdicts()} | {group.doc for group in report.number_groups()}
    for doc in docs:
        assert (root / f"{doc.lstrip('/')}.md").is_file() and f"file: {doc.lstrip('/')}" in toc, doc


def test_code_of_results_names_the_files_made_from_uncommitted_code(tmp_path: Path) -> None:
    _write(tmp_path, "lm/clean.json", [])
    _write(tmp_path, "lm/old-dirty.json", [])
    _write(tmp_path, "lm/new-dirty.json", [])
    for name, extra in (("old-dirty", {"git_dirty": True}),
                        ("new-dirty", {"git_dirty": True, "git_diff": {"sha256": "ab" * 32, "files": ["hsm/x.py"]}})):
        path = tmp_path / "lm" / f"{name}.json"
        payload = json.loads(path.read_text())
        payload["provenance"].update(extra)
        path.write_text(json.dumps(payload))
    codes = {c.file: c for c in report.code_of_results(tmp_path)}
    assert codes["lm/clean.json"].words() == "commit `0000000000`"
    assert "not recorded" in codes["lm/old-dirty.json"].words()
    assert "sha256 `abababababab`" in codes["lm/new-dirty.json"].words()
    text = report.code_of_results_markdown(list(codes.values()))
    assert text.startswith("1 of the 3 committed result files") and "`lm/clean.json`" not in text
    assert "The 2 below were made" in text
    one = report.code_of_results_markdown([codes["lm/clean.json"], codes["lm/new-dirty.json"]])
    assert "The one below was made" in one and "`lm/new-dirty.json`" in one
    clean = report.code_of_results_markdown([codes["lm/clean.json"]] * 3)
    assert clean.startswith("All 3 committed result files") and "below" not in clean
    assert report.code_of_results_markdown([codes["lm/clean.json"]]).startswith("The one committed result file was")


@pytest.mark.parametrize("seed_diffs, word, says", [
    ({"trec": [1.0, -1.0], "r8": [2.0, -0.5]}, report.NO_EFFECT, "on every table the sign changes"),
    ({"trec": [1.0, -1.0], "r8": [-2.0, -2.2]}, report.NO_EFFECT, "the flat model is ahead beyond the margin on R8"),
    ({"trec": [-1.0, -1.2], "r8": [-2.0, -2.2]}, "contradicted", "the sign changes with the seed on 0 of 2"),
    ({"trec": [1.0, -1.0], "r8": [2.0, 2.2]}, "close", "the taxonomy is ahead beyond the margin on R8"),
    ({"trec": [1.0, 1.2], "r8": [2.0, 2.2]}, "reproduced", "the sign changes with the seed on 0 of 2"),
    # every R8 seed below zero, but one only just: within the margin, so no table for the flat model
    ({"trec": [1.0, -1.0], "r8": [-2.0, -0.1]}, report.NO_EFFECT, "the sign changes with the seed on 1 of 2"),
])
def test_the_taxonomy_verdict_names_the_tables_where_one_model_leads_beyond_the_margin(
        tmp_path: Path, seed_diffs: dict, word: str, says: str) -> None:
    for name, diffs in seed_diffs.items():
        flat = [80.0] * len(diffs)
        records = [{"claim": None, "value": 0.0, "kind_of_record": "mean_over_seeds", "measure": "f1",
                    "model": model, "values": values}
                   for model, values in (("flat", flat), ("hierarchical", list(np.add(flat, diffs))))]
        _write(tmp_path, f"taxonomy/{name}-full-ft300-test.json", records, max_epochs=30)
    row = report._taxonomy_row(tmp_path)
    assert row.verdict == word and says in row.why
    flat_ahead = sum(np.mean(d) < -report.two_standard_errors(d) for d in seed_diffs.values())
    assert row.numbers["tables_flat_ahead"] == flat_ahead
    assert all(f"(margin {report.two_standard_errors(d):.1f})" in row.margin for d in seed_diffs.values())


def test_the_taxonomy_verdict_names_a_table_whose_documents_were_cut_short(tmp_path: Path) -> None:
    for name, share in (("r8", 0.951), ("20ng", 0.605)):
        records = [{"claim": None, "value": 0.0, "kind_of_record": "mean_over_seeds", "measure": "f1",
                    "model": model, "values": values}
                   for model, values in (("flat", [80.0, 81.0]), ("hierarchical", [81.0, 80.0]))]
        _write(tmp_path, f"taxonomy/{name}-full-ft300-test.json", records, max_epochs=10, token_share=0.95,
               kept_token_share_train=share, max_tokens_used=256 if name == "20ng" else 422)
    row = report._taxonomy_row(tmp_path)
    assert "20NG documents cut at 256 tokens (60 % of the training tokens)" in row.why
    assert "R8 documents" not in row.why and "not run at full size" not in row.why


def test_each_verdict_term_is_defined_and_the_three_failures_are_told_apart() -> None:
    text = report.verdict_words_markdown()
    assert text.count("\n- ") == len(report.VERDICT_WORDS) - 1
    assert all(f"- *{word}*: {meaning}." in text for word, meaning in report.VERDICT_MEANINGS.items())
    assert len({"contradicted", report.NO_EFFECT, report.SLOWER_HERE} & set(report.VERDICT_WORDS)) == 3


def test_every_verdict_prints_the_rule_that_decided_it() -> None:
    rows = report.verdicts()
    assert all(row.rule for row in rows), [row.claim for row in rows if not row.rule]
    rules = report.verdict_rules_markdown(rows)
    assert rules.count("\n- ") == len(rows) - 1 and all(row.rule in rules for row in rows)


@pytest.mark.parametrize("change, word", [(-1.0, "reproduced"), (+1.0, "contradicted")])
def test_the_larger_d_verdict_follows_the_gain_at_d_200(change: float, word: str) -> None:
    gains = {data: {(50, m): np.array([2.0, 2.1]) for m in (5, 20)} for data in ("a", "b")}
    for data in gains:
        for m in (5, 20):
            gains[data][(200, m)] = gains[data][(50, m)] + change
    assert report._larger_d_row(gains).verdict == word
    gains["b"][(200, 5)] = gains["b"][(50, 5)] - change  # one setting the other way: neither rule holds
    # it still shrinks on one stand-in (the claim holds in part), or it shrinks on none and grows on one
    assert report._larger_d_row(gains).verdict == ("close" if change < 0 else report.NO_EFFECT)
    # seeds as spread as the change itself: no direction anywhere
    noisy = {data: {(d, m): np.array([0.0, 4.0]) + (change if d == 200 else 0) for d in (50, 200) for m in (5, 20)}
             for data in ("a", "b")}
    assert report._larger_d_row(noisy).verdict == report.NO_EFFECT


def test_two_standard_errors_of_a_mean_and_of_a_difference() -> None:
    a, b = [1.0, 2.0, 3.0], [0.0, 4.0]
    assert report.two_standard_errors(a) == pytest.approx(2 * np.std(a, ddof=1) / np.sqrt(3))
    assert report.two_standard_errors(a, b) == pytest.approx(2 * np.sqrt(np.var(a, ddof=1) / 3 + np.var(b, ddof=1) / 2))
    assert report.two_standard_errors(a, [5.0]) == report.two_standard_errors(a)  # one run: spread unknown
    assert report.two_standard_errors([5.0]) == 0.0


@pytest.mark.parametrize("gains, word", [
    ([-3.0, -2.0, -2.5, -1.5], "contradicted"),
    ([2.0, 3.0, 2.5, 3.5], "reproduced"),
    # behind on average, by less than the margin that the widely spread runs leave
    ([-0.1, -2.9, 1.5, -0.3], report.NO_EFFECT),
])
def test_a_stand_in_verdict_needs_a_mean_gain_beyond_its_margin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                gains: list, word: str) -> None:
    by_setting = {(d, m): np.array(gains[i:i + 1] * 2) + np.array([0.0, 0.05 * (i + 1)])
                  for i, (d, m) in enumerate((d, m) for d in (50, 200) for m in (5, 20))}
    monkeypatch.setattr(report, "_stand_in_gains", lambda root: {"cooking": by_setting})
    row = next(r for r in report._classification_rows(tmp_path) if "`cooking`" in r.claim)
    assert row.verdict == word
    assert (abs(row.numbers["effect"]) > row.numbers["margin"]) == (word != report.NO_EFFECT)


def test_every_measured_verdict_states_its_margin_and_keeps_to_it() -> None:
    for row in report.verdicts():
        assert bool(row.margin) == (row.verdict != "not run here"), row.claim
        if "effect" in row.numbers:  # a word with a direction clears its margin; no effect stays within it
            beyond = abs(row.numbers["effect"]) > row.numbers["margin"]
            assert beyond == (row.verdict != report.NO_EFFECT), row.claim
        if "spread" in row.numbers:  # one run a side: the words rest on gaps wider than the seeds' spread
            assert row.numbers["spread"] > 0, row.claim
    assert "*Margin:*" in report.verdict_rules_markdown(report.verdicts())


def test_the_speed_up_is_judged_on_the_output_layers_on_one_gpu() -> None:
    rows = {row.claim: row for row in report.verdicts()}
    speed = next(row for claim, row in rows.items() if "trains nearly 3" in claim)
    # the output layers timed on one GPU decide, as the paper timed the objective; the whole model
    # and the CPU ratios stand beside them
    assert "one GPU" in speed.rule and "output layers alone" in speed.rule
    assert "output layers on one NVIDIA H200" in speed.ours and "whole model" in speed.ours
    assert "computing and learning the objective" in speed.paper
    train, test = speed.numbers["train"], speed.numbers["test"]
    assert speed.verdict == (report.SLOWER_HERE if min(train, test) <= 1 else speed.verdict)
    assert speed.numbers["cpu_train"] > 100 and speed.numbers["cpu_test"] > 100


def test_the_times_main_run_is_the_gpu_timing_when_one_is_committed(tmp_path: Path) -> None:
    claim = "icml2017.speedup.train"
    _write(tmp_path, "lm/timing.json", [{"claim": claim, "value": 160.0}], date="2026-03-01T00:00:00Z")
    assert report.main_measurement(claim, report.measurements(tmp_path)).value == 160.0  # no GPU run: the CPU's
    _write(tmp_path, "lm/timing-gpu-h200.json", [{"claim": claim, "value": 0.5}], date="2026-01-01T00:00:00Z")
    assert report.main_measurement(claim, report.measurements(tmp_path)).file == "lm/timing-gpu-h200.json"


def _gpu_bench(root: Path, flat_ms: float, tree_ms: float) -> None:
    records = [{"kind": "ms_per_batch", "vocab": v, "batch": b, "method": m, "metric": k, "precision": "float32",
                "value": (flat_ms if m == "flat" else tree_ms) * (b / 128)}
               for v in (10_000, 250_000) for b in (128, 1024) for m in ("flat", "learned-d3")
               for k in ("train", "logprob")]
    path = root / report.GPU_LAYER_BENCH
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"schema": 1, "provenance": {"cuda_device": "Some GPU", "hsm_scale": "full",
                                                              "config": {}},
                                "records": records}))


def test_gpu_layer_speed_ups_are_flat_over_learned_tree_on_one_device(tmp_path: Path) -> None:
    assert report.gpu_layer_speedups(tmp_path) is None  # no GPU benchmark committed
    _gpu_bench(tmp_path, flat_ms=6.0, tree_ms=2.0)
    gpu = report.gpu_layer_speedups(tmp_path)
    assert gpu["train"] == gpu["test"] == pytest.approx(3.0) and gpu["device"] == "Some GPU"
    assert gpu["tree_train_ms_range"] == (2.0, 2.0) and gpu["vocab_range"] == (10_000, 250_000)


def test_paper_comparisons_hold_the_seed_spread_where_seeds_ran() -> None:
    rows = {row.label: row for row in report.paper_comparisons()}
    assert len(rows["PTB: random tree"].seeds) >= 3 and not rows["PTB: learned tree"].seeds
    assert all(len(row.seeds) == 3 for label, row in rows.items() if row.measure == "macro-F1")
    assert all(min(row.seeds) <= row.ours <= max(row.seeds) for row in rows.values() if row.seeds)


def test_regenerate_note_gives_the_recorded_command_file_and_cost():
    name = "lm/gutenberg-678books-250k-65ary-2ep-learned.json"
    text = report.regenerate_note(name)
    payload = json.loads((report.default_results_root() / name).read_text())
    minutes = round(payload["provenance"]["config"]["training_seconds"] / 60)
    assert f"about {minutes} CPU-minutes" in text
    assert f"results/{name}" in text and "GPU" not in text
    # too long for one line: a code block whose lines fit the page, joined by continuations
    block = text.split("```text\n")[1].split("\n```")[0]
    assert all(len(line) <= 90 for line in block.splitlines())
    command = " ".join(line.rstrip(" \\").strip() for line in block.splitlines() if not line.startswith("#"))
    assert command.startswith("python -m hsm run lm-gutenberg-65 --scale full")
    assert "-o runs=learned" in command and command.endswith(f"--out results/{name}")


def test_regenerate_note_short_command_is_one_line_with_threads_and_note():
    text = report.regenerate_note("sampling/fig2.json", note="Seeds 0 to 4.")
    assert text.startswith("*Regenerate:* `python -m hsm run sampling-fig2 --scale full "
                           "--out results/sampling/fig2.json` (about ")
    assert text.endswith("*File:* `results/sampling/fig2.json`. Seeds 0 to 4.") and "\n" not in text
    threaded = report.regenerate_note("classification/table1-cooking-fast-seed0.json")
    assert "2 threads" in threaded


def test_regenerate_note_without_a_recorded_command_names_the_experiment(tmp_path: Path):
    from hsm_lab.reproduce import ReproduceError, invocation_of

    # a file that records neither its command nor the settings to rebuild it
    _write(tmp_path, "classification/old.json", [], experiment="icml-fast-ablation")
    path = tmp_path / "classification/old.json"
    payload = json.loads(path.read_text())
    payload["provenance"]["wall_time_s"] = 221.5
    path.write_text(json.dumps(payload))
    with pytest.raises(ReproduceError):
        invocation_of(path, payload)
    text = report.regenerate_note("classification/old.json", root=tmp_path)
    assert text.startswith("*File:* `results/classification/old.json`, made by "
                           "`icml-fast-ablation` (command not recorded; about ")
    assert "python -m hsm" not in text


def test_regenerate_note_many_files_fold_into_a_dropdown_and_bad_paths_fail():
    files = [f"sampling/{n}.json" for n in ("fig1", "fig2", "fig1-C500", "fig2-scale10")]
    text = report.regenerate_note(files)
    assert text.startswith("````{dropdown} Regenerate the 4 files (about ") and text.endswith("````")
    assert all(f"--out results/{f}" in text for f in files)
    with pytest.raises(ValueError, match="relative to results/"):
        report.regenerate_note("results/lm/ptb.json")
    with pytest.raises(ValueError, match="at least one"):
        report.regenerate_note([])


def test_regenerate_note_wrapped_lines_join_back_into_the_recorded_command():
    from hsm_lab.reproduce import command_for, invocation_of

    name = "classification/today-cooking-ablations.json"  # a list option longer than the page
    path = report.default_results_root() / name
    text = report.regenerate_note(name)
    block = text.split("```text\n")[1].split("\n```")[0]
    assert all(len(line) <= 90 for line in block.splitlines())
    shell = " ".join(block.replace("\\\n", "").split("\n")[1:]).split()  # as the shell reads it
    recorded = command_for(invocation_of(path, json.loads(path.read_text())), Path("results") / name)[3:]
    assert shell[:3] == ["python", "-m", "hsm"] and sorted(shell[3:]) == sorted(recorded[:recorded.index("--device")]
                                                                              + recorded[recorded.index("--device") + 2:])


@pytest.mark.parametrize("random_seeds, learned, paper_settings, word", [
    ([167.2, 166.3, 167.6], 167.0, True, report.NO_EFFECT),  # inside the random trees' spread
    ([167.2, 166.3, 167.6], 168.0, True, "contradicted"),    # above every random tree
    ([171.1, 171.3, 171.7], 157.8, False, "close"),         # below every seed, another rate
    ([172.1, 172.5, 171.9], 159.5, True, "reproduced"),      # the paper's result at its settings
])
def test_the_ptb_verdict_weighs_the_learned_tree_against_every_random_tree(
        tmp_path: Path, random_seeds: list, learned: float, paper_settings: bool, word: str) -> None:
    def run(claim_model: str, value: float) -> dict:
        per_epoch = [{"epoch": 4, "valid_perplexity": value + 10, "test_perplexity": value}]
        return _ppl(f"arxiv2016.table1.ptb.{claim_model}.perplexity", value) | {"per_epoch": per_epoch}

    chosen = min(random_seeds)
    records = [run("flat_soft_max", 150.0), run("random_tree", chosen), run("learned_tree", learned),
               {"claim": None, "value": 0.025, "measure": "selection",
                "selection": {"random_seed_test": random_seeds}}]
    settings = ({"lr_grid": [0.025], "random_seeds": 5, "l2": 5e-5} if paper_settings
                else {"lr_grid": [0.05], "random_seeds": 3, "l2": 5e-5})
    _write(tmp_path, "lm/ptb-paper-lr0.025-l2-decay1.json", records, **settings)
    row = report._lm_rows(report.measurements(tmp_path), tmp_path)[0]
    assert row.verdict == word, row.why
    assert row.numbers["random_seeds"] == 3


def test_a_gpu_run_regenerates_with_its_device_minutes_not_cpu_time() -> None:
    text = report.regenerate_note(["bench/gpu-h200-float32.json"])
    assert "on one NVIDIA H200" in text and "CPU-minute" not in text and "thread" not in text
    assert "CPU-minute" in report.regenerate_note(["bench/decoding.json"])  # a CPU run keeps its CPU time


def test_the_ptb_verdict_reads_the_learned_tree_from_every_starting_tree(tmp_path: Path) -> None:
    """Learned starts that all end below every random tree make the word; one that ends inside the
    random trees' spread takes it back to no consistent effect."""
    def run(claim_model: str, value: float) -> dict:
        per_epoch = [{"epoch": 4, "valid_perplexity": value + 10, "test_perplexity": value}]
        return _ppl(f"arxiv2016.table1.ptb.{claim_model}.perplexity", value) | {"per_epoch": per_epoch}

    settings = {"lr_grid": [0.025], "random_seeds": 5, "l2": 5e-5}
    records = [run("flat_soft_max", 150.0), run("random_tree", 171.9), run("learned_tree", 159.5),
               {"claim": None, "value": 0.025, "measure": "selection",
                "selection": {"random_seed_test": [172.1, 172.5, 171.9]}}]
    _write(tmp_path, "lm/ptb-paper-lr0.025-l2-decay1.json", records, **settings)
    _write(tmp_path, "lm/ptb-paper-lr0.025-l2-decay1-learn3-seed1.json", [run("learned_tree", 160.0)], **settings)
    row = report._lm_rows(report.measurements(tmp_path), tmp_path)[0]
    assert row.verdict == "reproduced" and row.numbers["learned_seeds"] == 2
    _write(tmp_path, "lm/ptb-paper-lr0.025-l2-decay1-learn3-seed2.json", [run("learned_tree", 172.2)], **settings)
    row = report._lm_rows(report.measurements(tmp_path), tmp_path)[0]
    assert row.verdict == report.NO_EFFECT and "from 3 starting trees" in row.why, row.why
