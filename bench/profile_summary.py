"""Summarise a py-spy raw profile (collapsed stacks): where the samples' leaves are, and which frames
hold the most samples inclusively, optionally only frames whose file matches a filter.

    py-spy record -p PID -d 60 -r 50 --nonblocking --format raw -o serve.txt
    python bench/profile_summary.py serve.txt --top 15 --inclusive-filter mia_engine
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """``func (path/to/module.py:123)`` → ``func (module.py)``: lines folded so one function is one row."""
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    return f"{match['func']} ({Path(match['file']).name})"


def summarise(path: Path, top: int, inclusive_filter: str | None) -> str:
    leaves: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [f for f in stack.split(";") if f.strip()]
        if not frames:
            continue
        leaves[frame_name(frames[-1])] += count
        for name in {frame_name(f) for f in frames if inclusive_filter is None or inclusive_filter in f}:
            inclusive[name] += count
    rows = [f"{path.name}: {total} samples"]
    rows.append("self (leaf frames):")
    rows += [f"  {100 * n / total:5.1f}%  {name}" for name, n in leaves.most_common(top)]
    rows.append(f"inclusive{f' (frames in {inclusive_filter!r})' if inclusive_filter else ''}:")
    rows += [f"  {100 * n / total:5.1f}%  {name}" for name, n in inclusive.most_common(top)]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profiles", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--inclusive-filter", help="count only frames whose text contains this, e.g. mia_engine")
    args = parser.parse_args()
    for path in args.profiles:
        print(summarise(path, args.top, args.inclusive_filter) + "\n")


if __name__ == "__main__":
    main()
