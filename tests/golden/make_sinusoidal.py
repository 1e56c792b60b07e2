"""Regenerates the numbers in sinusoidal.json from the paper's formula with the standard library only.

Run: python tests/golden/make_sinusoidal.py  (prints rows to compare with the JSON by eye).
"""

import math


def paper_row(p, d, base=10000.0):
    return [
        (math.sin if j % 2 == 0 else math.cos)(p / base ** (2 * (j // 2) / d)) for j in range(d)
    ]


def t2t_row(p, d, base=10000.0):
    h = d // 2
    inv = [math.exp(-k * math.log(base) / max(h - 1, 1)) for k in range(h)]
    return [math.sin(p * w) for w in inv] + [math.cos(p * w) for w in inv] + [0.0] * (d % 2)


if __name__ == "__main__":
    for d, p, b in [(4, 0, 1e4), (4, 1, 1e4), (4, 3, 1e4), (6, 1, 1e4), (6, 3, 1e4), (2, 2, 1e4), (3, 1, 1e4), (4, 1, 100.0)]:
        print("interleaved", d, p, b, [round(v, 6) for v in paper_row(p, d, b)])
    for d in (4, 5, 2):
        print("tensor2tensor", d, 1, [round(v, 6) for v in t2t_row(1, d)])
    print("inner product", sum(math.cos(7 / 1e4 ** (2 * i / 64)) for i in range(32)))
