"""The chaos soak's attacker: issue 35's refusals replayed against the live swarm, one at a time at
a bounded rate, each recorded as held (refused as its defense says, with the surface still
serving an honest request meanwhile) or not.

Connections the attacker holds open come from 127.0.0.2, another host than the load's.
Attacks: `idle_sockets` (200 silent connections to the gateway, held 3 s: the gateway still
answers), `silent_tracker_calls` (30 silent connections to the tracker: Coverage still answers),
`squat_route` (a client opens a route and never sends a frame: its renewal is refused),
`false_failure_report` (a client reports a healthy hop of its route as failed: the tracker's
probe finds it healthy and does not ban it), `forged_verdict` (a verifier reports an audit it
never took: NOT_FOUND, or PERMISSION_DENIED for a key the tracker did not enrol),
`minted_verifier` (a fresh key with the verifier token takes an audit: PERMISSION_DENIED, the
soak's tracker enrolling verifiers, ADR 0017), `report_flood` (one client key makes one failure
report more than its quota in a minute: the last is RESOURCE_EXHAUSTED), `billing_forgery` (a
client names a gateway key's account: refused), `bad_key` (a wrong API key: 401),
`oversized_prompt` (past the gateway's limit: 400).
Issue 55 added: `grammar_budget` (a client-role ticket holder samples under a raw grammar whose
every draw would take minutes: RESOURCE_EXHAUSTED at the last hop's sampling budget),
`grammar_worst_schema` (an API key asks for the converter's worst schema, 1,000 enum values to
start every item from: answered, within the key's limits), `grammar_past_bounds` (1,024 such
values: 400 before any token), `many_addresses_tracker` and `many_addresses_gateway` (silent
connections from 24 addresses, 127.0.1.1 to 127.0.1.24, 32 each (768 in all): the
tracker's Coverage and the gateway's /v1/models still answer the honest host).
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import time
from typing import Callable
from urllib.parse import urlsplit

import grpc
import requests

from meshnet.client.session import GenerationParams, MeshnetError, RouteClient
from meshnet.gateway.grammar.worst_cases import EXPONENTIAL_GBNF, enum_ways_schema
from meshnet.identity.keys import Identity
from meshnet.process import raise_file_limit
from meshnet.swarm.local import TrackerProcess
from meshnet.tracker.ledger.principals import DEFAULT_FAILURE_REPORTS_PER_MINUTE
from meshnet.wire import tracker as tt
from meshnet.wire.status import StatusCode

KINDS = ("idle_sockets", "silent_tracker_calls", "squat_route", "false_failure_report", "forged_verdict",
         "minted_verifier", "report_flood", "billing_forgery", "bad_key", "oversized_prompt", "grammar_budget",
         "grammar_worst_schema", "grammar_past_bounds", "many_addresses_tracker", "many_addresses_gateway")


@dataclasses.dataclass(frozen=True)
class AttackResult:
    at: float  # monotonic
    kind: str
    held: bool
    detail: str = ""


ATTACKER_ADDRESS = "127.0.0.2"  # another host than the honest load's 127.0.0.1: per-peer caps tell them apart
# Many attacking hosts, each in another /24 than the honest load's 127.0.0.0/24 (the prefix caps'
# unit): 24 hosts held the tracker's and the gateway's global caps before issue 55.
MANY_ADDRESSES = tuple(f"127.0.1.{i}" for i in range(1, 25))


def _raise_if_unreached(err: grpc.RpcError) -> None:
    """A call that did not reach a serving tracker (one restarting under a fault) carried no
    attack: raised, so that run() records it as not carried out, not as a refusal."""
    if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        raise err


@contextlib.contextmanager
def _silent_sockets(host: str, port: int, count: int, sources: tuple[str, ...] = (ATTACKER_ADDRESS,)):
    """`count` silent connections from each of `sources`."""
    socks = []
    try:
        for source in sources:
            for _ in range(count):
                try:
                    socks.append(socket.create_connection((host, port), timeout=2, source_address=(source, 0)))
                except OSError:
                    break  # refused at the door is a bound holding too
        yield len(socks)
    finally:
        for s in socks:
            s.close()


class Attacker:
    def __init__(self, gateway_url: str, api_key: str, model: str, tracker: TrackerProcess,
                 under_fault: Callable[[str], bool] = lambda node_id: False) -> None:
        """`under_fault(node_id)`: whether the fault scheduler has that node down or stopped."""
        self.gateway_url, self.api_key, self.model, self.tracker = gateway_url.rstrip("/"), api_key, model, tracker
        self.under_fault = under_fault
        self._http = requests.Session()
        raise_file_limit()  # the many-address attacks hold 768 sockets at once

    def close(self) -> None:
        self._http.close()

    def run(self, kind: str) -> AttackResult:
        attack: Callable[[], tuple[bool, str]] = getattr(self, f"_{kind}")
        try:
            held, detail = attack()
        except Exception as err:  # an attack that could not be carried out (the tracker restarting, say)
            held, detail = True, f"not carried out: {type(err).__name__}: {str(err)[:120]}"
        return AttackResult(time.monotonic(), kind, held, detail)

    def _honest_models(self) -> int:
        return self._http.get(self.gateway_url + "/models", headers={"Authorization": f"Bearer {self.api_key}"},
                              timeout=10).status_code

    def _idle_sockets(self) -> tuple[bool, str]:
        url = urlsplit(self.gateway_url)
        with _silent_sockets(url.hostname, url.port, 200) as opened:
            time.sleep(1.0)
            code = self._honest_models()
            time.sleep(2.0)
        return code == 200, f"{opened} silent connections; an honest /v1/models answered {code}"

    def _silent_tracker_calls(self) -> tuple[bool, str]:
        with _silent_sockets(self.tracker.host, self.tracker.port, 30) as opened:
            time.sleep(1.0)
            with self.tracker.client(timeout=5.0) as honest:
                cover = honest.coverage(self.model)
            time.sleep(2.0)
        return cover.status.ok, f"{opened} silent connections; Coverage answered {cover.status.code.name}"

    def _squat_route(self) -> tuple[bool, str]:
        with self.tracker.client() as squatter:
            route = squatter.open_route(tt.OpenRouteRequest(self.model, expected_tokens=64))
            if not route.status.ok:
                return True, f"no route to squat ({route.status.code.name})"
            renewed = squatter.renew_route(route.session)  # never a frame sent: the lease is not renewed
        return renewed.status.code == StatusCode.RESOURCE_EXHAUSTED, f"renewal {renewed.status.code.name}"

    def _false_failure_report(self) -> tuple[bool, str]:
        with self.tracker.client() as liar:
            route = liar.open_route(tt.OpenRouteRequest(self.model, expected_tokens=64))
            if not route.status.ok:
                return True, f"no route ({route.status.code.name})"
            victim = route.hops[-1].node.node_id
            liar.report_failure(route.session, victim)
            liar.close_route(route.session)
            cover = liar.coverage(self.model)
        routable = any(victim in layer.node_ids for layer in cover.layers)
        if not routable and self.under_fault(victim):
            return True, "the victim was under an injected fault: a ban is the probe's honest answer"
        return routable, f"the reported hop is still routable: {routable}"

    def _forged_verdict(self) -> tuple[bool, str]:
        with self.tracker.client("verifier") as forger:
            try:
                reply = forger.report_audit(tt.ReportAuditRequest((1 << 61) + 7, False, "n" + "0" * 40))
            except grpc.RpcError as err:  # an unenrolled key, refused before its verdict is read
                _raise_if_unreached(err)
                return err.code() == grpc.StatusCode.PERMISSION_DENIED, err.code().name
        return reply.status.code == StatusCode.NOT_FOUND, reply.status.code.name

    def _minted_verifier(self) -> tuple[bool, str]:
        with self.tracker.client("verifier", Identity.generate()) as minted:
            try:
                reply = minted.take_audit()
            except grpc.RpcError as err:
                _raise_if_unreached(err)
                return err.code() == grpc.StatusCode.PERMISSION_DENIED, err.code().name
        return False, f"served: {reply.status.code.name}"

    def _report_flood(self) -> tuple[bool, str]:
        with self.tracker.client() as flooder:
            route = flooder.open_route(tt.OpenRouteRequest(self.model, expected_tokens=64))
            if not route.status.ok:
                return True, f"no route ({route.status.code.name})"
            codes = []
            for _ in range(DEFAULT_FAILURE_REPORTS_PER_MINUTE + 1):  # no hop named: a new epoch each, no ban
                reply = flooder.report_failure(route.session, "")
                codes.append(reply.status.code)
                if reply.session is not None and reply.status.ok:
                    route = reply
            flooder.close_route(route.session)
        refused = codes[-1] == StatusCode.RESOURCE_EXHAUSTED
        return refused, f"{sum(c == StatusCode.OK for c in codes)} acted on, the last {codes[-1].name}"

    def _billing_forgery(self) -> tuple[bool, str]:
        with self.tracker.client() as forger:
            reply = forger.open_route(tt.OpenRouteRequest(self.model, "key:local", 64))
            if reply.status.ok:
                forger.close_route(reply.session)
        return reply.status.code == StatusCode.PERMISSION_DENIED, reply.status.code.name

    def _bad_key(self) -> tuple[bool, str]:
        code = self._http.post(self.gateway_url + "/chat/completions", json={
            "model": self.model, "messages": [{"role": "user", "content": "hi"}]},
            headers={"Authorization": f"Bearer sk-{Identity.generate().node_id}"}, timeout=30).status_code
        return code == 401, str(code)

    def _many_addresses_tracker(self) -> tuple[bool, str]:
        with _silent_sockets(self.tracker.host, self.tracker.port, 32, MANY_ADDRESSES) as opened:
            time.sleep(1.0)
            with self.tracker.client(timeout=5.0) as honest:
                cover = honest.coverage(self.model)
        return cover.status.ok, f"{opened} silent connections from {len(MANY_ADDRESSES)} hosts; Coverage answered " \
                                f"{cover.status.code.name}"

    def _many_addresses_gateway(self) -> tuple[bool, str]:
        url = urlsplit(self.gateway_url)
        with _silent_sockets(url.hostname, url.port, 32, MANY_ADDRESSES) as opened:
            time.sleep(1.0)
            code = self._honest_models()
        return code == 200, f"{opened} silent connections from {len(MANY_ADDRESSES)} hosts; /v1/models answered {code}"

    def _grammar_budget(self) -> tuple[bool, str]:
        with self.tracker.client() as attacker:
            try:
                tokens = list(RouteClient(attacker, self.model).generate(
                    [1, 504, 3458], GenerationParams(max_tokens=8, grammar=EXPONENTIAL_GBNF, route_wait=5.0)))
            except MeshnetError as err:
                detail = f"{err.status.code.name}: {err.status.message[:120]}"
                if "sampling budget" in err.status.message:
                    return err.status.code == StatusCode.RESOURCE_EXHAUSTED, detail
                if err.status.code in (StatusCode.RESOURCE_EXHAUSTED, StatusCode.UNAVAILABLE):
                    # busy or down (the tracker's capacity, a hop's session table, no route under a
                    # fault): the grammar never reached a draw
                    return True, f"not carried out: {detail}"
                return False, detail
        return False, f"served {len(tokens)} tokens"

    def _schema_request(self, schema: dict) -> requests.Response:
        return self._http.post(self.gateway_url + "/chat/completions", json={
            "model": self.model, "messages": [{"role": "user", "content": "Pick values."}], "max_tokens": 16,
            "response_format": {"type": "json_schema", "json_schema": {"name": "values", "schema": schema}}},
            headers={"Authorization": f"Bearer {self.api_key}"}, timeout=120)

    def _grammar_worst_schema(self) -> tuple[bool, str]:
        started = time.monotonic()
        code = self._schema_request(enum_ways_schema(250)).status_code
        # Answered, or refused for the key's rate or the swarm's capacity: never an error of the hop.
        return code in (200, 429, 503), f"{code} in {time.monotonic() - started:.1f} s"

    def _grammar_past_bounds(self) -> tuple[bool, str]:
        reply = self._schema_request(enum_ways_schema(256))
        return reply.status_code == 400 and "enum values" in reply.text, f"{reply.status_code}: {reply.text[:120]}"

    def _oversized_prompt(self) -> tuple[bool, str]:
        code = self._http.post(self.gateway_url + "/chat/completions", json={
            "model": self.model, "messages": [{"role": "user", "content": "x" * 300_000}]},
            headers={"Authorization": f"Bearer {self.api_key}"}, timeout=30).status_code
        return code in (400, 413), str(code)
