#!/usr/bin/env python3
"""PyTorch's own distributed test suite on dtrain and on Gloo, same run, compared test by test.

    python3 torch_suite.py --module-dir DIR [--world-size 3] [-k PATTERN] [--json OUT]

The suite is `torch.testing._internal.distributed.distributed_test`'s DistributedTest, the one
torch's test/distributed/test_distributed_spawn.py runs for Gloo; here with "dtrain" added to
the suite's backend feature sets for what it supports (a plugin backend that does DDP and
sub-groups). Where the suite gates a test on the backend's name being Gloo's
(`require_backend({"gloo", ...})`, `sandcastle_skip_if(BACKEND != "gloo", ...)`), the dtrain run
admits dtrain too: the suite is loaded from its source with those gates widened (GATES), so the
tests of CPU features only Gloo had run on dtrain instead of skipping.

Each backend's tests run in a process of their own, the two at once (BACKEND set, as torch's
runner sets it); each test starts its ranks by fork from that process (torch's runner spawns
them, which costs seconds per test for the imports alone). The comparison fails where a test
passes on Gloo and does not on dtrain, unless KNOWN_BY_MAJOR names it with the reason (mirrored
in docs/pytorch.md), and where a test it names passes on dtrain now (the list must shrink with
the code).
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

# Tests that pass on Gloo and not on dtrain, each with the reason, by torch's major version (the
# suite and torch's Python differ). docs/pytorch.md lists them.
MONITORED = ("monitored_barrier: torch 1.13's Python runs it for Gloo only ('monitored_barrier is only implemented "
             "for GLOO backend.'); dtrain's monitoredBarrier is reached through the group's own method "
             "(tests/torch/monitored_barrier.py) and, from torch 2, through dist.monitored_barrier")
KNOWN_BY_MAJOR = {
    1: {
        "test_monitored_barrier_failure_order": MONITORED,
        "test_monitored_barrier_gloo": MONITORED,
        "test_monitored_barrier_gloo_subgroup": MONITORED,
        "test_monitored_barrier_wait_all_ranks": MONITORED,
    },
    2: {
        "test_ddp_logging_data_cpu": ("DDP's logger names every backend torch does not know 'custom' (its "
                                      "ProcessGroup's type), and the test wants the group's name, 'dtrain'"),
    },
}


def known():
    import torch
    return KNOWN_BY_MAJOR[int(torch.__version__.split(".")[0])]


# The suite's gates on Gloo's name, widened to admit dtrain: (text, replacement, how many).
GATES = [
    ("    if BACKEND not in backends:\n",
     "    if BACKEND not in backends and not (BACKEND == \"dtrain\" and \"gloo\" in backends):\n", 1),
    ('BACKEND != "gloo"', 'BACKEND not in ("gloo", "dtrain")', None),
    ('BACKEND == "mpi" or BACKEND == "gloo"', 'BACKEND in ("mpi", "gloo", "dtrain")', 1),
]


def load_suite_admitting_dtrain():
    """distributed_test, from its source with GATES applied, as the module the suite's own imports find."""
    import types
    import torch.testing._internal.distributed as package
    name = "torch.testing._internal.distributed.distributed_test"
    path = os.path.join(os.path.dirname(package.__file__), "distributed_test.py")
    with open(path) as f:
        source = f.read()
    for old, new, count in GATES:
        found = source.count(old)
        if found == 0 or (count is not None and found != count):
            sys.exit(f"torch_suite: {path} has {found} of {old!r} (expected {count or 'some'}): update GATES")
        source = source.replace(old, new)
    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module
    exec(compile(source, path, "exec"), module.__dict__)
    # The suite checks the profiler's events (count, names, input shapes) only for the backends it
    # lists: dtrain's are checked as Gloo's are.
    for listed in ("PROFILING_SUPPORTED_BACKENDS", "SEND_RECV_PROFILING_SUPPORTED_BACKENDS"):
        getattr(module, listed).append("dtrain")


def run_backend(args):
    """This process runs the suite on args.backend and writes {test: outcome} to args.out."""
    os.environ["BACKEND"] = args.backend
    os.environ.pop("SANDCASTLE", None)  # there the suite's skips would read as passes
    os.environ["WORLD_SIZE"] = str(args.world_size)
    os.environ.setdefault("TEMP_DIR", tempfile.mkdtemp(prefix="dtrain_torch_suite_"))
    if args.backend == "dtrain":
        sys.path.insert(0, args.module_dir)
        import dtrain_torch  # noqa: F401  (registers the backend)
    import torch.multiprocessing
    from torch.testing._internal.common_distributed import DistTestCases
    if args.backend == "dtrain":  # before the suite's decorators read the sets
        for feature in ("plugin", "ddp", "subgroup"):
            DistTestCases.backend_feature[feature].add("dtrain")
        load_suite_admitting_dtrain()
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

    class TestDistBackendWithFork(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            self._start_processes(torch.multiprocessing.get_context("fork").Process)

    loader = unittest.TestLoader()
    if args.k:
        loader.testNamePatterns = [f"*{p}*" for p in args.k]
    suite = loader.loadTestsFromTestCase(TestDistBackendWithFork)
    outcomes = {}

    class Record(unittest.TextTestResult):
        def addSuccess(self, test):
            super().addSuccess(test)
            outcomes[test._testMethodName] = "pass"

        def addFailure(self, test, err):
            super().addFailure(test, err)
            outcomes[test._testMethodName] = "fail"

        def addError(self, test, err):
            super().addError(test, err)
            outcomes[test._testMethodName] = "fail"

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            outcomes[test._testMethodName] = "skip: " + reason

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            outcomes[test._testMethodName] = "pass"

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            outcomes[test._testMethodName] = "fail"

    unittest.TextTestRunner(stream=sys.stdout, verbosity=2, resultclass=Record).run(suite)
    with open(args.out, "w") as f:
        json.dump(outcomes, f, indent=1, sort_keys=True)
    return 0


def compare(args):
    # Both backends at once: each spends most of its time waiting (a test's ranks start, meet and
    # time out), about a third of a core each on 2 cores. Each run leads a process group of its
    # own, so that a failure takes down its forked ranks with it.
    results, took, runs = {}, {}, {}
    deadline = time.monotonic() + args.timeout
    with tempfile.TemporaryDirectory() as work:
        try:
            for backend in ("gloo", "dtrain"):
                out = os.path.join(work, backend + ".json")
                cmd = [sys.executable, os.path.abspath(__file__), "--backend", backend, "--out", out,
                       "--world-size", str(args.world_size), "--module-dir", args.module_dir]
                cmd += sum((["-k", p] for p in args.k), [])
                log = open(os.path.join(work, backend + ".log"), "w+")
                # torch's suite leaves a store file per test in the temporary directory: this one's.
                tmp = os.path.join(work, backend + ".tmp")
                os.mkdir(tmp)
                run = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                       env=dict(os.environ, TMPDIR=tmp))
                runs[backend] = (run, log, out, time.monotonic())
            while len(took) < len(runs) and time.monotonic() < deadline:
                for backend, (run, _, _, start) in runs.items():
                    if backend not in took and run.poll() is not None:
                        took[backend] = time.monotonic() - start
                if any(run.returncode for run, _, _, _ in runs.values()):
                    break  # reported below, with its log
                time.sleep(0.5)
            for backend, (run, log, out, _) in runs.items():
                text = open(out).read() if backend in took and os.path.exists(out) else ""
                if text and run.returncode == 0:
                    results[backend] = json.loads(text)
            # A run that failed is told first; one still running then was stopped, or timed out.
            for backend in sorted(set(runs) - set(results), key=lambda b: b not in took):
                run, log, _, _ = runs[backend]
                log.seek(0)
                tail = log.read()[-20000:]
                sys.stdout.write(tail if tail.endswith("\n") or not tail else tail + "\n")
                if backend in took:
                    print(f"the {backend} run exited {run.returncode} without its results")
                elif time.monotonic() >= deadline:
                    print(f"the {backend} run ran past {args.timeout} s")
                else:
                    print(f"the {backend} run was stopped, since the other failed")
            if len(results) < len(runs):
                return 1
        finally:
            for run, log, _, _ in runs.values():  # the run, and any rank it left behind
                try:
                    os.killpg(run.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                run.wait()
                log.close()
    gloo, ours = results["gloo"], results["dtrain"]
    known_fails = known()
    passed_gloo = sorted(t for t, o in gloo.items() if o == "pass")
    short = [t for t in passed_gloo if ours.get(t) != "pass" and t not in known_fails]
    stale = [t for t in known_fails if ours.get(t) == "pass"]
    for t in sorted(gloo):
        why = f" (known: {known_fails[t]})" if t in known_fails else ""
        print(f"{t}: gloo {gloo[t]}; dtrain {ours.get(t, 'not run')}{why}")
    summary = {b: {k: sum(o.split(":")[0] == k for o in r.values()) for k in ("pass", "fail", "skip")}
               for b, r in results.items()}
    print(f"world size {args.world_size}; gloo {summary['gloo']} in {took['gloo']:.0f} s; "
          f"dtrain {summary['dtrain']} in {took['dtrain']:.0f} s")
    print(f"{len(passed_gloo)} pass on Gloo; of those {len(short)} do not pass on dtrain and are not known: {short}")
    if stale:
        print(f"known to fail on dtrain, but passed: {stale} (take them off KNOWN_BY_MAJOR and docs/pytorch.md)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "seconds": took}, f, indent=1, sort_keys=True)
    if len(passed_gloo) < args.min_gloo_passes:
        print(f"only {len(passed_gloo)} tests pass on Gloo, fewer than {args.min_gloo_passes}: the comparison shrank")
    return 0 if len(passed_gloo) >= args.min_gloo_passes and not short and not stale else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--module-dir", required=True, help="where dtrain_torch's module was built")
    p.add_argument("--world-size", type=int, default=3)
    p.add_argument("-k", action="append", default=[], help="only tests whose name contains this (repeatable)")
    p.add_argument("--json", default="", help="write both backends' outcomes here")
    p.add_argument("--timeout", type=float, default=1000, help="seconds both runs may take together")
    p.add_argument("--min-gloo-passes", type=int, default=1,
                   help="fail if Gloo passes fewer tests (the comparison would shrink unnoticed)")
    p.add_argument("--backend", choices=["gloo", "dtrain"], help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    return run_backend(args) if args.backend else compare(args)


if __name__ == "__main__":
    sys.exit(main())
