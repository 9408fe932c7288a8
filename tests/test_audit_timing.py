"""`kvparity audit-timing` against `kvparity serve` on 127.0.0.1 (real HTTP; the server runs in this
process on its own event-loop thread, so no second torch start-up is paid): global cache scope is
detected with p < 1e-8 in at most 500 probes; tenant scope shows sharing for the same user (the positive
control) and none across tenants; an engine without a prefix cache fails the positive control (exit 2).
Never a non-loopback target: that one is refused before any request is sent."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

pytest.importorskip("aiohttp", reason="kvparity serve needs the serve extra (aiohttp)")
pytest.importorskip("scipy", reason="the audit's KS test needs scipy (serve extra)")

from kvparity.commands.audit_timing import decide, is_loopback, main  # noqa: E402
from kvparity.commands.audit_timing.decision import Plan, ks_faster  # noqa: E402
from kvparity.commands.audit_timing.procedure import LevelResult, Procedure  # noqa: E402


class InProcessServer:
    """`kvparity serve` (kvparity.commands.serve.build + its aiohttp app) on a free 127.0.0.1 port, in a thread."""

    def __init__(self, scope: str, **engine_args: str) -> None:
        from aiohttp import web

        from kvparity.commands.serve.build import build

        self.server = build(scope=scope, engine_args=engine_args)
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def start() -> None:
            self.runner = web.AppRunner(self.server.app(), access_log=None)
            await self.runner.setup()
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
            ready.set()

        self.thread = threading.Thread(target=self._serve, args=(start,), daemon=True)
        self.thread.start()
        assert ready.wait(60)

    def _serve(self, start) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(start())
        self.loop.run_forever()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


@pytest.fixture
def server(request):
    scope, knobs = request.param
    s = InProcessServer(scope, **knobs)
    yield s
    s.stop()


def audit(url: str, tmp_path, *args: str) -> tuple[int, dict]:
    code = main(["--base-url", url, "--letters", "200", "--out", str(tmp_path), "--sequential", *args])
    data = json.loads((tmp_path / "results.json").read_text()) if (tmp_path / "results.json").exists() else {}
    return code, {row["level"]: row for row in data.get("levels", [])}


@pytest.mark.parametrize("server", [("global", {})], indirect=True)
def test_global_scope_is_detected_across_tenants(server, tmp_path):
    code, levels = audit(server.url, tmp_path, "--levels", "cross-tenant")
    row = levels["cross-tenant"]
    assert code == 1 and row["verdict"] == "sharing detected"
    assert row["pvalue"] < 1e-8 and row["probes"] <= 500
    assert (tmp_path / "ttft.png").stat().st_size > 0 and "LEAK" in (tmp_path / "report.md").read_text()
    from kvparity.commands.audit_timing.report import replot

    (tmp_path / "ttft.png").unlink()
    replot(tmp_path)  # the same figure again, from results.json alone
    assert (tmp_path / "ttft.png").stat().st_size > 0


@pytest.mark.parametrize("server", [("tenant", {})], indirect=True)
def test_tenant_scope_shares_within_a_user_and_not_across_tenants(server, tmp_path):
    code, levels = audit(server.url, tmp_path, "--levels", "same-user,cross-tenant", "--max-probes", "100")
    assert levels["same-user"]["verdict"] == "sharing detected"  # the positive control has power
    assert levels["cross-tenant"]["verdict"] == "not detected" and levels["cross-tenant"]["probes"] == 100
    assert code == 0


@pytest.mark.parametrize("server", [("global", {"prefix_cache": "false"})], indirect=True)
def test_no_prefix_cache_fails_the_positive_control(server, tmp_path):
    code, levels = audit(server.url, tmp_path, "--levels", "same-user", "--max-probes", "20")
    assert levels["same-user"]["verdict"] == "not detected" and code == 2


def test_non_loopback_targets_are_refused_before_any_request(tmp_path, capsys):
    assert main(["--base-url", "http://10.255.255.1:8000", "--out", str(tmp_path)]) == 3
    assert "not a loopback address" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and not is_loopback("10.255.255.1")


@pytest.mark.parametrize("args, words", [(["--levels", "everyone"], "choose from"),
                                         (["--no-salt"], "cannot test cross-tenant"),
                                         (["--share", "1.5"], "(0, 1]")])
def test_bad_audit_arguments_exit_3(args, words, tmp_path, capsys):
    assert main(["--base-url", "http://127.0.0.1:9", "--out", str(tmp_path), *args]) == 3
    assert words in capsys.readouterr().err


def test_ks_is_one_sided_toward_faster_hits():
    fast, slow = [0.010 + i * 1e-4 for i in range(25)], [0.050 + i * 1e-4 for i in range(25)]
    assert ks_faster(fast, slow).pvalue < 1e-8  # 25 + 25 fully separated: p = 1 / C(50, 25)
    assert ks_faster(slow, fast).pvalue > 0.5  # hits *slower* than misses is no evidence of sharing
    assert ks_faster(fast, fast).pvalue > 1e-3


def test_sequential_looks_split_alpha():
    plan = Plan(max_probes=500, sequential=True, look_every=50)
    assert plan.looks == 10 and plan.alpha_per_look == pytest.approx(1e-9)
    assert [n for n in range(1, 501) if plan.is_look(n)] == list(range(50, 501, 50))
    fixed = Plan(max_probes=500, sequential=False, look_every=50)
    assert fixed.looks == 1 and [n for n in range(1, 501) if fixed.is_look(n)] == [500]


def test_attacker_prompt_shares_exactly_the_requested_fraction():
    import random

    rng = random.Random(0)
    p = Procedure(letters=100, share=0.95, victim_repeats=1)
    victim = p.prompt(rng)
    attacker = p.attacker_prompt(rng, victim).split(" ")
    v = victim.split(" ")
    assert attacker[:95] == v[:95] and attacker[95] != v[95] and len(attacker) == 100
    assert Procedure(100, 1.0, 1).attacker_prompt(rng, victim) == victim


def test_verdict_and_exit_code():
    plan = Plan(10, sequential=False, look_every=10)

    def level(name, detected):
        r = LevelResult(name, plan, hits=[0.01] * 5, misses=[0.05 if detected else 0.01] * 5, stopped="budget")
        r.looks.append(ks_faster(r.hits, r.misses) if not detected else ks_faster([0.01] * 30, [0.05] * 30))
        return r

    assert decide([level("same-user", True), level("cross-tenant", True)])[0] == 1
    assert decide([level("same-user", True), level("cross-tenant", False)])[0] == 0
    assert decide([level("same-user", False), level("cross-tenant", False)])[0] == 2
