"""Codec decode: the core's plain-JSON fast path (`serde_json` + `pythonize`)
against the Python codec's own C-accelerated `json` scan, per value shape.
Both sides decode the same stored text; nanoseconds per decode, best of 5.
The core side is forced for every shape; `core_path_<shape>` says whether
`loads` takes it (text up to 256 bytes, where the core is faster)."""

from __future__ import annotations

import json
import timeit

from _common import emit, parser

SHAPES = {
    "int": "12",
    "float": "3.14159",
    "short_str": json.dumps("hello world"),
    "list_100_ints": json.dumps(list(range(100))),
    "str_1k": json.dumps("x" * 1000),
    "small_dict": json.dumps({"a": 1, "b": "x", "c": [1, 2, 3], "d": None}),
    "messages_20": json.dumps(
        [{"role": "user", "parts": [{"kind": "text", "text": f"hello {i}"}]} for i in range(20)]
    ),
}


def main() -> None:
    args = parser(__doc__.splitlines()[0], 20000).parse_args()
    from composeai import _codec, _core

    miss = object()
    scan = _codec._scan_once  # the Python codec's C-accelerated scan
    record = {"workload": "codec", "n": args.n}
    for name, text in SHAPES.items():
        assert _core.loads_plain(text, miss, limited=False) == json.loads(text), name

        def core(text=text):
            return _core.loads_plain(text, miss, limited=False)

        def python(text=text):
            return scan(text, 0)[0]

        for side, fn in (("python", python), ("core", core)):
            best = min(timeit.repeat(fn, number=args.n, repeat=5)) / args.n * 1e9
            record[f"ns_{side}_{name}"] = round(best, 1)
        # Whether `loads` hands this shape to the core (the faster side).
        record[f"core_path_{name}"] = _core.loads_plain(text, miss) is not miss
    emit(record)


if __name__ == "__main__":
    main()
