# SPDX-License-Identifier: Apache-2.0
"""
bench_fmt.py - how the benchmark reports print their numbers.
"""




def fmt_rate(v):
    return "—" if v is None else ("%.0f" % v)


def fmt_ms(v):
    if v is None:
        return "—"
    return "%.2f" % v if v < 10 else "%.1f" % v if v < 100 else "%.0f" % v


def fmt_ratio(v):
    return "—" if v is None else "%.2f×" % v


def fmt_us(v):
    return "—" if v is None else "%.0f" % v


def mean(xs):
    """The mean of the numbers of `xs` that are not None; None when there is none."""
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None
