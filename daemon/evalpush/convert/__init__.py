"""The convert stage: one trace line -> one platform sample, and the run's aggregates.

The rules are docs/TRACE_FORMAT.md sections 4-6, which restate what verifiers' own push does, so a
run uploaded by evalpush looks exactly like one the eval pushed itself. One module per concern:

- `trace`: the line as a typed, checked `Trace` (`decode_trace`; every failure a `BadRecord`),
  and the few fields the totals need (`decode_tally`);
- `sample`: the derived views and the sample built from a checked trace;
- `totals`: the run's aggregates as running sums (`RunTotals`) and its `summary`;
- `lines`: a run's lines as encoded samples or `SetAside` records (`convert_lines`), and the
  first passes that only sum them (`tally`, cheap; `scan`, fully checked), line by line (`Pass`).
"""

from evalpush.convert.lines import Converted, Pass, Scan, convert_lines, scan, tally
from evalpush.convert.sample import build_sample, encode_sample
from evalpush.convert.totals import RolloutCounter, RunTotals, summary
from evalpush.convert.trace import Tally, Trace, decode_tally, decode_trace

__all__ = [
    "Converted",
    "Pass",
    "RolloutCounter",
    "RunTotals",
    "Scan",
    "Tally",
    "Trace",
    "build_sample",
    "convert_lines",
    "decode_tally",
    "decode_trace",
    "encode_sample",
    "scan",
    "summary",
    "tally",
]
