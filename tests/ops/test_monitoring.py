# SPDX-License-Identifier: Apache-2.0
"""
test_monitoring.py - the alert rules and the dashboard of docs/ops/ work with what
orderd and idem-gateway really export.

  alert...      docs/ops/alerts.yml passes `promtool check rules`; its unit tests
                (docs/ops/alerts_test.yml) pass `promtool test rules`, and they fire at least two
                alerts; every metric an alert names is on a running orderd's or idem-gateway's
                /metrics; every alert has a section of docs/ops.md that its runbook_url points to.
  dashboard...  docs/ops/dashboard.json parses as a Grafana dashboard; every query parses as
                PromQL (promtool) and names only metrics a running orderd or idem-gateway
                exports; every metric an alert uses is on the dashboard.

`test_monitoring.py alert` or `... dashboard` runs one half (ctest ops.alerts, ops.dashboard).
promtool comes from Debian's `prometheus` package (scripts/deps.sh test).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "service"))

import yaml  # noqa: E402

from harness import Server, expect, expect_eq, fail, run, test  # noqa: E402

OPS = os.path.join(REPO, "docs", "ops")
ALERTS = os.path.join(OPS, "alerts.yml")
ALERTS_TEST = os.path.join(OPS, "alerts_test.yml")
DASHBOARD = os.path.join(OPS, "dashboard.json")
OPS_MD = os.path.join(REPO, "docs", "ops.md")

# PromQL words that are not metric names.
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "by", "without", "on", "ignoring", "group_left", "group_right",
    "and", "or", "unless", "bool", "offset", "rate", "irate", "increase", "delta", "idelta",
    "deriv", "predict_linear", "histogram_quantile", "time", "timestamp", "abs", "ceil", "floor",
    "round", "clamp", "clamp_min", "clamp_max", "absent", "absent_over_time", "changes",
    "resets", "avg_over_time", "max_over_time", "min_over_time", "sum_over_time",
    "count_over_time", "last_over_time", "label_replace", "label_join", "vector", "scalar",
    "sort", "sort_desc", "inf", "nan", "e",
}


def promtool():
    path = shutil.which("promtool")
    if not path:
        fail("promtool is not installed (Debian package prometheus): run scripts/deps.sh test")
    return path


def metric_names(expr):
    """The metric names a PromQL expression reads."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)            # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)                      # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)                     # ranges ([5m], [$__rate_interval])
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for word in re.findall(r"[A-Za-z0-9_:.]+", text):
        # Numbers and durations (0.99, 5m after offset) start with a digit or a dot.
        if word.lower() in PROMQL_WORDS or word[0].isdigit() or word[0] == ".":
            continue
        names.add(word)
    return names


class Ctx:
    """What a running orderd and idem-gateway export: every sample name of their /metrics."""

    def __init__(self):
        self._exported = None
        self.servers = []

    def exported(self):
        if self._exported is not None:
            return self._exported
        from gateway_harness import Gateway, Upstream
        names = set()
        with Server(name="monitoring-orderd", extra_args=["--provider", "http://127.0.0.1:9",
                                                          "--provider-timeout-ms", "100"]) as s:
            r = s.client().get("/metrics")
            expect_eq(r.status, 200, "orderd /metrics")
            names |= self._names(r.body.decode())
        up = Upstream()
        gw = Gateway(up, name="monitoring-gateway")
        try:
            gw.start()
            r = gw.admin("GET", "/metrics")
            expect_eq(r.status, 200, "idem-gateway /metrics")
            names |= self._names(r.body.decode())
        finally:
            gw.close()
            up.close()
        for must in ("orderd_requests_total", "orderd_outbox_messages",
                     "idem_gateway_requests_total", "idem_gateway_store_seconds_bucket"):
            expect(must in names, "%s is not on /metrics: %s" % (must, sorted(names)))
        names.add("up")  # what Prometheus adds to every scrape
        self._exported = names
        return names

    @staticmethod
    def _names(text):
        return {m.group(1) for m in re.finditer(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)", text, re.M)}

    def close(self):
        pass


def alert_rules():
    with open(ALERTS, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    rules = [r for g in doc["groups"] for r in g["rules"]]
    expect(rules, "no rules in %s" % ALERTS)
    return rules


# ---- alerts ------------------------------------------------------------------------------------

@test
def alerts_pass_promtool_check_rules(_):
    p = subprocess.run([promtool(), "check", "rules", ALERTS], capture_output=True, text=True,
                       timeout=60)
    if p.returncode != 0:
        fail("promtool check rules %s:\n%s%s" % (ALERTS, p.stdout, p.stderr))
    expect("SUCCESS" in p.stdout, "promtool said: %s" % p.stdout)


@test
def alerts_pass_their_unit_tests_and_fire(_):
    p = subprocess.run([promtool(), "test", "rules", ALERTS_TEST], capture_output=True,
                       text=True, timeout=60)
    if p.returncode != 0:
        fail("promtool test rules %s:\n%s%s" % (ALERTS_TEST, p.stdout, p.stderr))
    # The unit tests must show alerts firing, not only silence.
    with open(ALERTS_TEST, encoding="utf-8") as f:
        tests = yaml.safe_load(f)["tests"]
    fired = {t["alertname"] for case in tests for t in case.get("alert_rule_test", [])
             if t.get("exp_alerts")}
    expect(len(fired) >= 2, "the unit tests show only %s firing" % sorted(fired))
    known = {r["alert"] for r in alert_rules() if "alert" in r}
    expect(fired <= known, "unit tests of alerts that do not exist: %s" % sorted(fired - known))


@test
def alerts_read_exported_metrics_and_have_a_runbook(ctx):
    exported = ctx.exported()
    with open(OPS_MD, encoding="utf-8") as f:
        ops = f.read()
    anchors = {re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
               for h in re.findall(r"^#+ (.+)$", ops, re.M)}
    problems = []
    for r in alert_rules():
        name = r.get("alert") or r.get("record")
        used = metric_names(r["expr"])
        if not used:
            problems.append("%s: no metric in %r" % (name, r["expr"]))
        for m in sorted(used - exported):
            problems.append("%s: %s is not exported by orderd or idem-gateway" % (name, m))
        if "alert" in r:
            url = (r.get("annotations") or {}).get("runbook_url", "")
            want = "docs/ops.md#" + name.lower()
            if url != want:
                problems.append("%s: runbook_url %r, expected %r" % (name, url, want))
            if name.lower() not in anchors:
                problems.append("%s: docs/ops.md has no section '%s'" % (name, name))
            if (r.get("labels") or {}).get("severity") not in ("page", "ticket"):
                problems.append("%s: severity must be page or ticket" % name)
    if problems:
        fail("docs/ops/alerts.yml:\n  " + "\n  ".join(problems))


# ---- dashboard ---------------------------------------------------------------------------------

def dashboard_targets(dash):
    """(panel, target) for every query of the dashboard, rows' panels included."""
    out = []

    def visit(panels):
        for p in panels:
            for t in p.get("targets") or []:
                out.append((p, t))
            visit(p.get("panels") or [])
    visit(dash.get("panels") or [])
    return out


def grafana_to_promql(expr):
    """A panel's query with Grafana's variables given values Prometheus accepts."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*", expr)


@test
def dashboard_parses_and_queries_exported_metrics(ctx):
    with open(DASHBOARD, encoding="utf-8") as f:
        dash = json.load(f)
    for key in ("title", "uid", "panels", "schemaVersion", "templating"):
        expect(key in dash, "dashboard.json has no %r" % key)
    ids = [p["id"] for p in dash["panels"]]
    expect(len(ids) == len(set(ids)), "panel ids repeat: %s" % ids)
    for p in dash["panels"]:
        g = p.get("gridPos") or {}
        expect(all(k in g for k in ("x", "y", "w", "h")) and g["x"] + g["w"] <= 24,
               "panel %r: gridPos %r" % (p.get("title"), g))
        if p["type"] != "row":
            expect(p.get("targets"), "panel %r has no query" % p.get("title"))
    targets = dashboard_targets(dash)
    expect(len(targets) >= 20, "only %d queries on the dashboard" % len(targets))

    exported = ctx.exported()
    problems, used = [], set()
    for p, t in targets:
        names = metric_names(t["expr"])
        used |= names
        if not names:
            problems.append("panel %r: no metric in %r" % (p["title"], t["expr"]))
        for m in sorted(names - exported):
            problems.append("panel %r: %s is not exported by orderd or idem-gateway" % (
                p["title"], m))
    for var in dash["templating"]["list"]:
        q = var.get("definition") or ""
        m = re.fullmatch(r"label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*),\s*[a-z_]+\)", q)
        if var["type"] == "query":
            if not m:
                problems.append("variable %s: query %r is not label_values(metric, label)" % (
                    var["name"], q))
            elif m.group(1) not in exported:
                problems.append("variable %s: %s is not exported" % (var["name"], m.group(1)))
    # The dashboard shows what the alerts watch.
    for r in alert_rules():
        for m in sorted(metric_names(r["expr"]) - used - {"up"}):
            problems.append("alert %s watches %s, which no panel shows" % (r["alert"], m))
    if problems:
        fail("docs/ops/dashboard.json:\n  " + "\n  ".join(problems))

    # Every query is PromQL that Prometheus parses: promtool checks them as recording rules.
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": "dashboard:panel_%d_%s" % (p["id"], t["refId"]),
         "expr": grafana_to_promql(t["expr"])} for p, t in targets]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump(rules, f)
        path = f.name
    try:
        c = subprocess.run([promtool(), "check", "rules", path], capture_output=True, text=True,
                           timeout=60)
    finally:
        os.unlink(path)
    if c.returncode != 0:
        fail("a dashboard query is not valid PromQL:\n%s%s" % (c.stdout, c.stderr))


@test
def dashboard_and_alert_query_reader_finds_metric_names(_):
    # The extractor the checks above rely on.
    got = metric_names('histogram_quantile(0.99, sum by (job, le) (rate(x_seconds_bucket'
                       '{instance=~"$i", le!="+Inf"}[$__rate_interval]))) > 0.5 and on (job) '
                       'up{job="orderd"} == 1 unless time() - y_total offset 5m')
    expect_eq(got, {"x_seconds_bucket", "up", "y_total"}, "metric names of a query")


if __name__ == "__main__":
    run("test_monitoring", setup=Ctx, teardown=lambda ctx: ctx and ctx.close())
