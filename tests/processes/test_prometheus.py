"""Pull path with a real Prometheus (Debian's ``prometheus``): it scrapes the scheduler's
own ``/metrics`` (dashboard port) while a workflow with nested spans runs; assertions are
PromQL queries through its HTTP API. Also that every metric a deploy/ dashboard queries
is in a real scrape (deploy/'s files themselves: client/test_deploy.py)."""
from __future__ import annotations

import json
import re
import subprocess
import time
import urllib.request

import pytest
import yaml
from distributed import Client
from support.paths import DEPLOY
from support.polling import wait_for
from support.processes import DaskProcesses, free_port
from support.prometheus import prometheus_binary, promql, promtool_check_metrics

from dask_otel_spans import span, wait_for_export

SLEEP, N_TASKS = 0.2, 5


def sleepy(x: float) -> float:
    time.sleep(x)
    return x


def inc(x: int) -> int:
    return x + 1


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """A scheduler with OTEL_METRICS_EXPORTER=prometheus, two workers, a workflow run,
    and a Prometheus scraping the scheduler's /metrics every second."""
    tmp = tmp_path_factory.mktemp("prom")
    procs = DaskProcesses(
        {"OTEL_METRICS_EXPORTER": "prometheus", "OTEL_TRACES_EXPORTER": "none",
         # (progress of every span, for the dashboard's dask_span_tasks)
         "DASK_OTEL_SPANS__LIVE__AFTER": "0s", "DASK_OTEL_SPANS__LIVE__INTERVAL": "0.2s"},
        cwd=str(tmp), workers=2, dashboard=True,
    )
    prom_port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [{
            "job_name": "dask-scheduler",
            "metrics_path": "/metrics",
            "static_configs": [{"targets": [f"127.0.0.1:{procs.dashboard_port}"]}],
        }],
    }))
    prom = subprocess.Popen(
        [prometheus_binary("prometheus"), f"--config.file={config}",
         f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        with Client(procs.address, timeout=60) as client:
            client.wait_for_workers(2, timeout=60)
            a, b = list(client.scheduler_info()["workers"])
            with span("tenant=acme", "etl"):
                with span("sleep step"):
                    client.gather(client.map(sleepy, [SLEEP] * N_TASKS, pure=False))
                with span("transfer step"):
                    x = client.submit(inc, 1, workers=[a], key="on-a")
                    client.submit(inc, x, workers=[b], key="on-b").result()
            url = f"http://127.0.0.1:{procs.dashboard_port}/metrics"

            def scrape():
                text = urllib.request.urlopen(url, timeout=5).read().decode()
                return text if "dask_span_duration_seconds_bucket" in text and \
                    "dask_worker_activity_time_seconds_total" in text else None

            text = wait_for(scrape, timeout=30, interval=0.5)
            # a scrape right after each of two flushes (each used to queue one
            # more collection, all yielded by the next scrape)
            after_flush = []
            for _ in range(2):
                wait_for_export(client)
                after_flush.append(urllib.request.urlopen(url, timeout=5).read().decode())
            # and one that only Prometheus scrapes after
            wait_for_export(client)
            flushed_at = time.time()
            yield {"prom": f"http://127.0.0.1:{prom_port}", "scrape": text,
                   "metrics_url": url, "after_flush": after_flush,
                   "flushed_at": flushed_at}
    finally:
        prom.terminate()
        prom.wait(30)
        procs.stop()


def test_a_scrape_right_after_a_flush_is_valid_exposition(scraped):
    for text in scraped["after_flush"]:
        assert text.count("# TYPE dask_span_active gauge") == 1
        check = promtool_check_metrics(text)
        assert check.returncode == 0, check.stdout + check.stderr


def test_prometheus_scrapes_the_scheduler_after_a_flush_without_error(scraped):
    def target_scraped_after_the_flush():
        try:
            reply = json.load(urllib.request.urlopen(
                f"{scraped['prom']}/api/v1/targets", timeout=5))
        except OSError:
            return None  # (Prometheus still starting)
        targets = reply["data"]["activeTargets"]
        if not targets:
            return None  # (not discovered yet)
        [target] = targets
        last = target["lastScrape"]
        if last.startswith("0001"):  # (not scraped yet)
            return None
        # (RFC 3339 with nanoseconds: compare as seconds since the epoch)
        from datetime import datetime

        when = datetime.fromisoformat(re.sub(r"(\.\d{6})\d*", r"\1", last)
                                      .replace("Z", "+00:00")).timestamp()
        return target if when > scraped["flushed_at"] else None

    target = wait_for(target_scraped_after_the_flush, timeout=30, interval=0.5)
    # (Prometheus 2.42 takes a repeated family without an error too: the promtool
    # checks above are what catches one)
    assert target["health"] == "up" and target["lastError"] == ""


def test_span_metrics_have_the_design_labels_in_prometheus(scraped):
    query = 'dask_span_activity_time_seconds_total{dask_span_name="tenant=acme/etl/sleep step"}'

    def with_idle_series():
        # the idle series is recorded when the span is emitted, after the heartbeats
        # (whose several activities of "sleepy" may be scraped first)
        got = promql(scraped["prom"], query)
        return got if any(s["metric"].get("dask_task_prefix") == "N/A" for s in got) else None

    series = wait_for(with_idle_series, timeout=30, interval=0.5)
    labels = series[0]["metric"]
    assert {"dask_span_name", "dask_task_prefix", "dask_activity", "dask_context",
            "dask_unit"} <= set(labels)
    # the task prefix, plus the synthetic "N/A" of "idle or other spans"
    assert {s["metric"]["dask_task_prefix"] for s in series} == {"sleepy", "N/A"}


def test_promql_sum_of_thread_time_matches_known_sleep(scraped):
    query = ('sum(dask_span_activity_time_seconds_total{dask_task_prefix="sleepy",'
             'dask_activity=~"thread-cpu|thread-noncpu"})')

    def total():
        result = promql(scraped["prom"], query)
        value = float(result[0]["value"][1]) if result else 0.0
        return value if value >= 0.9 * SLEEP * N_TASKS else None

    value = wait_for(total, timeout=30, interval=0.5)
    assert value == pytest.approx(SLEEP * N_TASKS, rel=0.2)


def test_worker_wide_transfer_metrics_in_prometheus(scraped):
    series = wait_for(
        lambda: promql(scraped["prom"], "dask_worker_activity_time_seconds_total"
                                        '{dask_context="gather-dep"}'),
        timeout=30, interval=0.5,
    )
    assert "dask_span_name" not in series[0]["metric"]


def test_every_dashboard_metric_is_in_a_real_scrape(scraped):
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "dask-spans.json").read_text())
    exprs = [
        t.get("expr", "") for p in dashboard["panels"] for t in p.get("targets", [])
    ] + [v.get("definition", "") for v in dashboard["templating"]["list"]]
    queried = set(re.findall(r"\b(dask_[a-z_]+)\b", " ".join(exprs)))
    queried -= {"dask_span_name", "dask_task_prefix", "dask_activity", "dask_context", "dask_unit",
                "dask_task_state"}
    assert len(queried) >= 6

    def missing() -> set[str]:
        text = urllib.request.urlopen(scraped["metrics_url"], timeout=5).read().decode()
        return queried - set(re.findall(r"^(dask_[a-z_]+)", text, re.M))

    # the last heartbeats' series (e.g. bytes read by the transfer step) reach the
    # scheduler's registry up to a heartbeat and a metrics send-interval later
    try:
        wait_for(lambda: not missing(), timeout=30, interval=0.5)
    except AssertionError:
        raise AssertionError(f"never scraped: {sorted(missing())}") from None
