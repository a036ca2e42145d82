"""The upload stage: one run's state machine, scan -> resolve -> create -> push -> finalize.

A run is uploaded only under its claim (`evalpush.ledger.claims`): taken before anything is read or
sent, released on every way out Python sees; every ledger write is fenced by it. A run another
live process holds is left alone (`Busy`); one whose holder is gone is taken over and resumed
exactly as after a crash, from what its row records (an intent is reconciled with a read).

Exactly once, step by step (docs/ARCHITECTURE.md tells the whole protocol):
- scan: one cheap pass over the trace file fixes the byte range to upload, its fingerprint
  (a SHA-256 of that range), the totals the create carries and the bad lines it can see, all
  recorded before anything is sent (with `convert.on_bad_line = "hold"` the pass checks every
  line fully, so a run is held before anything is sent); the file is checked against the
  fingerprint before each batch and when an upload resumes, so an evaluation never holds samples
  of two files; the finalize carries conversion's own exact totals;
- resolve: replayable (get-or-create), so it is simply retried;
- create: the intent is recorded before the request and the evaluation id after it. Before it,
  for a run id the ledger never saw, after an ambiguous failure or a crash in between, or when
  the eval may have pushed itself, the platform is searched for one whose `metadata.run_id`
  matches (and is not an earlier evaluation of this run), which is adopted instead of creating
  a second (`evalpush.client.lookup`);
- push: each batch's byte range is recorded before it is sent and the acknowledged offset after;
  an ambiguous failure or a crash in between is reconciled by listing the evaluation's sample
  ids, and only samples not already stored are sent;
- finalize: intent first; after an ambiguous failure the evaluation's status decides, and a 409
  (already finalized) counts as done.
The ledger moves only on the platform's acknowledgement.

The modules: `uploader` (the entry point: claim, admit, drive the steps, record the outcome),
`admission` (what a request to upload a run comes to: skipped, moved, copied, its file changed),
`steps` (the five protocol steps), `reconcile` (the reads that settle what an ambiguous failure
or a crash left open), `files` (the trace file against its fingerprint), `crash` (the points the
crash tests kill at).
"""

from evalpush.upload.admission import still_there
from evalpush.upload.batch import Batch, Prefetch, batches
from evalpush.upload.crash import CRASH_ENV
from evalpush.upload.prescan import Prescan, RunningScan
from evalpush.upload.uploader import Progress, Uploader

__all__ = [
    "CRASH_ENV",
    "Batch",
    "Prefetch",
    "Prescan",
    "Progress",
    "RunningScan",
    "Uploader",
    "batches",
    "still_there",
]
