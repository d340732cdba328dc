#!/usr/bin/env python3
"""Record what nvidia-smi answers, read-only, for tests of `gpuenv status --query-gpu`:
`nvidia-smi --help-query-gpu` and, for every field it lists, the CSV header and value
with and without units (one query per field: one unknown name fails a whole query).

    python3 scripts/record_nvidia_smi.py OUTDIR
writes OUTDIR/help-query-gpu.txt and OUTDIR/query-fields.tsv
(field, rc, header, value, header_nounits, value_nounits).
"""

import os
import re
import subprocess
import sys


def smi(*args: str) -> tuple[int, list[str]]:
    p = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
    return p.returncode, (p.stdout + p.stderr).splitlines()


def main() -> int:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    _, lines = smi("--help-query-gpu")
    with open(os.path.join(out, "help-query-gpu.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    fields = []
    for line in lines:
        for name in re.findall(r'"([a-z][a-z0-9_.]*)"', line) if line.startswith('"') else []:
            if name not in fields:
                fields.append(name)
    with open(os.path.join(out, "query-fields.tsv"), "w") as f:
        f.write("field\trc\theader\tvalue\theader_nounits\tvalue_nounits\n")
        for name in fields:
            rc1, a = smi(f"--query-gpu={name}", "--format=csv")
            _, b = smi(f"--query-gpu={name}", "--format=csv,nounits")
            a, b = [*a, "", ""], [*b, "", ""]
            cells = [a[0], a[1], b[0], b[1]]
            f.write("\t".join([name, str(rc1), *cells]) + "\n")
    print(f"{len(fields)} fields recorded in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
