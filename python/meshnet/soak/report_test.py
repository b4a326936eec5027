"""The soak's summary: its checks fail on what they guard (a wrong token, a leak, RSS growth, an
attack not held), and the timeline bins what was served and refused."""

from __future__ import annotations

from meshnet.soak import report
from meshnet.soak.attacks import AttackResult
from meshnet.soak.faults import FaultEvent
from meshnet.soak.load import Outcome

STARTED = 1000.0


def outcomes(wrong: bool = False) -> list[Outcome]:
    return [Outcome(STARTED + 5, "stream", "ok", 48, False), Outcome(STARTED + 12, "plain", "ok", 40, wrong, "x"),
            Outcome(STARTED + 14, "cancel", "503", 0, False), Outcome(STARTED + 25, "long", "ReadTimeout", 0, False)]


def summary(**changes) -> dict:
    args = {"outcomes": outcomes(), "faults": [FaultEvent("kill9_node", "node-1", STARTED + 11, STARTED + 20)],
            "attacks": [AttackResult(STARTED + 3, "bad_key", True, "401")], "leaks": {},
            "rss": {"tracker:1": {"growth": 1.1}}, "idle": {"busy": {}, "unroutable": {}}}
    args.update(changes)
    return report.summarize({}, args["outcomes"], args["faults"], args["attacks"], args["leaks"], args["rss"],
                            STARTED, STARTED + 30, args["idle"])


def test_a_clean_run_passes_and_counts_what_it_served():
    s = summary()
    assert s["passed"] and s["requests"] == 4 and s["served"] == 2 and s["tokens"] == 88
    assert s["errors_by_code"] == {"503": 1, "ReadTimeout": 1} and s["faults"] == {"kill9_node": 1}
    assert s["fault_events"] == [{"kind": "kill9_node", "target": "node-1", "at_s": 11.0, "undone_after_s": 9.0}]


def test_each_check_fails_on_what_it_guards():
    assert summary(outcomes=outcomes(wrong=True))["checks"]["wrong_tokens"] is False
    assert summary(leaks={"node-2": (1, 40)})["checks"]["leaked_sessions_or_kv"] is False
    assert summary(rss={"gateway:2": {"growth": report.RSS_GROWTH_MAX + 0.01}})["checks"]["rss_bounded"] is False
    failed = summary(attacks=[AttackResult(STARTED + 3, "squat_route", False, "renewal OK")])
    assert failed["checks"]["attacks_held"] is False and not failed["passed"]
    assert failed["attacks_not_held"] == [{"kind": "squat_route", "at_s": 3.0, "detail": "renewal OK"}]
    busy = summary(idle={"busy": {"node-0-worker:9": {"cpu_s": 4.9, "threads": 40}}, "unroutable": {}})
    assert busy["checks"]["idle_after_end"] is False and not busy["passed"]
    banned = summary(idle={"busy": {}, "unroutable": {"node-1": "quarantined"}})
    assert banned["checks"]["every_node_routable_after_end"] is False and not banned["passed"]


def test_the_timeline_bins_by_ten_seconds():
    rows = report.timeline(outcomes(), STARTED, STARTED + 30)
    assert [(r["t_s"], r["served"], r["tokens"], r["errors"]) for r in rows] == [
        (0.0, 1, 48, {}), (10.0, 1, 40, {"503": 1}), (20.0, 0, 0, {"ReadTimeout": 1}), (30.0, 0, 0, {})]
    assert rows[0]["tokens_per_s"] == 4.8


def test_rss_growth_is_judged_per_process_lifetime_after_its_own_warm_up():
    mib = 2**20
    samples = {"a": [(0.0, 100 * mib), (10.0, 200 * mib), (20.0, 210 * mib), (40.0, 220 * mib)],
               "b": [(0.0, 1)],  # one sample: not judged
               "relaunched": [(25.0, 50 * mib), (35.0, 60 * mib), (50.0, 90 * mib)],  # its own warm-up from 25
               "short": [(30.0, 10 * mib), (40.0, 10 * mib), (45.0, 10 * mib)]}  # too short after warm-up
    assert report.rss_growth(samples, warmup_s=10.0, judged_s=15.0) == {
        "a": {"after_warmup_mib": 200.0, "end_mib": 220.0, "max_mib": 220.0, "growth": 1.1, "judged_s": 30.0},
        "relaunched": {"after_warmup_mib": 60.0, "end_mib": 90.0, "max_mib": 90.0, "growth": 1.5, "judged_s": 15.0}}
