"""crucible.compile's counters, summed over every compiled step of the process (live ones and
those already garbage-collected): what crucible.stats()["compiled"] reports."""
import threading
import weakref

_lock = threading.Lock()
COUNTERS = ("calls", "plan_runs", "eager_calls", "captures", "plans_built", "guard_misses",
             "guard_failures", "plan_updates", "hyper_learned", "rebinds", "replans",
             "verifications", "divergences", "refusals", "impure_captures", "sync_calls", "sync_native",
             "sync_mismatches", "optimizer_plan_runs", "size_waits", "sizes_derived", "sizes_evicted",
             "sizes_bound")
_compile_totals = {k: 0 for k in COUNTERS}   # of compiled steps already garbage-collected
live_steps = weakref.WeakSet()


def retire_stats(stats):
    with _lock:
        for k, v in stats.items():
            _compile_totals[k] += v


def compiled_totals() -> dict:
    with _lock:
        d = dict(_compile_totals)
    for step in list(live_steps):
        for k, v in step._stats.items():
            d[k] += v
    return d

