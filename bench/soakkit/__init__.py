"""The soak's world, in parts that `bench/soak.py` and `tests/test_soak.py` both use.

- `plan`: what each run will be (how it becomes ready, what is wrong with it, where it lives);
  deterministic for a seed.
- `writers`: writer processes that write the planned runs line by line into the watched tree
  and record what they wrote in a manifest (the accounting's truth, never evalpush's ledger).
- `platform`: `evalpush local-platform` as its own process, reached over its HTTP control API.
- `chaos`: faults and outages injected into that platform at set rates.
- `uploaders`: what uploads the tree: `evalpush push` processes (push-only) or `evalpush run`
  (daemon), SIGKILLed at random moments and restarted, with overlapping pushes beside them.
- `accounting`: per run, what the platform stored against what the writers wrote.
- `soak`: `run_soak(SoakParams) -> SoakReport`, the whole thing, bounded in time and count.

Only loopback; every process the soak starts is stopped by it, by pid.
"""
