"""Rewrite every golden case's ``expected_report.json`` (``make golden``). Review the diff.

Run: ``.venv/bin/python tests/golden/regenerate.py [CASE ...]`` (default: every case).
"""

from __future__ import annotations

import sys

from golden_harness import CASES, CASES_DIR, EXPECTED, run_case


def main(argv: list[str]) -> int:
    names = argv or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"regenerate: unknown case(s) {', '.join(unknown)}", file=sys.stderr)
        return 2
    for name in names:
        path = CASES_DIR / name / EXPECTED
        text = run_case(name)
        before = path.read_text(encoding="utf-8") if path.exists() else None
        path.write_text(text, encoding="utf-8", newline="\n")
        status = "new" if before is None else "unchanged" if before == text else "CHANGED"
        print(f"{status:>9}  {path.relative_to(CASES_DIR.parent.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
