"""The contract checker: ratios, directions, missing lanes, per-node RSS; and the committed
contract file is well formed (every check names its lanes, metrics, op and ratio)."""

import json
import os
from pathlib import Path

from meshnet.bench import contract

CONTRACT = {"checks": [
    {"id": "faster", "lane": "a", "metric": "decode_tok_s", "baseline_lane": "b", "baseline_metric": "decode_tok_s",
     "op": ">=", "ratio": 0.95},
    {"id": "quicker", "lane": "a", "metric": "ttft_ms", "baseline_lane": "b", "baseline_metric": "ttft_ms",
     "op": "<=", "ratio": 1.15},
    {"id": "rpc", "lane": "a", "metric": "decode_tok_s", "baseline_lane": "rpc", "baseline_metric": "decode_tok_s",
     "op": ">=", "ratio": 2.0},
    {"id": "rss", "kind": "per_node_rss", "lane": "a", "ratio": 1.15, "slack_mib": 64},
    {"id": "drift", "kind": "absolute", "lane": "d", "metric": "top1_agreement", "op": ">=", "value": 0.98},
]}


def outcomes(results):
    return {o.check: o for o in contract.evaluate(CONTRACT, results)}


def test_ratios_and_directions():
    got = outcomes({"lanes": {"a": {"decode_tok_s": 96.0, "ttft_ms": 120.0}, "b": {"decode_tok_s": 100.0, "ttft_ms": 100.0}}})
    assert got["faster"].passed and abs(got["faster"].measured - 0.96) < 1e-9
    assert not got["quicker"].passed and abs(got["quicker"].measured - 1.2) < 1e-9


def test_missing_lane_fails_never_passes():
    got = outcomes({"lanes": {"a": {"decode_tok_s": 96.0}}})
    assert not got["rpc"].passed and got["rpc"].measured is None and "rpc.decode_tok_s" in got["rpc"].detail
    assert not got["rss"].passed and got["rss"].measured is None


def test_per_node_rss_budget():
    mib = 1 << 20
    node = {"weight_bytes": 50 * mib, "kv_bytes": 10 * mib}
    ok = outcomes({"lanes": {"a": {"nodes": [dict(node, peak_rss_bytes=130 * mib)]}}})  # budget 133 MiB
    assert ok["rss"].passed
    over = outcomes({"lanes": {"a": {"nodes": [dict(node, peak_rss_bytes=140 * mib)]}}})
    assert not over["rss"].passed and over["rss"].measured > 1.0


def test_main_prints_every_check_and_fails(tmp_path, capsys):
    (tmp_path / "c.json").write_text(json.dumps(CONTRACT))
    (tmp_path / "r.json").write_text(json.dumps({"lanes": {"a": {"decode_tok_s": 1.0}, "b": {"decode_tok_s": 1.0}}}))
    assert contract.main(["--contract", str(tmp_path / "c.json"), "--results", str(tmp_path / "r.json")]) == 1
    out = capsys.readouterr().out
    assert "PASS  v1  faster" in out and "FAIL  v1  rpc" in out and "1 passed, 4 failed, 0 skipped" in out


def test_absolute_check_and_bench_layout():
    # the bench writes its flat figures under "contract_figures"; the raw "lanes" beside them are ignored
    low = outcomes({"lanes": {}, "contract_figures": {"lanes": {"d": {"top1_agreement": 0.97}}}})
    assert not low["drift"].passed and abs(low["drift"].measured - 0.97) < 1e-9
    assert outcomes({"contract_figures": {"lanes": {"d": {"top1_agreement": 0.98}}}})["drift"].passed
    assert not outcomes({"lanes": {}})["drift"].passed


def test_committed_contract_is_well_formed():
    committed = json.loads(Path(os.environ["MESHNET_CONTRACT"]).read_text())
    ids = [c["id"] for c in committed["checks"]]
    # no check dropped: 11 from issues 8 and 12, 2 from issue 15 (set v1), 12 from issue 14, 1
    # from issue 17, 2 from issue 29, 2 from issue 30, 2 from issue 32 and 2 from issue 55 (set v2)
    assert len(ids) == len(set(ids)) == 34
    assert sum(c.get("set", "v1") == "v1" for c in committed["checks"]) == 13
    for check in committed["checks"]:
        if check.get("kind") == "per_node_rss":
            assert {"lane", "ratio", "slack_mib"} <= set(check)
        elif check.get("kind") == "absolute":
            assert {"lane", "metric", "op", "value"} <= set(check)
        else:
            assert {"lane", "metric", "baseline_lane", "baseline_metric", "op", "ratio"} <= set(check)
            assert check["op"] in (">=", "<=") and check["ratio"] > 0


def test_when_present_check_is_skipped_not_passed():
    contract_doc = {"checks": [{"id": "opt", "set": "v2", "when_present": True, "lane": "big", "metric": "m",
                            "baseline_lane": "base", "baseline_metric": "m", "op": ">=", "ratio": 0.9}]}
    absent = contract.evaluate(contract_doc, {"lanes": {"base": {"m": 1.0}}})[0]
    assert absent.skipped and not absent.passed and contract.verdict(absent) == "SKIP" and absent.contract_set == "v2"
    low = contract.evaluate(contract_doc, {"lanes": {"base": {"m": 1.0}, "big": {"m": 0.5}}})[0]
    assert contract.verdict(low) == "FAIL" and not low.skipped
    assert contract.summary([absent, low]) == "0 passed, 1 failed, 1 skipped"
