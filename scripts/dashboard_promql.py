"""A small PromQL evaluator for the queries of deploy/grafana/sam-box.json, run on scrapes a
script took itself (scripts/render-dashboard). Not a Prometheus: it knows exactly the subset
the dashboard uses, and refuses anything else with the reason, so a query added to the
dashboard that it cannot evaluate fails the renderer (and tests/integration/test_dashboard.py)
instead of drawing something else.

Grammar (Prometheus's own spelling, https://prometheus.io/docs/prometheus/latest/querying/):

    expr     := term ( "/" term )*
    term     := ("sum" | "sort_desc") [ "by" "(" labels ")" ] "(" expr ")"
              | ("rate" | "increase") "(" selector "[" duration "]" ")"
              | selector | "(" expr ")"
    selector := metric [ "{" matcher ( "," matcher )* "}" ]
    matcher  := label ( "=" | "!=" | "=~" | "!~" ) "string"

`sort_desc` takes no `by`. Grafana variables ($agent, $__rate_interval, $__range) are
replaced from `env` before parsing: durations by seconds, others by their text.

Scrapes are `[(t, {(metric, ((label, value), ...)): value})]`, t in seconds, ascending.
evaluate() returns `{labels: value}` at time t, labels a sorted tuple of (name, value) pairs
(the metric name as `__name__` for a plain selector). rate() and increase() use the samples
of the window (t - range, t], need two of them, handle counter resets as Prometheus does,
and do not extrapolate to the window's edges: increase = what the counter rose by between
the first and last sample in the window, rate = that divided by their time apart.
"""

import re

_TOKEN = re.compile(r"""\s*(?:
    (?P<num>\d+(?:\.\d+)?s)              # a duration, after variable substitution
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<op>=~|!~|!=|=|[(){}\[\],/])
)""", re.X)

FUNCS_RANGE = ("rate", "increase")
AGGR = ("sum", "sort_desc")


class Unsupported(ValueError):
    """A query outside the subset (the message says where)."""


def substitute(expr, env):
    def var(m):
        name = m.group(0)
        if name not in env:
            raise Unsupported(f"{expr!r}: unknown variable {name}")
        value = env[name]
        return f"{value:g}s" if isinstance(value, (int, float)) else str(value)

    return re.sub(r"\$[a-zA-Z_][a-zA-Z0-9_]*", var, expr)


def tokenize(expr):
    out, pos = [], 0
    while pos < len(expr):
        if expr[pos:].strip() == "":
            break
        m = _TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            raise Unsupported(f"{expr!r}: cannot read from {expr[pos:pos + 20]!r}")
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Parser:
    def __init__(self, expr):
        self.expr = expr
        self.toks = tokenize(expr)
        self.i = 0

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else (None, None)

    def take(self, value=None, kind=None):
        k, v = self.peek()
        if (value is not None and v != value) or (kind is not None and k != kind):
            want = value or kind
            raise Unsupported(f"{self.expr!r}: expected {want!r}, found {v!r}")
        self.i += 1
        return v

    def parse(self):
        node = self.expr_()
        if self.i != len(self.toks):
            raise Unsupported(f"{self.expr!r}: unexpected {self.peek()[1]!r}")
        return node

    def expr_(self):
        node = self.term()
        while self.peek()[1] == "/":
            self.take("/")
            node = ("div", node, self.term())
        return node

    def term(self):
        k, v = self.peek()
        if v == "(":
            self.take("(")
            node = self.expr_()
            self.take(")")
            return node
        if k != "ident":
            raise Unsupported(f"{self.expr!r}: unexpected {v!r}")
        if v in AGGR:
            self.take()
            by = None
            if self.peek()[1] == "by":
                if v != "sum":
                    raise Unsupported(f"{self.expr!r}: {v} takes no `by`")
                self.take("by")
                by = self.labels()
            self.take("(")
            inner = self.expr_()
            self.take(")")
            return (v, by, inner)
        if v in FUNCS_RANGE:
            self.take()
            self.take("(")
            sel = self.selector()
            self.take("[")
            rng = float(self.take(kind="num")[:-1])
            self.take("]")
            self.take(")")
            return (v, sel, rng)
        if self.i + 1 < len(self.toks) and self.toks[self.i + 1][1] == "(":
            raise Unsupported(f"{self.expr!r}: function {v}() is not in the subset")
        return self.selector()

    def labels(self):
        self.take("(")
        names = [self.take(kind="ident")]
        while self.peek()[1] == ",":
            self.take(",")
            names.append(self.take(kind="ident"))
        self.take(")")
        return tuple(names)

    def selector(self):
        name = self.take(kind="ident")
        matchers = []
        if self.peek()[1] == "{":
            self.take("{")
            while True:
                label = self.take(kind="ident")
                op = self.take(kind="op")
                if op not in ("=", "!=", "=~", "!~"):
                    raise Unsupported(f"{self.expr!r}: bad matcher operator {op!r}")
                raw = self.take(kind="str")
                value = raw[1:-1].encode().decode("unicode_escape")
                matchers.append((label, op, value))
                if self.peek()[1] == ",":
                    self.take(",")
                    continue
                self.take("}")
                break
        return ("sel", name, tuple(matchers))


def parse(expr):
    """The syntax tree of expr (variables already substituted)."""
    return _Parser(expr).parse()


def metric_names(expr):
    """Every metric name a query selects (variables may still be in it)."""
    names = []

    def walk(node):
        if node[0] == "sel":
            names.append(node[1])
        elif node[0] == "div":
            walk(node[1])
            walk(node[2])
        elif node[0] in AGGR:
            walk(node[2])
        elif node[0] in FUNCS_RANGE:
            walk(node[1])

    placeholder = re.sub(r"\[\$[a-zA-Z_]+\]", "[1s]", expr)
    placeholder = re.sub(r"\$[a-zA-Z_]+", ".*", placeholder)
    walk(parse(placeholder))
    return names


def _matches(labels, matchers):
    d = dict(labels)
    for label, op, value in matchers:
        have = d.get(label, "")
        if op == "=" and have != value:
            return False
        if op == "!=" and have == value:
            return False
        if op == "=~" and not re.fullmatch(value, have):
            return False
        if op == "!~" and re.fullmatch(value, have):
            return False
    return True


def _select(scrapes, name, matchers, t_from, t_to):
    """{labels: [(t, v)]} for samples with t_from < t <= t_to."""
    out = {}
    for t, samples in scrapes:
        if t <= t_from or t > t_to + 1e-9:
            continue
        for (metric, labels), v in samples.items():
            if metric == name and _matches(labels, matchers):
                out.setdefault(labels, []).append((t, v))
    return out


def _eval(node, scrapes, t):
    kind = node[0]
    if kind == "sel":
        _, name, matchers = node
        # An instant vector: each series' latest sample at or before t (5 min lookback).
        out = {}
        for labels, pts in _select(scrapes, name, matchers, t - 300, t).items():
            out[tuple(sorted(labels + (("__name__", name),)))] = pts[-1][1]
        return out
    if kind in FUNCS_RANGE:
        _, (_, name, matchers), rng = node
        out = {}
        for labels, pts in _select(scrapes, name, matchers, t - rng, t).items():
            if len(pts) < 2:
                continue
            rise = 0.0
            for (_, a), (_, b) in zip(pts, pts[1:]):
                rise += b - a if b >= a else b  # a counter reset starts from zero
            span = pts[-1][0] - pts[0][0]
            out[labels] = rise if kind == "increase" else (rise / span if span > 0 else 0.0)
        return out
    if kind == "sum":
        _, by, inner = node
        out = {}
        for labels, v in _eval(inner, scrapes, t).items():
            key = tuple((k, val) for k, val in labels if by is not None and k in by)
            out[key] = out.get(key, 0.0) + v
        return out
    if kind == "sort_desc":
        res = _eval(node[2], scrapes, t)
        return dict(sorted(res.items(), key=lambda kv: -kv[1]))
    if kind == "div":
        left, right = _eval(node[1], scrapes, t), _eval(node[2], scrapes, t)

        def key(labels):
            return tuple(p for p in labels if p[0] != "__name__")

        rmap = {key(ls): v for ls, v in right.items()}
        out = {}
        for ls, v in left.items():
            r = rmap.get(key(ls))
            if r is None:
                continue
            out[key(ls)] = v / r if r != 0 else float("nan")
        return out
    raise Unsupported(f"node {kind}")


def evaluate(expr, scrapes, t, env):
    """The query's instant vector at time t, as {labels: value}."""
    return _eval(parse(substitute(expr, env)), scrapes, t)


def legend(fmt, labels):
    """Grafana's legendFormat: {{label}} replaced by the series' label value."""
    d = dict(labels)
    return re.sub(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", lambda m: d.get(m.group(1), ""),
                  fmt) or "value"
