"""hsm.experiments.lm_timing: the timing experiment's code path and result file (not its timings)."""
import json
from pathlib import Path

import pytest

from hsm import config
from hsm.experiments import lm_timing

MIRROR = config.data_mirror()
needs_ptb = pytest.mark.skipif(MIRROR is None or not (MIRROR / "ptb").exists(),
                               reason="PTB unavailable: set HSM_DATA_MIRROR to the data mirror")


@needs_ptb
def test_lm_timing_quick_writes_every_output_and_the_ratios(tmp_path):
    out = lm_timing.run_lm_timing(scale="quick", out=tmp_path / "t.json", steps="3", warmup="1", test_batches="2")
    payload = json.loads(Path(out).read_text())
    records = payload["records"]
    outputs = {(r["output"], r["measure"]) for r in records if "output" in r}
    assert outputs == {(o, m) for o in lm_timing.OUTPUTS for m in ("train_ms_per_batch", "test_ms_per_batch")}
    assert all(r["value"] > 0 for r in records)
    assert all(r["claim"] is None for r in records)  # a capped vocabulary is not the paper's data
    learned = next(r for r in records if r.get("output") == "learned" and r["measure"] == "train_ms_per_batch")
    assert learned["reassign_s"] > 0 and learned["train_ms_per_batch"] > learned["train_step_ms"]
    ratios = {r["measure"]: r["value"] for r in records if r["measure"].startswith("speedup")}
    flat = {r["measure"]: r["value"] for r in records if r.get("output") == "flat"}
    assert ratios["speedup_train"] == pytest.approx(flat["train_ms_per_batch"] / learned["train_ms_per_batch"])
    assert payload["provenance"]["config"]["steps"] == 3


def test_lm_timing_rejects_bad_options(tmp_path):
    with pytest.raises(ValueError, match="unknown option"):
        lm_timing.run_lm_timing(scale="quick", out=tmp_path / "t.json", epochs="3")
    with pytest.raises(ValueError, match="unknown tables"):
        lm_timing.run_lm_timing(scale="quick", out=tmp_path / "t.json", tables="nope")
    with pytest.raises(ValueError, match="scale"):
        lm_timing.run_lm_timing(scale="huge", out=tmp_path / "t.json")
